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
   validation) with ``harness.timing`` inside ``benchmark.pedantic``: warm-up rounds first, then
   the rounds whose median is the result;
4. puts bytes, GB/s, % of the copy ceiling measured once in this session, the speedup over the
   baseline kernel (``--bench-baseline``, timed first in each group) and how it was timed into
   ``benchmark.extra_info``, so all of it is in pytest-benchmark's JSON.

At the end of the session (and every ``PARTIAL_REPORT_S`` during it, so a run killed by a timeout
leaves a report) pytest-benchmark's own JSON document, with a ``normdiff`` section added (skips,
failures, environment, ceiling), is written to ``<report-dir>/benchmark.json`` and rendered by
``harness.report.benchmark`` into ``benchmark.md`` and PNG plots.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field

import pytest
import torch

from harness import bench_backward, memory, progress, run, timing
from harness.arena import Arena, beyond_budget, device_budget, shape_need
from harness.cases import DTYPES, Case, make_inputs
from harness.guards import nan_count
from harness.isolation import first_line
from harness.memory_watch import retryable_oom
from harness.runner import device_for, judge
from harness.shapes import (BACKWARD_BENCH_N, BANDWIDTH_N, BENCH_LONG_N, DECODE_M, DECODE_N, HEADLINE_BACKWARD_N,
                            HEADLINE_BANDWIDTH_N, HEADLINE_DECODE, HEADLINE_DTYPES, HEADLINE_LONG_N, QUICK_BACKWARD,
                            QUICK_BANDWIDTH, QUICK_DECODE, bandwidth_rows)
from impls import native
from impls.base import DEFAULT_EPS, OPS, NormKernel, NormOutputs, NormSpec, UnsupportedCase
from impls.reference import reference

ROUNDS = {"bandwidth": 40, "decode": 50}
WARMUP = {"bandwidth": 5, "decode": 5}
CPU_ROUNDS, CPU_WARMUP = 15, 2

# Correctness on a sample of rows: at most this many elements go through the float64 oracle.
CHECK_ELEMENTS = 2**22

CONTEXT = pytest.StashKey["BenchContext"]()


@dataclass(frozen=True)
class BenchShape:
    op: str
    dtype: str
    m: int
    n: int
    regime: str  # "bandwidth", "decode" or "backward"
    repeat: int = 0  # pass of the bandwidth sweep (--bench-repeat)

    @property
    def group(self) -> str:
        return f"{self.op}-{self.dtype}-{self.m}x{self.n}" + ("-backward" if self.regime == "backward" else "")


@dataclass(frozen=True)
class BenchItem:
    """One benchmark's parameter (not a NormKernel or a tuple, so the correctness report ignores it)."""

    shape: BenchShape
    kernel: NormKernel

    @property
    def id(self) -> str:
        return f"{self.shape.group}-{self.kernel.name}" + (f"-repeat{self.shape.repeat}" if self.shape.repeat else "")

    def __repr__(self) -> str:  # how pytest-benchmark's JSON shows the parameter
        return self.id


def sweep(profile: str, ops, dtypes, repeat: int = 1, bench_set: str = "full") -> list[BenchShape]:
    """The shapes in run order: each bandwidth pass, then the decode regime, then the backward.
    The full profile's ``bench_set``: "full" (the whole sweep) or "headline" (shapes.HEADLINE_*)."""
    shapes = []
    if profile == "full" and bench_set == "headline":
        bandwidth = [(bandwidth_rows(n), n) for n in HEADLINE_BANDWIDTH_N + HEADLINE_LONG_N]
        decode = list(HEADLINE_DECODE)
        backward = [(bandwidth_rows(n), n) for n in HEADLINE_BACKWARD_N]
    elif profile == "full":
        bandwidth = [(bandwidth_rows(n), n) for n in BANDWIDTH_N + BENCH_LONG_N]
        decode = [(m, n) for n in DECODE_N for m in DECODE_M]
        backward = [(bandwidth_rows(n), n) for n in BACKWARD_BENCH_N]
    else:
        bandwidth, decode, backward = list(QUICK_BANDWIDTH), list(QUICK_DECODE), list(QUICK_BACKWARD)
    for r in range(repeat):
        shapes += [BenchShape(op, dt, m, n, "bandwidth", r) for op in ops for dt in dtypes for m, n in bandwidth]
    shapes += [BenchShape(op, dt, m, n, "decode") for op in ops for dt in dtypes for m, n in decode]
    shapes += [BenchShape(op, dt, m, n, "backward") for op in ops for dt in dtypes for m, n in backward]
    return shapes


