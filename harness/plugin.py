"""The pytest plugin: backend selection, case parametrisation, result collection, the report.

Loaded by harness/conftest.py, so it is active for ``pytest harness``. The harness never
branches on backend names: it asks the registry for kernels and each kernel for what it can run.
"""
from __future__ import annotations

import functools
import json
import os
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from harness import compare, isolation, memory, memory_watch, properties, scheduling
from harness.run import (STATE, backend_status, environment, invocation, is_benchmark_run, point_latest, report_dir,
                         split_names, write_partial)
from harness.cases import DTYPES, Case, backward_catalogue, catalogue
from harness.progress import Progress
from harness.report import add_agreement_cell
from harness.runner import CheckResult, OracleCache, device_for
from impls import registry
from impls.base import OPS, NormKernel


def pytest_addoption(parser):
    group = parser.getgroup("normdiff")
    group.addoption("--backend", default="all", help=backend_help())
    group.addoption(
        "--backend-file", action="append", default=[], metavar="PATH",
        help="a Python file that registers kernels of an outside backend (repeatable)",
    )
    group.addoption("--op", default="all", help="all, rms_norm or layer_norm (comma-separated)")
    group.addoption("--dtype", default=None,
                    help="all, or float32,float16,bfloat16 (comma-separated); default: all (the benchmarks' "
                         "headline set: bfloat16)")
    group.addoption(
        "--profile", default=None, choices=("quick", "full"),
        help="case catalogue size; default: full with a GPU, quick without",
    )
    group.addoption(
        "--fuzz-seed", type=int, default=0,
        help="seed of the hypothesis-drawn cases (fixed, so a run repeats; change it to explore)",
    )
    group.addoption("--report-dir", default=None,
                    help="where the report goes (default: a folder of its own under reports/runs/, "
                         "with reports/latest pointing to it)")
    group.addoption("--no-report", action="store_true", help="do not write the correctness report")
    group.addoption("--progress-every", type=float, default=20.0, metavar="S",
                    help="seconds between progress lines (checks done per backend, time left)")
    isolation.addoption(group)
    memory_watch.addoption(group)


def backend_help() -> str:
    try:
        registry.load_builtins()
        names = ", ".join(registry.backends())
    except Exception as exc:  # help must show even where a backend module cannot import
        names = f"(not listed: {type(exc).__name__})"
    plugins = ", ".join(f"{n} (--backend-file {p})" for n, p in registry.KNOWN_PLUGINS.items())
    return (f"all (the default), or a comma-separated list of backend names or glob patterns ('my_*'). "
            f"Built in: {names}; plug-ins: {plugins}, or any file that registers kernels")


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    isolation.plan_workers(config)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if getattr(config, "_normdiff_schedule", False):
        return scheduling.CaseScheduling(config, log, config.stash[STATE])
    return None


def quick_cpu_kept(case: Case, every: int) -> bool:
    """Whether a kernel that checks one case in ``every`` on the CPU's quick profile checks this
    one: by a hash of the case id, not its seed, whose residues already pick the quick profile's
    determinism sample (shapes.DETERMINISM_EVERY_QUICK)."""
    return zlib.crc32(f"quick-cpu:{case.id}".encode()) % every == 0


