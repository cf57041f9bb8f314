"""Each check's record, the correctness report's row: made at collection (test, kernel, backend,
op, case, dtype, tags), then filled from the check's reports (outcome and reason, the fields the
check sent, the worker and GPU that ran it, a crash charged to it). HarnessState's hooks
(harness.running.state) call these; a worker's records reach the controller in a file (save_collection).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from harness.running import attribution, clock, isolation, memory, memory_watch, resume, scheduling
from harness.judging.cases import Case
from harness.running.controller import NOT_RUN
from harness.running.run import is_benchmark_run, write_partial
from harness.judging.runner import device_for
from impls.contract import KernelContract


def collect_records(state, items) -> None:
    """A record per collected check of a kernel; the quick profile's CPU sampling
    (HarnessState.left_out) as a skip; then --min-check-memory and --shard deselect."""
    deselect_unselected(state.config, items)
    resume.deselect_done(state.config, items)
    for item in items:
        params = getattr(item, "callspec", None)
        case = kernel = None
        for value in (params.params.values() if params else ()):
            for v in value if isinstance(value, tuple) else (value,):
                if isinstance(v, KernelContract):
                    kernel = v
                elif isinstance(v, Case):
                    case = v
        if kernel is None:
            continue
        rec = {"test": item.originalname, "kernel": kernel.name, "backend": kernel.backend, "op": kernel.op,
               "family": kernel.family}
        needs = needs_of(item)
        if needs:  # a check (its memory is estimated and admitted), not a test of the framework's
            rec["needs"] = needs
        if case is not None:
            rec.update(case=case.id, dtype=case.dtype, tags=list(case.tags), **case.record_fields())
            if hasattr(kernel, "declaration"):
                rec["declaration"] = kernel.declaration()
            left_out = state.left_out(kernel, case)
            if left_out:  # every check of a (case, kernel) pair, in one place
                item.add_marker(pytest.mark.skip(reason=left_out))
        state.records[item.nodeid] = rec
    memory_watch.deselect_below(state, items)
    shard = scheduling.parse_shard(state.config.getoption("shard"))
    if shard:
        k, n = shard
        groups = {i.nodeid: f"benchmark group {m.kwargs['group']}" for i in items
                  for m in i.iter_markers("benchmark") if m.kwargs.get("group")}
        where = scheduling.shard_of([i.nodeid for i in items], state.records, state.case_index,
                                   state.kernel_index, device_for, n, groups)
        drop = [i for i in items if where[i.nodeid] != k - 1]
        if drop:
            state.config.hook.pytest_deselected(items=drop)
            items[:] = [i for i in items if where[i.nodeid] == k - 1]
    state.collected = True
    if not isolation.worker_id(state.config):  # a worker's is marked by the controller (Controller)
        clock.mark(state.config, clock.MAIN, "collected")


def needs_of(item) -> str | None:
    """What a check declares it needs (``@pytest.mark.needs("oracle")`` on its function), which the
    memory estimate reads, never the function's name; None for a test that is no check
    (tests/test_check_needs.py holds that every check of harness/ declares one)."""
    mark = item.get_closest_marker("needs")
    return mark.args[0] if mark is not None and mark.args else None


def save_collection(state) -> None:
    """A worker leaves its records for the controller, before xdist reports the collection."""
    worker = isolation.worker_id(state.config)
    if worker:
        path = Path(state.config.workerinput["normdiff_dir"]) / f"{worker}.collection.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state.records, default=str))
        os.replace(tmp, path)


def deselect_unselected(config, items) -> None:
    """What this run does not select is deselected, not skipped: a parametrisation left empty
    by the selection (e.g. no kernel of a backend-specific check), the benchmarks in a run of
    checks (--benchmark-skip) and the checks in a run of benchmarks (--benchmark-only)."""
    bench_only = is_benchmark_run(config)
    bench_skip = config.getoption("benchmark_skip", False) and not bench_only

    def unselected(item) -> bool:
        skip = item.get_closest_marker("skip")
        if skip and str(skip.kwargs.get("reason", "")).startswith("got empty parameter set"):
            return True
        is_bench = "benchmark" in getattr(item, "fixturenames", ())
        return (bench_only and not is_bench) or (bench_skip and is_bench)

    drop = [i for i in items if unselected(i)]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = [i for i in items if not unselected(i)]


def _span(rec: dict | None, report) -> None:
    """The check's span from its set-up's start to its teardown's end (pytest's report times),
    for the report's phases (harness.report.phases)."""
    start, stop = getattr(report, "start", None), getattr(report, "stop", None)
    if rec is None or start is None or stop is None:
        return
    rec["t_start"] = min(rec.get("t_start", start), start)
    rec["t_end"] = max(rec.get("t_end", stop), stop)


def fold_report(state, report) -> None:
    """One phase's report of a check into its record (on the controller: a worker's report)."""
    if report.when == "call":
        # What the check sent with its report: fields of its record, agreement, compile numbers.
        for name, value in report.user_properties:
            if name == "normdiff_agreement":
                for cell in value:
                    state.add_agreement(*cell)
            elif name == "normdiff_compiled":
                state.compiled.append(value)
    if report.when == "teardown":  # what the check left allocated (harness.running.memory_watch)
        for name, value in report.user_properties:
            if name == "normdiff_after" and report.nodeid in state.records:
                state.records[report.nodeid].update(value)
    _span(state.records.get(report.nodeid), report)
    if report.when != "call" and report.passed:
        return
    rec = state.records.get(report.nodeid)
    if rec is None:  # not a parametrised harness check
        return
    if report.when == "call":
        for name, value in report.user_properties:
            if name == "normdiff":
                rec.update(value)
    node = getattr(report, "node", None)  # the xdist worker that ran it, on the controller
    if node is not None and "worker" not in rec:
        rec["worker"] = node.gateway.id
        gpu = (node.gateway.spec.env or {}).get("CUDA_VISIBLE_DEVICES")
        if gpu is not None:
            rec["gpu"] = gpu
    crash = state.crashes.get(report.nodeid)
    if crash is None and state.watch is not None and state.watch.fatal and report.when == "call":
        crash = state.crashes[report.nodeid] = state.watch.fatal
        state.session.shouldstop = f"{crash['detail']}: the CUDA context is unusable"
    if crash is not None and crash["kind"] == "out of memory":
        rec.update(outcome="out of memory", crash=crash, reason=crash["detail"])
    elif crash is not None:
        rec.update(outcome="failed", failure_kind=crash["kind"], crash=crash,
                   message=getattr(report, "normdiff_message", None) or str(report.longrepr))
    elif (error := dict(report.user_properties).get(attribution.PROPERTY)) is not None:
        if rec.get("outcome") != "failed":  # a kernel's failure in the call stands; the error is noted
            rec.update(outcome=attribution.HARNESS_ERROR, message=str(report.longrepr)[-3000:])
        rec.setdefault("harness_errors", []).append(error)
    elif report.skipped and hasattr(report, "wasxfail"):  # a declared known issue, failing as declared
        rec.update(outcome="known issue", reason=report.wasxfail)
    elif report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        outcome = ("not run" if reason.startswith(NOT_RUN) else
                   "out of memory" if reason.startswith(memory.OOM) else "skipped")
        rec.update(outcome=outcome, reason=reason)
    elif rec.get("outcome") != "failed":
        rec["outcome"] = report.outcome
        if report.failed and "message" not in rec:  # the whole text where the terminal had one line
            rec["message"] = (getattr(report, "normdiff_message", None) or report.longreprtext or "")[-3000:]
    rec["duration"] = rec.get("duration", 0.0) + report.duration
    write_partial(state)
