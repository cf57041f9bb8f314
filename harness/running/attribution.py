"""Whose fault a check's exception is. The rule, in one place (docs/ARCHITECTURE.md states it too):

- raised inside the kernel's own call (any frame of a kernel's method (``impls.contract.KernelContract``, any family): its validation, its
  launch, the library it calls), the exception is the **kernel's** failure;
- a **verdict** (``AssertionError`` or ``pytest.fail``: a check judged the kernel's outputs or
  behaviour) is the kernel's failure;
- anything else, in any phase or hook (set-up, the ``pytest_pyfunc_call`` wrappers, memory
  admission, drawing inputs, the oracle, comparison, records, teardown), is a **harness error**:
  its own outcome, never counted against a kernel, and the run exits non-zero.

A chained exception (``raise ... from``, or one raised while handling another) is the kernel's
when any link was raised inside the kernel's call. After a harness error the process recovers:
the check's case and the memory watch are set up afresh for the next check (``recover``).
"""
from __future__ import annotations

import os
import sys
import traceback

import pytest

from harness.report.outcomes import HARNESS_ERROR

PROPERTY = "normdiff_harness_error"  # the report's user property that carries one


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _in_kernel(frame) -> bool:
    contract = sys.modules.get("impls.contract")  # not imported here: the report reads outcomes without torch
    if contract is None:
        return False
    kernel = contract.KernelContract
    owner = frame.f_locals.get("self", frame.f_locals.get("cls"))
    return isinstance(owner, kernel) or (isinstance(owner, type) and issubclass(owner, kernel))


def raised_in_kernel(exc: BaseException) -> bool:
    """Whether ``exc``, or an exception it chains, passed through a frame of a kernel's call."""
    for link in _chain(exc):
        tb = link.__traceback__
        while tb is not None:
            if _in_kernel(tb.tb_frame):
                return True
            tb = tb.tb_next
    return False


def is_verdict(exc: BaseException) -> bool:
    return isinstance(exc, (AssertionError, pytest.fail.Exception))


def _short(path: str) -> str:
    """A path inside the project relative to its root."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return os.path.relpath(path, root) if path.startswith(root + os.sep) else path


def harness_error(exc: BaseException, phase: str) -> dict | None:
    """The harness error ``exc`` is (phase, error, where), or None when it is the kernel's."""
    if isinstance(exc, (pytest.skip.Exception, pytest.xfail.Exception, KeyboardInterrupt)):
        return None
    if raised_in_kernel(exc) or is_verdict(exc):
        return None
    frames = traceback.extract_tb(exc.__traceback__)
    where = f"{_short(frames[-1].filename)}:{frames[-1].lineno} in {frames[-1].name}" if frames else "?"
    text = str(exc).strip().splitlines()
    return {"phase": phase, "error": f"{type(exc).__name__}: {text[0] if text else ''}"[:400], "where": where}


class Attribution:
    """In each process that runs checks: marks a harness error on its report (even where the
    check was expected to fail: a known issue is the kernel's, a harness error never is) and
    recovers before the next check."""

    def __init__(self, state, recover):
        self.state, self.recover = state, recover

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        report = outcome.get_result()
        if call.excinfo is None or item.nodeid not in self.state.records:
            return
        found = harness_error(call.excinfo.value, call.when)
        if found is None:
            return
        report.outcome = "failed"
        if hasattr(report, "wasxfail"):
            del report.wasxfail
        report.longrepr = (f"{HARNESS_ERROR} in {call.when}, not the kernel's: {found['error']} "
                           f"(at {found['where']})")
        report.user_properties.append((PROPERTY, found))
        self.recover()