@dataclass
class HarnessState:
    kernels: list[NormKernel]
    cases: list[Case]
    profile: str
    selection: dict
    backward_cases: list[Case] = field(default_factory=list)  # harness/test_backward.py's
    batch_cases: list[Case] = field(default_factory=list)  # harness/test_properties.py's
    backward_batch_cases: list[Case] = field(default_factory=list)  # harness/test_backward.py's batch invariance
    records: dict[str, dict] = field(default_factory=dict)  # nodeid -> record
    oracle: OracleCache = field(default_factory=OracleCache)
    # Agreement: (op, dtype, kernel_a, kernel_b) -> [max difference in allowed errors, cases, worst case]
    agreement: dict[tuple[str, str, str, str], list] = field(default_factory=dict)
    # Kernels compiled without being run (compile-only checks), for the report's compiled section.
    compiled: list[dict] = field(default_factory=list)
    config: pytest.Config | None = None
    # nodeid -> {kind, detail, ...} for checks whose worker died (the controller's record)
    crashes: dict[str, dict] = field(default_factory=dict)
    collected: bool = False  # records hold the whole collection (this process's, or a worker's)
    watch: isolation.CallWatch | None = None
    controller: isolation.Controller | None = None
    session: pytest.Session | None = None
    _last_case: str | None = None
    _last_outputs: dict = field(default_factory=dict)
    _last_scales: compare.AgreementScales | None = None
    started: float = field(default_factory=time.time)
    _last_write: float = field(default_factory=time.time)

    @functools.cached_property
    def case_index(self) -> dict[str, Case]:
        """Every case a check of this run draws inputs from, by id (built once: the scheduler reads
        it per check): it weighs checks by their case's size and keeps the largest in few lanes per
        GPU (their GPU memory). The batch-invariance cases are among the largest (4096 x 65536 on
        the full profile)."""
        return {c.id: c for c in self.cases + self.backward_cases + self.batch_cases + self.backward_batch_cases}

    @property
    def kernel_index(self) -> dict[tuple[str, str], NormKernel]:
        return {(k.name, k.op): k for k in self.kernels}

    @staticmethod
    def device_for(kernel: NormKernel) -> str:
        return device_for(kernel)

    def left_out(self, kernel: NormKernel, case: Case) -> str | None:
        """Why the quick profile on the CPU leaves this (case, kernel) pair out
        (``NormKernel.quick_cpu_every``), or None: cases sampled by quick_cpu_kept, known issues
        always kept. Applied at collection to every check of the pair."""
        every = kernel.quick_cpu_every
        device = device_for(kernel)
        if (self.profile != "quick" or every <= 1 or device != "cpu" or quick_cpu_kept(case, every)
                or kernel.known_issue(case.id, device)):
            return None
        return (f"quick profile on the CPU: {kernel.name} checks one case in {every} here (every new shape "
                f"compiles for seconds); the full profile checks every case")

    def adopt_collection(self, records: dict[str, dict]) -> None:
        """The controller takes a worker's collected records (workers collect, it does not)."""
        self.records = {nid: {**rec, **self.records.get(nid, {})} for nid, rec in records.items()}
        self.collected = True

    def write_report(self, final: bool) -> None:
        """Write the report; during the run every PARTIAL_REPORT_S too, marked as partial, so a
        run that is killed still leaves the last good report."""
        config = self.config
        if not self.records or config.getoption("no_report") or isolation.worker_id(config):
            return
        # A benchmark run skips every check: its report would say nothing and replace a real one.
        if is_benchmark_run(config) or not any("outcome" in r for r in self.records.values()):
            return
        from harness.report import build_document, write_report

        ran = sum(1 for r in self.records.values() if "outcome" in r)
        doc = build_document(
            records=self.records,
            agreement=self.agreement,
            compiled=self.compiled,
            backends=backend_status(self.kernels),
            selection=self.selection,
            environment=environment(self.kernels),
            command=invocation(config),
            elapsed=time.time() - self.started,
        )
        doc["progress"] = {"final": final, "ran": ran, "collected": len(self.records)}
        directory = report_dir(config, "checks")
        config._normdiff_report = write_report(doc, directory)  # noqa: SLF001 (terminal summary)
        point_latest(config, directory)
        self._last_write = time.time()

    def record_agreement(self, result: CheckResult) -> list[tuple]:
        """Compare this check's outputs (y, and the statistics both wrote) with every kernel that
        ran the same case before it in this process; returns the comparisons, (op, dtype, a, b,
        difference, case id and the output furthest apart), which reach the controller with the
        check's report (add_agreement)."""
        case = result.case
        if case.id != self._last_case:
            self._last_case, self._last_outputs, self._last_scales = case.id, {}, None
        if result.outputs is None:
            return []
        if self._last_scales is None:
            inputs, ref = self.oracle.get(case, result.outputs.y.device.type)
            self._last_scales = compare.AgreementScales(case.op, ref, case.torch_dtype, inputs.weight)
        mine = (result.outputs, result.y_extra, result.stat_dtype)
        found = []
        for other, (d, output) in compare.agreements(self._last_scales, mine, self._last_outputs).items():
            a, b = sorted((result.kernel, other))
            found.append((case.op, case.dtype, a, b, float(d), case.id if output == "y" else f"{case.id} ({output})"))
        self._last_outputs[result.kernel] = mine
        return found

    def forget_case(self) -> None:
        """Drop the last case's inputs, oracle and kept outputs (its checks are over here)."""
        self.oracle.forget()
        self._last_case, self._last_outputs, self._last_scales = None, {}, None

    def add_agreement(self, op, dtype, a, b, d, case_id) -> None:
        add_agreement_cell(self.agreement.setdefault((op, dtype, a, b), [0.0, 0, ""]), d, 1, case_id)

    # Registered as a plugin object, so pytest calls these hooks too.
    def pytest_collection_modifyitems(self, items):
        self.deselect_unselected(items)
        for item in items:
            params = getattr(item, "callspec", None)
            case = kernel = None
            for value in (params.params.values() if params else ()):
                for v in value if isinstance(value, tuple) else (value,):
                    if isinstance(v, NormKernel):
                        kernel = v
                    elif isinstance(v, Case):
                        case = v
            if kernel is None:
                continue
            rec = {"test": item.originalname, "kernel": kernel.name, "backend": kernel.backend, "op": kernel.op}
            if case is not None:
                rec.update(case=case.id, dtype=case.dtype, tags=list(case.tags))
                left_out = self.left_out(kernel, case)
                if left_out:  # every check of a (case, kernel) pair, in one place
                    item.add_marker(pytest.mark.skip(reason=left_out))
            self.records[item.nodeid] = rec
        memory_watch.deselect_below(self, items)
        shard = scheduling.parse_shard(self.config.getoption("shard"))
        if shard:
            k, n = shard
            groups = {i.nodeid: f"benchmark group {m.kwargs['group']}" for i in items
                      for m in i.iter_markers("benchmark") if m.kwargs.get("group")}
            where = scheduling.shard_of([i.nodeid for i in items], self.records, self.case_index,
                                       self.kernel_index, device_for, n, groups)
            drop = [i for i in items if where[i.nodeid] != k - 1]
            if drop:
                self.config.hook.pytest_deselected(items=drop)
                items[:] = [i for i in items if where[i.nodeid] == k - 1]
        self.collected = True

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_finish(self, session):
        # A worker leaves its records for the controller, before xdist reports the collection.
        worker = isolation.worker_id(self.config)
        if worker:
            path = Path(self.config.workerinput["normdiff_dir"]) / f"{worker}.collection.json"
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.records, default=str))
            os.replace(tmp, path)

    def pytest_sessionstart(self, session):
        self.session = session

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_makereport(self, item, call):
        # How many of this check's kernel calls compiled first (harness.progress counts them).
        if call.when == "call" and self.watch is not None and self.watch.item_compiles:
            item.user_properties.append(("normdiff", {"compiled": self.watch.item_compiles}))
    def pytest_runtest_logstart(self, nodeid, location):
        if self.watch is not None:
            self.watch.start_item(nodeid)

    def pytest_runtest_logfinish(self, nodeid, location):
        if self.watch is not None:
            rec = self.records.get(nodeid, {})
            self.watch.end_item(rec.get("kernel"), rec.get("case"), self.session)
            fatal = self.watch.fatal
            if fatal is not None and fatal.get("phase") == "test" and nodeid not in self.crashes:
                # one process: the test's report went out before the error was found; charge it now
                self.crashes[nodeid] = fatal
                self.records.setdefault(nodeid, {}).update(outcome="failed", failure_kind="crashed", crash=fatal)

    def pytest_runtest_setup(self, item):
        rec = self.records.get(item.nodeid)
        if rec and self.watch is not None:
            why = self.watch.banned(rec["kernel"])
            if why:
                pytest.skip(why)

    def deselect_unselected(self, items) -> None:
        """What this run does not select is deselected, not skipped: a parametrisation left empty
        by the selection (e.g. no kernel of a backend-specific check), the benchmarks in a run of
        checks (--benchmark-skip) and the checks in a run of benchmarks (--benchmark-only)."""
        bench_only = is_benchmark_run(self.config)
        bench_skip = self.config.getoption("benchmark_skip", False) and not bench_only

        def unselected(item) -> bool:
            skip = item.get_closest_marker("skip")
            if skip and str(skip.kwargs.get("reason", "")).startswith("got empty parameter set"):
                return True
            is_bench = "benchmark" in getattr(item, "fixturenames", ())
            return (bench_only and not is_bench) or (bench_skip and is_bench)

        drop = [i for i in items if unselected(i)]
        if drop:
            self.config.hook.pytest_deselected(items=drop)
            items[:] = [i for i in items if not unselected(i)]

    def pytest_deselected(self, items):  # -k, -m: not part of this run
        for item in items:
            self.records.pop(item.nodeid, None)

    # Registered as a plugin object, so pytest calls it with every test's phases.
    def pytest_runtest_logreport(self, report):
        if report.when == "call":
            # What the check sent with its report: fields of its record, agreement, compile numbers.
            for name, value in report.user_properties:
                if name == "normdiff_agreement":
                    for cell in value:
                        self.add_agreement(*cell)
                elif name == "normdiff_compiled":
                    self.compiled.append(value)
        if report.when == "teardown":  # what the check left allocated (harness.memory_watch)
            for name, value in report.user_properties:
                if name == "normdiff_after" and report.nodeid in self.records:
                    self.records[report.nodeid].update(value)
        if report.when != "call" and report.passed:
            return
        rec = self.records.get(report.nodeid)
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
        crash = self.crashes.get(report.nodeid)
        if crash is None and self.watch is not None and self.watch.fatal and report.when == "call":
            crash = self.crashes[report.nodeid] = self.watch.fatal
            self.session.shouldstop = f"{crash['detail']}: the CUDA context is unusable"
        if crash is not None and crash["kind"] == "out of memory":
            rec.update(outcome="out of memory", crash=crash, reason=crash["detail"])
        elif crash is not None:
            rec.update(outcome="failed", failure_kind=crash["kind"], crash=crash,
                       message=str(report.longrepr))
        elif report.skipped and hasattr(report, "wasxfail"):  # a declared known issue, failing as declared
            rec.update(outcome="known issue", reason=report.wasxfail)
        elif report.skipped:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            reason = reason.removeprefix("Skipped: ")
            outcome = ("not run" if reason.startswith(isolation.NOT_RUN) else
                       "out of memory" if reason.startswith(memory.OOM) else "skipped")
            rec.update(outcome=outcome, reason=reason)
        elif rec.get("outcome") != "failed":
            rec["outcome"] = report.outcome
            if report.failed and "message" not in rec:
                rec["message"] = (report.longreprtext or "")[-3000:]
        rec["duration"] = rec.get("duration", 0.0) + report.duration
        write_partial(self)