def items(shapes: list[BenchShape], kernels: list[NormKernel], baseline: str) -> list[BenchItem]:
    """Every kernel of the shape's op (the backward regime: those with a backward), the baseline
    first in each group (its time sets the speedups)."""
    out = []
    for s in shapes:
        ks = sorted((k for k in kernels if k.op == s.op and (s.regime != "backward" or k.has_backward)),
                    key=lambda k: (k.name != baseline, k.name))
        out += [BenchItem(s, k) for k in ks]
    return out


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
    config.stash[CONTEXT] = BenchContext(config)
    config.pluginmanager.register(config.stash[CONTEXT], "normdiff-bench")


def pytest_generate_tests(metafunc):
    if "bench_item" not in metafunc.fixturenames:
        return
    state = metafunc.config.stash[run.STATE]
    ops = [op for op in OPS if any(k.op == op for k in state.kernels)]
    bench_set = metafunc.config.getoption("bench_set")
    given = metafunc.config.getoption("dtype")
    default = HEADLINE_DTYPES if bench_set == "headline" and state.profile == "full" else tuple(DTYPES)
    dtypes = run.split_names(given, tuple(DTYPES), "dtype") or tuple(DTYPES) if given else default
    repeat = max(1, metafunc.config.getoption("bench_repeat"))
    baseline = metafunc.config.getoption("bench_baseline")
    params = [
        pytest.param(it, id=it.id, marks=pytest.mark.benchmark(group=it.shape.group, timer=timing.CLOCK))
        for it in items(sweep(state.profile, ops, dtypes, repeat, bench_set), state.kernels, baseline)
    ]
    metafunc.parametrize("bench_item", params)


@pytest.fixture
def bench_context(request) -> "BenchContext":
    return request.config.stash[CONTEXT]


