"""Stops a run part-way as a time limit or Ctrl-C does: after NORMDIFF_INTERRUPT_AFTER checks
have reported (on the controller, or the one process of -n 0), SIGINT to this process.
Load with ``-p tests.plugins.interrupt``."""
import os
import signal

import pytest

_seen = {"n": 0}


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report):
    after = int(os.environ.get("NORMDIFF_INTERRUPT_AFTER", "0"))
    if not after or report.when != "call" or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    _seen["n"] += 1
    if _seen["n"] == after:
        os.kill(os.getpid(), signal.SIGINT)