def pytest_configure(config):
    try:
        registry.load_all(config.getoption("backend_file"))
    except FileNotFoundError as exc:
        raise pytest.UsageError(str(exc)) from exc
    named = split_names(config.getoption("backend"), None, "backend")
    backends = split_names(",".join(registry.expand(list(named))), tuple(registry.backends()), "backend") \
        if named else None
    ops = split_names(config.getoption("op"), OPS, "op")
    dtypes = split_names(config.getoption("dtype") or "all", tuple(DTYPES), "dtype")
    profile = config.getoption("profile") or ("full" if torch.cuda.is_available() else "quick")
    kernels = [k for k in registry.kernels(list(backends) if backends else None) if ops is None or k.op in ops]
    wanted = lambda c: (ops is None or c.op in ops) and (dtypes is None or c.dtype in dtypes)  # noqa: E731
    cases, backward_cases = [c for c in catalogue(profile) if wanted(c)], [c for c in backward_catalogue(profile) if wanted(c)]
    selection = {
        "backend": config.getoption("backend"),
        "backend_file": config.getoption("backend_file"),
        "op": config.getoption("op"),
        "dtype": config.getoption("dtype") or "all",
        "profile": profile,
        "fuzz_seed": config.getoption("fuzz_seed"),
        "gpu_memory": config.getoption("gpu_memory"),
    }
    state = HarnessState(kernels=kernels, cases=cases, profile=profile, selection=selection, config=config,
                         backward_cases=backward_cases, batch_cases=properties.batch_cases(profile),
                         backward_batch_cases=properties.backward_batch_cases(profile))
    config.stash[STATE] = state
    config.pluginmanager.register(state, "normdiff-state")
    if not isolation.worker_id(config) and not is_benchmark_run(config):
        config.pluginmanager.register(Progress(config, state), "normdiff-progress")
    if getattr(config, "_normdiff_schedule", False) and not isolation.worker_id(config):
        state.controller = isolation.Controller(config, state)
        config.pluginmanager.register(state.controller, "normdiff-controller")
        config.pluginmanager.register(memory_watch.Ledgers(config, state.controller.dir), "normdiff-ledgers")
    elif not is_benchmark_run(config):
        state.watch = isolation.CallWatch(config)
        memory_watch.register_cache("the checks' oracle and kept outputs",
                                    lambda: (state.oracle, state._last_outputs, state._last_scales),  # noqa: SLF001
                                    state.forget_case)
        config.pluginmanager.register(memory_watch.MemoryWatch(config, state), "normdiff-memory")
    _start_profile(config)