# -- the session ----------------------------------------------------------------------------
@dataclass
class BenchContext:
    config: pytest.Config
    items: dict[str, BenchItem] = field(default_factory=dict)  # nodeid -> item
    skipped: list[dict] = field(default_factory=list)
    failed: list[dict] = field(default_factory=list)
    done: int = 0
    baseline_s: dict[tuple, float] = field(default_factory=dict)  # (group, repeat) -> median
    started: float = field(default_factory=time.time)
    _ceiling: dict = field(default_factory=dict)  # device -> (GB/s, how)
    _gpu: timing.GpuTools | None = None
    _arenas: dict = field(default_factory=dict)  # device -> Arena
    _budget: int | None = None
    _progress_at: float = field(default_factory=time.time)
    _inputs_key: tuple | None = None
    _inputs: tuple | None = None
    _last_write: float = field(default_factory=time.time)
    _machine_info: dict | None = None
    written: tuple | None = None  # paths of the last report written

    # Registered as a plugin object, so pytest calls these hooks too.
    def pytest_collection_modifyitems(self, items):
        for item in items:
            spec = getattr(item, "callspec", None)
            if spec is not None and isinstance(spec.params.get("bench_item"), BenchItem):
                self.items[item.nodeid] = spec.params["bench_item"]

    def pytest_deselected(self, items):
        for item in items:
            self.items.pop(item.nodeid, None)

    def pytest_runtest_logreport(self, report):
        it = self.items.get(report.nodeid)
        if it is None:
            return
        row = {"kernel": it.kernel.name, "op": it.shape.op, "dtype": it.shape.dtype,
               "shape": f"{it.shape.m}x{it.shape.n}", "regime": it.shape.regime, "repeat": it.shape.repeat}
        if report.skipped:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            self.skipped.append({**row, "reason": reason.removeprefix("Skipped: ")})
        elif report.failed:
            self.failed.append({**row, "nodeid": report.nodeid, "when": report.when,
                                "message": (report.longreprtext or "")[-2000:]})
        if report.when == "call":
            self.done += 1
            run.write_partial(self)
            self.progress()

    def progress(self) -> None:
        """Every --progress-every seconds: benchmarks done of those collected, an estimate of what is left."""
        if time.time() - self._progress_at < self.config.getoption("progress_every") or not self.items:
            return
        self._progress_at = time.time()
        progress.emit(self.config, progress.headline(self.started, self.done, len(self.items), "benchmarks")
                      + f" | {len(self.skipped)} skipped, {len(self.failed)} failed")

    @pytest.hookimpl(optionalhook=True)
    def pytest_benchmark_update_json(self, config, benchmarks, output_json):
        output_json["normdiff"] = self.document()

    def pytest_sessionfinish(self, session, exitstatus):
        self.write_report(final=True)

    def pytest_terminal_summary(self, terminalreporter):
        if self.written:
            terminalreporter.write_line(f"normdiff benchmark report: {self.written[0]}")

    # -- what the benchmarks share --------------------------------------------------------------
    def gpu(self) -> timing.GpuTools:
        if self._gpu is None:
            self._gpu = timing.GpuTools()
            # The host-inclusive columns time the call a user makes, on the native path once built
            # (impls.native: built in the background on first use; here waited for, once).
            native.wait(300)
        return self._gpu

    def ceiling(self, device: str) -> tuple[float, str]:
        if device not in self._ceiling:
            self._ceiling[device] = timing.copy_ceiling_gbps(device, self.gpu() if device == "cuda" else None)
        return self._ceiling[device]

    def budget(self) -> int:
        """Device bytes the benchmarks may use (harness.arena.device_budget), measured once."""
        if self._budget is None:
            self._budget = device_budget(self.config.getoption("gpu_memory"))
        return self._budget

    def fits(self, s: BenchShape) -> str | None:
        """Why a shape cannot run within the budget, or None."""
        return beyond_budget(s, s.group, self.budget(), CHECK_ELEMENTS)

    def arena(self, device: str) -> Arena:
        """The one buffer every benchmark on ``device`` takes its tensors from (Arena.for_shapes),
        sized for the largest shape that fits the budget, and the allocator's fill within it."""
        if device not in self._arenas:
            shapes = [it.shape for it in self.items.values() if device_for(it.kernel) == device]
            room = None
            if device == "cuda":
                shapes = [s for s in shapes if self.fits(s) is None]
                # the fill is the memory a kernel's own y takes: shape_need counts it, the room excludes it
                room = self.budget() - max((shape_need(s, CHECK_ELEMENTS) - 2 * s.m * s.n * DTYPES[s.dtype].itemsize
                                            for s in shapes), default=0)
            self._arenas[device] = Arena.for_shapes(shapes, device, room)
        return self._arenas[device]

    def inputs(self, s: BenchShape, device: str):
        """x, weight, bias of a shape, shared by the kernels of its group, in the arena."""
        key = (s.op, s.dtype, s.m, s.n, device)
        if key != self._inputs_key:
            self._inputs = self._inputs_key = None
            views = self.arena(device).views(s)
            drawn = make_inputs(Case(s.op, s.dtype, (s.m, s.n)), device)  # as the checks draw them
            views["x"].copy_(drawn.x)
            views["w"].copy_(drawn.weight)
            if drawn.bias is not None:
                views["b"].copy_(drawn.bias)
            del drawn
            self._inputs_key, self._inputs = key, (views["x"], views["w"], views["b"])
        return self._inputs

    def outputs(self, k: NormKernel, s: BenchShape, device: str) -> NormOutputs:
        """The kernel's outputs, as ``NormKernel.allocate`` makes them, in the arena after x."""
        views = self.arena(device).views(s)
        return NormOutputs(y=views["y"], **{name: views[name] for name in ("mean", "rstd") if name in k.outputs})

    def host_peers(self, op: str) -> list[NormKernel]:
        """The run's kernels of ``op`` whose host cost the entry points are held to
        (``harness.report.host.HOST_REFERENCE_PEERS``)."""
        from harness.report.host import HOST_REFERENCE_PEERS

        state = self.config.stash[run.STATE]
        return [k for k in state.kernels if k.op == op and not k.project and k.backend in HOST_REFERENCE_PEERS]

    def timer(self, fn, regime: str, device: str):
        """The timer for one benchmark and, where it is not the planned one, why."""
        return timing.timer_for(fn, regime, device, self.gpu() if device == "cuda" else None)

    def rounds(self, regime: str, device: str) -> tuple[int, int]:
        r = self.config.getoption("bench_rounds")
        if device != "cuda":
            return r or CPU_ROUNDS, CPU_WARMUP
        return r or ROUNDS[regime], WARMUP[regime]

    # -- the report -----------------------------------------------------------------------------
    def document(self) -> dict:
        sel = self.config.stash[run.STATE].selection
        ceilings = {dev: {"gbps": g, "how": how} for dev, (g, how) in self._ceiling.items()}
        return {
            "schema": 1,
            "environment": run.environment(self.config.stash[run.STATE].kernels),
            "command": run.invocation(self.config),
            "selection": {**sel, "repeat": self.config.getoption("bench_repeat"),
                          "baseline": self.config.getoption("bench_baseline")},
            "ceiling": ceilings,
            "arena": {dev: {"bytes": a.buf.numel(), "how": a.describe()} for dev, a in self._arenas.items()},
            "timing": {"cuda": timing.EventTimer.how, "cuda_decode": timing.GraphTimer.how, "cpu": timing.WallTimer.how},
            "collected": len(self.items),
            "done": self.done,
            "elapsed_s": round(time.time() - self.started, 1),
            "skipped": self.skipped,
            "failed": self.failed,
        }

    def write_report(self, final: bool) -> None:
        config = self.config
        bs = getattr(config, "_benchmarksession", None)
        if bs is None or bs.skip or bs.disabled or not self.items or config.getoption("no_report"):
            return
        if not self.done:
            return
        if self._machine_info is None:
            self._machine_info = bs.get_machine_info()
        commit_info = config.hook.pytest_benchmark_generate_commit_info(config=config)
        doc = config.hook.pytest_benchmark_generate_json(
            config=config, benchmarks=bs.benchmarks, include_data=True,
            machine_info=self._machine_info, commit_info=commit_info,
        )
        config.hook.pytest_benchmark_update_json(config=config, benchmarks=bs.benchmarks, output_json=doc)
        doc["normdiff"]["final"] = final
        from harness.report.benchmark import write_all

        directory = run.report_dir(config, "bench")
        self.written = write_all(doc, directory)
        run.point_latest(config, directory)
        self._last_write = time.time()


