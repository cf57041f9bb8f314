"""The benchmark suite's pytest plugin: the sweep, one timed run per (kernel, shape), the report.

``pytest --benchmark-only`` (from the project root) runs ``benchmarks/test_bench.py``: every
selected kernel (``--backend``, ``--backend-file``, ``--op``, ``--dtype`` as for the checks) on
every shape of the profile's sweep, each a pytest-benchmark benchmark whose group is
``op-dtype-MxN``, so a group compares kernels on identical work.

Each benchmark, in order:

1. skips with the reason when the kernel cannot run the shape here, or when a time would not mean
   anything (``NormKernel.bench_unavailable``: Triton under its interpreter);
2. ``kernel.prepare(spec)`` (compilation, autotuning), then one call of ``_forward`` into outputs
   poisoned with NaN (x, parameters and outputs live in the session's ``Arena``, at the same
   addresses in every pass), checked against the float64 oracle: no NaN left anywhere in the outputs, and
   every output within tolerance on a sample of rows spread over all M (rows are independent).
   A wrong result fails the benchmark: a fast wrong kernel is not a result;
3. times ``kernel.bench_callable`` (the kernel's own work on prepared rows and outputs, no
   validation) with ``harness.benchmarks.timing`` inside ``benchmark.pedantic``: warm-up rounds first, then
   the rounds whose median is the result;
4. puts bytes, GB/s, % of the copy ceiling measured once in this session, the speedup over the
   baseline kernel (``--bench-baseline``, timed first in each group) and how it was timed into
   ``benchmark.extra_info``, so all of it is in pytest-benchmark's JSON.

Programmatic dependent launch (``impls.pdl``): at decode a kernel that declares it can launch with
PDL is timed twice, ids ``...-pdl`` and ``...-nopdl``, everything from ``prepare`` on under
``pdl.forced(on)``; a PDL-on timing where PDL cannot run (``pdl.unavailable``, or NORMDIFF_PDL=0)
is skipped with that reason, never run as off. Every other benchmark is timed once as the kernel
launches by default. Each forward row records ``pdl``: whether the timed calls launched with it.

At the end of the session (and every ``PARTIAL_REPORT_S`` during it, so a run killed by a timeout
leaves a report) pytest-benchmark's own JSON document, with a ``normdiff`` section added (skips,
failures, environment, ceiling), is written to ``<report-dir>/benchmark.json`` and rendered by
``harness.report.benchmark`` into ``benchmark.md`` and PNG plots.

The fused ops (impls.fused: add_rms_norm, add_layer_norm, rms_norm with an fp8 output, ...) are
timed in the same session by harness.benchmarks.bench_fused: their shapes join each pass, their
groups are ``<op>-<write convention, fp8 output, ...>-dtype-MxN`` and each carries the pytest mark
``fused`` (``pytest --benchmark-only -m fused`` runs only them).

Where each part lives: the sweep in harness.benchmarks.bench_sweep, the session (arena, ceiling, timers, the
report) in harness.benchmarks.bench_context, one forward benchmark in harness.benchmarks.bench_forward, the backward
regime in harness.benchmarks.bench_backward; this module holds the options and the parametrisation.
"""
from __future__ import annotations

import contextlib

import pytest
import torch

from harness.benchmarks import bench_fused, timing
from harness.running import memory, run
from harness.benchmarks.bench_context import BenchContext
from harness.benchmarks.bench_sweep import BenchItem
from harness.judging.family import family
from harness.judging.cases import DTYPES
from harness.running.isolation import first_line
from harness.running.memory_watch import retryable_oom
from harness.judging.runner import device_for
from harness.judging.shapes import HEADLINE_DTYPES
from impls import pdl

CONTEXT = pytest.StashKey[BenchContext]()


# -- options and parametrisation ------------------------------------------------------------
def pytest_addoption(parser):
    group = parser.getgroup("normdiff benchmarks")
    group.addoption("--bench-repeat", type=int, default=1, metavar="N",
                    help="run the bandwidth sweep N times in one session (the report compares the passes)")
    group.addoption("--bench-rounds", type=int, default=None, metavar="R",
                    help="timed rounds per benchmark (default: 40 bandwidth, 50 decode, 15 on the CPU)")
    group.addoption("--bench-baseline", default="torch.eager", metavar="KERNEL",
                    help="backend.variant the speedups are relative to (default torch.eager)")
    group.addoption("--bench-set", default="headline", choices=("headline", "full"),
                    help="on a GPU: the headline shapes, every regime, minutes (default; bfloat16 unless --dtype "
                         "is given), or the full sweep (every N, decode M and dtype)")