# A diagnostic: NORMDIFF_PROFILE=DIR runs cProfile in the xdist workers named by
# NORMDIFF_PROFILE_WORKERS (default gw0; one worker's profile leaves the others' timing alone)
# and writes DIR/<worker>.prof at its end, for pstats or snakeviz.
def _start_profile(config) -> None:
    where, worker = os.environ.get("NORMDIFF_PROFILE"), isolation.worker_id(config)
    if where and worker in os.environ.get("NORMDIFF_PROFILE_WORKERS", "gw0").split(","):
        import cProfile

        config._normdiff_profile = (cProfile.Profile(), Path(where) / f"{worker}.prof")
        config._normdiff_profile[0].enable()


def pytest_unconfigure(config):
    profile = getattr(config, "_normdiff_profile", None)
    if profile is not None:
        profile[0].disable()
        profile[1].parent.mkdir(parents=True, exist_ok=True)
        profile[0].dump_stats(profile[1])


def pytest_report_header(config):
    state = config.stash.get(STATE, None)
    if state is None:
        return None
    lines = [f"normdiff: profile {state.profile}, {len(state.cases)} cases, {len(state.backward_cases)} backward, backends:"]
    for name, (note, why) in backend_status(state.kernels).items():
        lines.append(f"  {name}: {why and 'unavailable: ' + why or note}")
    for source, err in registry.load_errors().items():
        lines.append(f"  {source} failed to load: {err}")
    return lines