# -- one benchmark --------------------------------------------------------------------------
def runnable_spec(k: NormKernel, s: BenchShape) -> tuple[NormSpec, str]:
    """The benchmark's problem (weight, and bias for LayerNorm) and its device; skips with the
    reason where the kernel cannot run it (its backward, in the backward regime) or a time would
    not mean anything here."""
    device = device_for(k)
    spec = NormSpec(op=s.op, dtype=DTYPES[s.dtype], rows=s.m, n=s.n, row_stride=s.n, device=device,
                    has_weight=True, has_bias=s.op == "layer_norm")
    reason = (k.backward_unsupported(spec) if s.regime == "backward" else k.unsupported(spec)) or k.bench_unavailable()
    if reason:
        pytest.skip(reason)
    return spec, device


def run_benchmark(item: BenchItem, benchmark, ctx: BenchContext) -> None:
    """One benchmark; a shape beyond the budget is skipped up front, and an out-of-memory is a
    resource event (a skip that says so), never the kernel's failure."""
    if device_for(item.kernel) == "cuda":
        why = ctx.fits(item.shape)
        if why:
            pytest.skip(why)
    try:
        if item.shape.regime == "backward":
            return bench_backward.run_backward(item, benchmark, ctx)
        return _run_forward(item, benchmark, ctx)
    except Exception as exc:
        if not retryable_oom(exc):
            raise
        message = first_line(exc)[:300]
    budget = ""
    if device_for(item.kernel) == "cuda":
        torch.cuda.empty_cache()
        budget = f" (budget {memory.fmt(ctx.budget())})"
    pytest.skip(f"{memory.OOM}{message}{budget}; not a result of the kernel's")