def pytest_configure(config):
    config.addinivalue_line("markers", f"{bench_fused.MARK}: a benchmark of a fused op (harness/benchmarks/bench_fused.py)")
    config.stash[CONTEXT] = BenchContext(config)
    config.pluginmanager.register(config.stash[CONTEXT], "normdiff-bench")


def pytest_generate_tests(metafunc):
    """Every family's benchmark rows (harness.judging.family: its own sweep of its selected
    kernels), run in passes: each bandwidth pass of every family, then decode, then backward."""
    if "bench_item" not in metafunc.fixturenames:
        return
    state = metafunc.config.stash[run.STATE]
    bench_set = metafunc.config.getoption("bench_set")
    given = metafunc.config.getoption("dtype")
    default = HEADLINE_DTYPES if bench_set == "headline" and state.profile == "full" else tuple(DTYPES)
    dtypes = run.split_names(given, tuple(DTYPES), "dtype") or tuple(DTYPES) if given else default
    repeat = max(1, metafunc.config.getoption("bench_repeat"))
    rows = [it for r in state.runs.values() if r.kernels
            for it in r.family.bench_items(metafunc.config, r.kernels, state.profile, dtypes, repeat, bench_set)]
    ordered = sorted(rows, key=lambda it: bench_fused.phase(it.shape, repeat))  # stable: the families' order within a pass
    params = [
        pytest.param(it, id=it.id, marks=[pytest.mark.benchmark(group=it.shape.group, timer=timing.CLOCK)]
                     + ([getattr(pytest.mark, bench_fused.MARK)] if bench_fused.is_fused_shape(it.shape) else []))
        for it in ordered
    ]
    metafunc.parametrize("bench_item", params)


@pytest.fixture
def bench_context(request) -> BenchContext:
    return request.config.stash[CONTEXT]


# -- one benchmark --------------------------------------------------------------------------
def run_benchmark(item: BenchItem, benchmark, ctx: BenchContext) -> None:
    """One benchmark; a shape beyond the budget is skipped up front, and an out-of-memory is a
    resource event (a skip that says so), never the kernel's failure."""
    # Only a kernel that runs on a GPU here consults its memory: a CUDA-only kernel on a machine
    # without one goes on to runnable_spec, which skips it with the kernel's own reason.
    on_gpu = device_for(item.kernel) == "cuda" and torch.cuda.is_available()
    if on_gpu:
        why = ctx.fits(item.shape)
        if why:
            pytest.skip(why)
    try:
        with launch(item, device_for(item.kernel), benchmark.extra_info):
            return family(item.kernel.family).run_bench(item, benchmark, ctx)
    except Exception as exc:
        if not retryable_oom(exc):
            raise
        message = first_line(exc)[:300]
    budget = ""
    if on_gpu:
        torch.cuda.empty_cache()
        budget = f" (budget {memory.fmt(ctx.budget())})"
    pytest.skip(f"{memory.OOM}{message}{budget}; not a result of the kernel's")


def pdl_refusal(device) -> str | None:
    """Why a PDL-on timing cannot run on ``device`` here, else None: PDL cannot launch there, or
    the process turned it off (NORMDIFF_PDL=0 holds for the benchmarks too)."""
    why = pdl.why_off(device)
    return why and f"PDL on: {why}"


@contextlib.contextmanager
def launch(item: BenchItem, device: str, info: dict):
    """The PDL switch as ``item`` is timed under (forced on or off, or as it is), and the row's
    ``pdl``; a PDL-on item that cannot launch with PDL here is skipped with the reason."""
    if item.pdl:
        why = pdl_refusal(device)
        if why:
            pytest.skip(why)
    with pdl.forced(item.pdl) if item.pdl is not None else contextlib.nullcontext():
        if item.shape.regime != "backward":  # the declaration is the forward's
            info["pdl"] = item.kernel.launches_pdl(device, item.shape.m)
        yield


__all__ = ["launch", "pdl_refusal", "run_benchmark"]