def pytest_generate_tests(metafunc):
    state = metafunc.config.stash.get(STATE, None)
    if state is None:
        return
    if "case_kernel" in metafunc.fixturenames:
        params, ids = [], []
        for case in state.cases:
            for kernel in state.kernels:
                if kernel.op == case.op:
                    params.append((case, kernel))
                    ids.append(f"{case.id}-{kernel.name}")
        metafunc.parametrize("case_kernel", params, ids=ids)
    elif "kernel" in metafunc.fixturenames:
        metafunc.parametrize("kernel", state.kernels, ids=[f"{k.op}-{k.name}" for k in state.kernels])


@pytest.fixture
def harness_state(request) -> HarnessState:
    return request.config.stash[STATE]


def record(node: pytest.Item, **fields) -> None:
    """Fields for this check's record, sent with its report (so from an xdist worker too)."""
    node.user_properties.append(("normdiff", fields))


def expect_known_issue(request, kernel: NormKernel, case: Case) -> None:
    """Mark a check of a declared known issue (NormKernel.known_issue) as expected to fail:
    strictly, so that the day it passes the declaration must go, unless the kernel says the issue
    may pass on some machines (NormKernel.known_issue_may_pass); such a check that passes is
    recorded as passed."""
    device = device_for(kernel)
    issue = kernel.known_issue(case.id, device)
    if issue:
        strict = not kernel.known_issue_may_pass(case.id, device)
        request.applymarker(pytest.mark.xfail(reason=f"known issue: {issue}", strict=strict))


def pytest_sessionfinish(session, exitstatus):
    state = session.config.stash.get(STATE, None)
    if state is not None:
        state.write_report(final=True)


def pytest_terminal_summary(terminalreporter, config):
    paths = getattr(config, "_normdiff_report", None)
    if paths:
        terminalreporter.write_line(f"normdiff correctness report: {paths[0]}")