def _run_forward(item: BenchItem, benchmark, ctx: BenchContext) -> None:
    k, s = item.kernel, item.shape
    spec, device = runnable_spec(k, s)
    dtype = DTYPES[s.dtype]
    layer = s.op == "layer_norm"
    ceiling_gbps, _ = ctx.ceiling(device)
    x, w, b = ctx.inputs(s, device)
    b = b if layer else None
    eps = DEFAULT_EPS[s.op]
    out = ctx.outputs(k, s, device)

    t0 = time.perf_counter()
    try:
        k.prepare(spec)
        for t in out.fields().values():
            t.fill_(float("nan"))
        k._forward(x, w, b, eps, out)
        if device == "cuda":
            torch.cuda.synchronize()
    except UnsupportedCase as exc:
        pytest.skip(str(exc))
    prepare_s = time.perf_counter() - t0
    problems, worst_ulp = verify(k, s, x, w, b, eps, out, device)
    if problems:
        pytest.fail(f"{k.name} on {s.group}: wrong result, not timed:\n" + "\n".join(problems), pytrace=False)

    fn = k.bench_callable(x, w, b, eps, out)
    settle_calls = timing.settle(fn) if device == "cuda" else 0
    timer, fallback = ctx.timer(fn, s.regime, device)
    rounds, warmup = ctx.rounds(s.regime, device)
    nbytes = timing.bytes_moved(s.m, s.n, dtype, True, layer, len({"mean", "rstd"} & set(k.outputs)))
    info = benchmark.extra_info
    info.update(
        op=s.op, dtype=s.dtype, m=s.m, n=s.n, regime=s.regime, repeat=s.repeat,
        backend=k.backend, variant=k.variant, kernel=k.name, project=k.project, outputs=list(k.outputs),
        entry_point=k.project and k.entry_point,
        bytes=nbytes, ceiling_gbps=ceiling_gbps, device=run.device_name(device),
        timing=fallback and f"CUDA events, {fallback}" or timer.how, timer=timer.kind,
        rounds=rounds, warmup_rounds=warmup, settle_calls=settle_calls, prepare_s=round(prepare_s, 3),
        correct=True, max_ulp_err=worst_ulp,
    )
    benchmark.pedantic(timer.target, setup=timer.setup, rounds=rounds, warmup_rounds=warmup)

    median = statistics.median(timer.times[-rounds:])
    gbps = nbytes / median / 1e9
    info.update(median_us=median * 1e6, gbps=gbps, pct_of_copy=100 * gbps / ceiling_gbps)
    if isinstance(timer, timing.EventTimer):
        info.update(host_enqueue_us=timer.host_enqueue_us(), gpu_lead_us=timer.lead_us)
    if device == "cuda" and s.repeat == 0:
        info.update(user_cost(k, x, w, b, eps, ctx.gpu(), median * 1e6))
        if k.project and k.entry_point and "user_call" in info and host_target_shape(s):
            info.update(paired_host_cost(k, ctx.host_peers(s.op), x, w, b, eps, ctx.gpu()))
    key = (s.group, s.repeat)
    if k.name == ctx.config.getoption("bench_baseline"):
        ctx.baseline_s[key] = median
    if key in ctx.baseline_s:
        info["speedup_vs_baseline"] = ctx.baseline_s[key] / median


