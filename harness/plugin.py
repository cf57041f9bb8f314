"""The pytest plugin: the options, backend selection, case parametrisation, the report at the end.

Loaded by the project's conftest.py, so it is active for ``pytest harness``, and for a run given
``--backend-file`` from any directory by the installed entry point (harness.entry). Each process's
``HarnessState`` (harness.running.state) holds the run and the checks' records (harness.running.records). The
harness never branches on backend names: it asks the registry for kernels and each kernel for
what it can run.
"""
from __future__ import annotations

import os
import shlex
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from harness.judging import fused_properties, known_issues, properties
from harness.running import attribution, isolation, memory_watch, scheduling, workers
from harness.judging.cases import DTYPES, Case
from harness.judging.family import Family, families
from harness.running.controller import Controller
from harness.running.progress import Progress
from harness.running.run import STATE, backend_status, is_benchmark_run, split_names
from harness.judging.runner import device_for
from harness.report.failure import summary_line
from harness.running.state import FamilyRun, HarnessState
from impls import registry
from impls.contract import KernelContract

import harness.families  # noqa: E402,F401  (registers the project's families: plain and fused)


def pytest_addoption(parser):
    group = parser.getgroup("normdiff")
    group.addoption("--backend", default="all", help=backend_help())
    group.addoption(
        "--backend-file", action="append", default=[], metavar="PATH",
        help="a Python file that registers kernels of an outside backend (repeatable)",
    )
    group.addoption("--op", default="all",
                    help="all, or rms_norm, layer_norm, add_rms_norm, add_layer_norm (comma-separated); rms_norm and "
                         "layer_norm include their fused forms (weight offset, fp8 output)")
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
    memory_watch.configure_simulation(config)
    workers.plan_workers(config)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if getattr(config, "_normdiff_schedule", False):
        return scheduling.CaseScheduling(config, log, config.stash[STATE])
    return None


def pytest_configure(config):
    config.addinivalue_line("markers", "needs(kind): what a check needs, which its memory estimate counts "
                                       "(harness.running.estimate.NEEDS)")
    try:
        registry.load_all(config.getoption("backend_file"))
    except FileNotFoundError as exc:
        raise pytest.UsageError(str(exc)) from exc
    named = split_names(config.getoption("backend"), None, "backend")
    backends = split_names(",".join(registry.expand(list(named))), tuple(registry.backends()), "backend") \
        if named else None
    ops = split_names(config.getoption("op"), tuple(dict.fromkeys(op for f in families() for op in f.ops)), "op")
    dtypes = split_names(config.getoption("dtype") or "all", tuple(DTYPES), "dtype")
    profile = config.getoption("profile") or ("full" if torch.cuda.is_available() else "quick")
    selected = list(backends) if backends else None
    wanted = lambda c: (ops is None or c.op in ops) and (dtypes is None or c.dtype in dtypes)  # noqa: E731
    runs = {}
    for fam in families():  # each family's kernels, cases and (case, kernel) pairs
        kernels = [k for k in registry.kernels(selected, family=fam.name) if ops is None or k.op in ops]
        forward = [c for c in fam.catalogue(profile) if wanted(c)]
        backward = [c for c in fam.backward_catalogue(profile) if wanted(c)]
        runs[fam.name] = FamilyRun(fam, kernels, forward, backward, fam.pairs(forward, kernels),
                                   fam.pairs(backward, kernels, backward=True))
    selection = {
        "backend": config.getoption("backend"),
        "backend_file": config.getoption("backend_file"),
        "op": config.getoption("op"),
        "dtype": config.getoption("dtype") or "all",
        "profile": profile,
        "fuzz_seed": config.getoption("fuzz_seed"),
        "gpu_memory": config.getoption("gpu_memory"),
        "simulate_gpu": config.getoption("simulate_gpu"),
    }
    state = HarnessState(runs=runs, profile=profile, selection=selection, config=config,
                         batch_cases=properties.batch_cases(profile),
                         backward_batch_cases=properties.backward_batch_cases(profile),
                         fused_property_pairs=fused_properties.property_pairs(profile, runs["fused"].kernels, wanted))
    config.stash[STATE] = state
    config.pluginmanager.register(state, "normdiff-state")
    if not isolation.worker_id(config) and not is_benchmark_run(config):
        config.pluginmanager.register(Progress(config, state), "normdiff-progress")
    if getattr(config, "_normdiff_schedule", False) and not isolation.worker_id(config):
        state.controller = Controller(config, state)
        config.pluginmanager.register(state.controller, "normdiff-controller")
        config.pluginmanager.register(memory_watch.Ledgers(config, state.controller.dir), "normdiff-ledgers")
    elif not is_benchmark_run(config):
        state.watch = isolation.CallWatch(config)
        memory_watch.register_cache("the checks' oracle and kept outputs",
                                    lambda: ([r.family for r in state.runs.values()], state._last_outputs,  # noqa: SLF001
                                             state._last_scales),  # noqa: SLF001
                                    state.forget_case)
        watch = memory_watch.MemoryWatch(config, state)
        config.pluginmanager.register(watch, "normdiff-memory")

        def recover() -> None:  # after a harness error: the next check starts from a clean worker
            state.forget_case()
            watch.reset()

        config.pluginmanager.register(attribution.Attribution(state, recover), "normdiff-attribution")
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


def _stop_profile(config) -> None:
    profile = getattr(config, "_normdiff_profile", None)
    if profile is not None:
        profile[0].disable()
        profile[1].parent.mkdir(parents=True, exist_ok=True)
        profile[0].dump_stats(profile[1])


