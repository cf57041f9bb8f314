"""When the run's set-up steps happened, for the report's phases (harness.report.phases): the
process's start, each xdist worker's start (the controller sets its node up) and the end of its
collection; in one process (``-n 0``) the end of its own collection. Each check's own times
(start, end, first calls that compiled, waiting for memory) are in its record
(harness.running.records)."""
from __future__ import annotations

import os
import time

import pytest

CLOCK = pytest.StashKey[dict]()
MAIN = "this process"  # the worker name of a run without xdist workers


def process_start() -> float:
    """When this process started (epoch seconds), from /proc; now where /proc cannot say."""
    try:
        ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
        boot = next(float(line.split()[1]) for line in open("/proc/stat") if line.startswith("btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


def clock(config) -> dict:
    """{"started": when the run's process started, "workers": {name: {"started", "collected"}}}."""
    if CLOCK not in config.stash:
        config.stash[CLOCK] = {"started": process_start(), "workers": {}}
    return config.stash[CLOCK]


def mark(config, worker: str, what: str, when: float | None = None) -> None:
    """``worker`` reached ``what`` ("started", "collected") now (or at ``when``); the first mark stays."""
    clock(config)["workers"].setdefault(worker, {}).setdefault(what, time.time() if when is None else when)
