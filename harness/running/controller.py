"""The xdist controller's side of isolation (harness.running.isolation): a directory shared with the
workers, and when a worker dies, its check recorded from the worker's note and fault files
(*crashed*, *hung*, *compile timeout*, or *out of memory*) and its kernel's crashes counted;
after ``--crash-limit`` of them the kernel's remaining checks are *not run*."""
from __future__ import annotations

import json
import os
import re
import tempfile
from collections import Counter
from pathlib import Path

import pytest

from harness.running import clock, memory

NOT_RUN = "not run: "  # prefix of a check's skip reason when it never ran (its kernel kept crashing)


def classify(note: dict, fault: str, worker: str) -> dict:
    """The failure kind and its first line, from a dead worker's note and fault output."""
    where = f"{note.get('kernel', '?')} on {note.get('case', '?')}" if note.get("kernel") else "outside a kernel call"
    if note.get("fatal"):
        kind, detail = ("out of memory" if memory.is_oom_text(note["fatal"]) else "crashed"), note["fatal"]
    elif "Timeout (" in fault:
        phase = note.get("phase", "test")
        kind = "hung" if phase != "compile" else "compile timeout"
        limit = note.get("limit_s")
        detail = (f"no return within {limit:g} s ({'first call, compiling' if phase == 'compile' else 'kernel call'})"
                  if limit else "the test did not finish within its time limit")
    elif (m := re.search(r"Fatal Python error: ([^\n]+)", fault)):
        kind, detail = "crashed", m.group(1).strip()
    else:
        kind, detail = "crashed", ("the worker ended without a message (a signal it cannot catch, such as "
                                   "SIGKILL from the out-of-memory killer)")
    return {"kind": kind, "detail": detail, "where": where, "worker": worker,
            "kernel": note.get("kernel"), "case": note.get("case"), "phase": note.get("phase")}


class Controller:
    """The xdist controller's side: a directory shared with the workers, crash accounting."""

    def __init__(self, config, state):
        self.config, self.state = config, state
        self.dir = Path(tempfile.mkdtemp(prefix="normdiff-workers-"))
        self.limit = config.getoption("crash_limit")
        self.crashes: Counter = Counter()
        self.oom_retried: set[str] = set()  # checks requeued after a sticky out-of-memory (memory_watch)

    def pytest_configure_node(self, node):
        node.workerinput["normdiff_dir"] = str(self.dir)
        clock.mark(self.config, node.gateway.id, "started")  # the report's phases: the worker's set-up

    def read(self, worker: str, suffix: str) -> str:
        try:
            return (self.dir / f"{worker}.{suffix}").read_text()
        except OSError:
            return ""

    def note(self, worker: str) -> dict:
        """What a worker last said it was doing (CallWatch.note), {} when unreadable."""
        try:
            return json.loads(self.read(worker, "note") or "{}")
        except json.JSONDecodeError:
            return {}

    def pytest_xdist_node_collection_finished(self, node, ids):
        clock.mark(self.config, node.gateway.id, "collected")
        path = self.dir / f"{node.gateway.id}.collection.json"
        if not self.state.collected and path.is_file():
            self.state.adopt_collection(json.loads(path.read_text()))

    @pytest.hookimpl(tryfirst=True)
    def pytest_handlecrashitem(self, crashitem, report, sched):
        worker = report.node.gateway.id

        note = self.note(worker)
        if note.get("nodeid") not in (None, crashitem):
            note = {}
        crash = classify(note, self.read(worker, "fault"), worker)
        kernel = crash["kernel"] or (self.state.records.get(crashitem) or {}).get("kernel")
        report.longrepr = f"{crash['kind']}: {crash['detail']} ({crash['where']}, worker {worker})"
        self.state.crashes[crashitem] = crash
        if crash["kind"] == "out of memory":  # a resource event, not the kernel's: never a failure
            self.state.records.setdefault(crashitem, {}).setdefault("oom_events", []).append(
                memory.sticky_oom_event("alone (sticky)", crash["detail"], worker))
            report.outcome = "skipped"
            report.longrepr = (crashitem.split("::")[0], 0, f"Skipped: {memory.OOM}{crash['detail']} "
                               f"({crash['where']}, worker {worker}); retried alone and out of memory again")
            return
        if kernel:
            self.crashes[kernel] += 1
            if self.crashes[kernel] >= self.limit:
                banned = {k: f"{NOT_RUN}{k} crashed {n} times (--crash-limit {self.limit})"
                          for k, n in self.crashes.items() if n >= self.limit}
                tmp = self.dir / "banned.json.tmp"
                tmp.write_text(json.dumps(banned))
                os.replace(tmp, self.dir / "banned.json")