def user_cost(k: NormKernel, x, w, b, eps, gpu: timing.GpuTools, device_us: float) -> dict:
    """The host-inclusive columns: host µs and wall µs per call of the call a user makes
    (``NormKernel.user_call``), named; or why they could not be measured."""
    try:
        name, call = k.user_call(x, w, b, eps)
        host, wall = timing.user_call_cost(call, gpu, device_us)
    except Exception as exc:  # noqa: BLE001 (reported in the row, the device time stands)
        torch.cuda.synchronize()
        return {"user_call_error": f"{type(exc).__name__}: {exc}"[:300]}
    return {"user_call": name, "host_call_us": host, "wall_call_us": wall}


def host_target_shape(s: BenchShape) -> bool:
    """Whether the host target judges this shape (``harness.report.host``): only there are the
    entry point and its peers timed paired. Elsewhere the pairs would be 15 rounds of 200 calls of
    three kernels, over a minute of GPU time a benchmark at the long rows, for a figure no target
    reads; the row's own host µs is still measured."""
    from harness.report.host import judges_host

    return judges_host(s.regime, s.n)


def paired_host_cost(k: NormKernel, peers: list[NormKernel], x, w, b, eps, gpu: timing.GpuTools) -> dict:
    """Host µs per call of an entry point and of each reference peer's call on the same inputs,
    timed in interleaved rounds (``timing.paired_host_us``): the figures the host targets compare.
    A peer that cannot take the call is left out, named with why."""
    calls, left_out = {k.name: k.user_call(x, w, b, eps)[1]}, {}
    for p in peers:
        try:
            call = p.user_call(x, w, b, eps)[1]
            call()
        except Exception as exc:  # noqa: BLE001 (the peer's own row says more)
            torch.cuda.synchronize()
            left_out[p.name] = f"{type(exc).__name__}: {exc}"[:200]
            continue
        calls[p.name] = call
    if len(calls) == 1:
        return {"host_paired_left_out": left_out} if left_out else {}
    samples: dict = {}
    medians = timing.paired_host_us(calls, gpu, samples=samples)
    return {"host_paired_us": medians,
            "host_paired_rounds_us": {name: [round(v, 2) for v in vs] for name, vs in samples.items()},
            **({"host_paired_left_out": left_out} if left_out else {})}


def verify(k: NormKernel, s: BenchShape, x, w, b, eps, out: NormOutputs, device: str) -> tuple[list[str], float]:
    """Problems with the outputs of one call (empty when correct), and the worst ulp error seen."""
    problems = []
    for name, t in out.fields().items():
        unwritten = nan_count(t)
        if unwritten:  # inputs are finite; NaN is the poison left unwritten (or a NaN computed)
            problems.append(f"{name}: {unwritten} of {t.numel()} elements unwritten or NaN")
    rows = sample_rows(s.m, s.n, device)
    sub = NormOutputs(**{name: t[rows] for name, t in out.fields().items()})
    errors, _ = judge(k, s.op, x[rows], w, b, sub, reference(s.op, x[rows], w, b, eps), device)
    problems += [e.summary() for e in errors if not e.ok]
    worst = max((e.max_ulp for e in errors if math.isfinite(e.max_ulp)), default=0.0)
    return problems, worst


def sample_rows(m: int, n: int, device: str) -> torch.Tensor:
    """Rows spread evenly over all M (first and last included), at most CHECK_ELEMENTS elements."""
    k = max(2, min(m, CHECK_ELEMENTS // n))
    return torch.linspace(0, m - 1, k, device=device).round().long().unique()


__all__ = ["BenchItem", "BenchShape", "run_benchmark", "sweep", "items"]