def pytest_report_header(config):
    state = config.stash.get(STATE, None)
    if state is None:
        return None
    counts = ", ".join(f"{r.family.name}: {len(r.cases)} cases, {len(r.backward_cases)} backward"
                       for r in state.runs.values() if r.kernels)
    lines = [f"normdiff: profile {state.profile}; {counts}; backends:"]
    for name, (note, why) in backend_status(state.all_kernels).items():
        lines.append(f"  {name}: {why and 'unavailable: ' + why or note}")
    for source, err in registry.load_errors().items():
        lines.append(f"  {source} failed to load: {err}")
    return lines


def pytest_generate_tests(metafunc):
    """Each family's (case, kernel) pairs into the fixtures its checks take (a fixture several
    families share, the generic checks', gets them all), and its kernels into its kernel fixture."""
    state = metafunc.config.stash.get(STATE, None)
    if state is None:
        return
    # The generic checks' fixtures are parametrised (if only with nothing) in every run.
    by_fixture: dict[str, list] = {f: [] for f in (Family.forward_fixture, Family.backward_fixture, Family.kernel_fixture)}
    for run in state.runs.values():
        for fixture, pairs in ((run.family.forward_fixture, run.pairs), (run.family.backward_fixture, run.backward_pairs)):
            if fixture:
                by_fixture.setdefault(fixture, []).extend(pairs)
        by_fixture.setdefault(run.family.kernel_fixture, []).extend(run.kernels)
    by_fixture.update(state.fused_property_pairs)
    for fixture, values in by_fixture.items():
        if fixture in metafunc.fixturenames:
            ids = [f"{v[0].id}-{v[1].name}" if isinstance(v, tuple) else f"{v.op}-{v.name}" for v in values]
            metafunc.parametrize(fixture, values, ids=ids)
            return


@pytest.fixture
def harness_state(request) -> HarnessState:
    return request.config.stash[STATE]


def record(node: pytest.Item, **fields) -> None:
    """Fields for this check's record, sent with its report (so from an xdist worker too)."""
    node.user_properties.append(("normdiff", fields))


def expect_known_issue(request, kernel: KernelContract, case: Case) -> None:
    """Mark a check of a declared known issue (NormKernel.known_issue) as expected to fail:
    strictly, so that the day it passes the declaration must go, unless the kernel says the issue
    may pass on some machines (NormKernel.known_issue_may_pass); such a check that passes is
    recorded as passed."""
    device = device_for(kernel)
    issue = known_issues.known_issue(kernel, case, device)
    if issue:
        strict = not known_issues.known_issue_may_pass(kernel, case, device)
        request.applymarker(pytest.mark.xfail(reason=f"known issue: {issue}", strict=strict))


def pytest_sessionfinish(session, exitstatus):
    state = session.config.stash.get(STATE, None)
    if state is not None:
        state.write_report(final=True)


# -- the terminal: a failing check in one line, the report's path last ----------------------------
def brief_output(config) -> bool:
    """Whether a failing check prints one line (the default) rather than its traceback: -v,
    --tb=STYLE and --full-trace bring tracebacks back."""
    opt = config.option
    if opt.verbose > 0 or opt.fulltrace or opt.tbstyle != "auto":
        return False
    given = [*config.invocation_params.args, *shlex.split(os.environ.get("PYTEST_ADDOPTS", ""))]
    return not any(a == "--tb" or a.startswith("--tb=") for a in given)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A harness check's failure (not a harness error) becomes one line: what failed and by how
    much. The whole text goes with the report (``normdiff_message``) into the record's message."""
    outcome = yield
    report = outcome.get_result()
    state = item.config.stash.get(STATE, None)
    if (report.when != "call" or not report.failed or call.excinfo is None or state is None
            or item.nodeid not in state.records or is_benchmark_run(item.config) or not brief_output(item.config)
            or attribution.harness_error(call.excinfo.value, call.when) is not None):
        return
    fields = {}
    for name, value in item.user_properties:
        if name == "normdiff":
            fields.update(value)
    report.normdiff_message = report.longreprtext
    report.longrepr = summary_line(fields, call.excinfo.exconly())


def _briefed(report) -> bool:
    return getattr(report, "normdiff_message", None) is not None


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter, config):
    """Where every failure is a check's one line, pytest's FAILURES section and FAILED lines give
    way to those lines, after its short summary; otherwise pytest's own output stands (the
    checks' failures in it already one line each)."""
    reporter, failed = terminalreporter, terminalreporter.stats.get("failed", [])
    ours = bool(failed) and all(_briefed(r) for r in failed) and not reporter.stats.get("error")
    saved = config.option.tbstyle, reporter.reportchars
    if ours:
        config.option.tbstyle, reporter.reportchars = "no", reporter.reportchars.replace("f", "")
    try:
        return (yield)
    finally:
        config.option.tbstyle, reporter.reportchars = saved
        if ours:
            reporter.write_sep("=", f"normdiff: {len(failed)} failing check(s)", red=True)
            for r in failed:
                reporter.write_line(f"FAILED {r.nodeid.split('::')[-1]}: {r.longrepr}")
            reporter.write_line("Tracebacks: each failure's message in the report, or here with -v or --tb=long.")


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """The report's path, the run's last line (after pytest's counts)."""
    _stop_profile(config)
    paths = getattr(config, "_normdiff_report", None)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if paths and reporter is not None:
        reporter.write_line(f"normdiff correctness report: {paths[0]}")


