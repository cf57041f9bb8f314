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

from harness import compare, plugin, run, timing
from harness.cases import DTYPES
from harness.runner import device_for
from impls.base import DEFAULT_EPS, OPS, NormKernel, NormOutputs, NormSpec, UnsupportedCase
from impls.reference import reference


# The sweep. Bandwidth regime: M x N >= 2^26 elements (M >= 16384), N up to 65536 for every kernel
# and beyond it for those without a limit (looped, split-K); decode regime: a few rows.
BANDWIDTH_N = (1024, 2048, 4000, 4096, 5120, 8192, 12288, 16384, 32768, 65536)
LONG_N = (131072, 262144)
DECODE_M = (1, 8, 64)
DECODE_N = (4096, 8192)
QUICK_BANDWIDTH = ((512, 1024), (128, 4000))  # CPU and CI: seconds, not minutes
QUICK_DECODE = ((8, 4096),)

ROUNDS = {"bandwidth": 40, "decode": 50}
WARMUP = {"bandwidth": 5, "decode": 5}
CPU_ROUNDS, CPU_WARMUP = 15, 2

# Correctness on a sample of rows: at most this many elements go through the float64 oracle.
CHECK_ELEMENTS = 2**22
# Device memory a benchmark may plan to use, as a fraction of what is free.
MEMORY_FRACTION = 0.8

CONTEXT = pytest.StashKey["BenchContext"]()


def bandwidth_rows(n: int) -> int:
    return max(16384, -(-(2**26) // n))  # M x N >= 2^26 also where N does not divide it


@dataclass(frozen=True)
class BenchShape:
    op: str
    dtype: str
    m: int
    n: int
    regime: str  # "bandwidth" or "decode"
    repeat: int = 0  # pass of the bandwidth sweep (--bench-repeat)

    @property
    def group(self) -> str:
        return f"{self.op}-{self.dtype}-{self.m}x{self.n}"


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


def sweep(profile: str, ops, dtypes, repeat: int = 1) -> list[BenchShape]:
    """The shapes in run order: each bandwidth pass, then the decode regime."""
    shapes = []
    if profile == "full":
        bandwidth = [(bandwidth_rows(n), n) for n in BANDWIDTH_N + LONG_N]
        decode = [(m, n) for n in DECODE_N for m in DECODE_M]
    else:
        bandwidth, decode = list(QUICK_BANDWIDTH), list(QUICK_DECODE)
    for r in range(repeat):
        shapes += [BenchShape(op, dt, m, n, "bandwidth", r) for op in ops for dt in dtypes for m, n in bandwidth]
    shapes += [BenchShape(op, dt, m, n, "decode") for op in ops for dt in dtypes for m, n in decode]
    return shapes


def items(shapes: list[BenchShape], kernels: list[NormKernel], baseline: str) -> list[BenchItem]:
    """Every kernel of the shape's op, the baseline first in each group (its time sets the speedups)."""
    out = []
    for s in shapes:
        ks = sorted((k for k in kernels if k.op == s.op), key=lambda k: (k.name != baseline, k.name))
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


def pytest_configure(config):
    config.stash[CONTEXT] = BenchContext(config)
    config.pluginmanager.register(config.stash[CONTEXT], "normdiff-bench")


def pytest_generate_tests(metafunc):
    if "bench_item" not in metafunc.fixturenames:
        return
    state = metafunc.config.stash[plugin.STATE]
    ops = [op for op in OPS if any(k.op == op for k in state.kernels)]
    dtypes = run.split_names(state.selection["dtype"], tuple(DTYPES), "dtype") or tuple(DTYPES)
    repeat = max(1, metafunc.config.getoption("bench_repeat"))
    baseline = metafunc.config.getoption("bench_baseline")
    params = [
        pytest.param(it, id=it.id, marks=pytest.mark.benchmark(group=it.shape.group, timer=timing.CLOCK))
        for it in items(sweep(state.profile, ops, dtypes, repeat), state.kernels, baseline)
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
        return self._gpu

    def ceiling(self, device: str) -> tuple[float, str]:
        if device not in self._ceiling:
            self._ceiling[device] = timing.copy_ceiling_gbps(device, self.gpu() if device == "cuda" else None)
        return self._ceiling[device]

    def arena(self, device: str) -> "Arena":
        """The one buffer every benchmark on ``device`` takes its x, parameters and outputs from,
        sized for the largest shape of the session and allocated once. Nothing is handed back to
        the driver during the session (no ``empty_cache``): after tens of GB were freed, the
        next kernel timed ran up to 7% slow for a fraction of a second, longer than the settle
        step, while the placement of x made no difference (docs/perf-notes.md)."""
        if device not in self._arenas:
            shapes = [it.shape for it in self.items.values() if device_for(it.kernel) == device]
            self._arenas[device] = Arena(max((Arena.layout(s)[1] for s in shapes), default=0), device)
            if device == "cuda":
                # What kernels allocate themselves (eager's y, a compiled graph's buffers) comes
                # from the caching allocator: fill it once with memory already mapped and
                # written, so no shape of either pass is the first to use fresh memory.
                biggest = max((2 * s.m * s.n * DTYPES[s.dtype].itemsize for s in shapes), default=0)
                try:
                    torch.empty(biggest, dtype=torch.uint8, device=device).fill_(0)
                    self._arenas[device].prefilled = biggest
                except torch.OutOfMemoryError:
                    pass  # the arena's fallback note already says memory is short
                torch.cuda.synchronize()
        return self._arenas[device]

    def inputs(self, s: BenchShape, device: str):
        """x, weight, bias of a shape, shared by the kernels of its group, in the arena."""
        key = (s.dtype, s.m, s.n, device)
        if key != self._inputs_key:
            self._inputs = self._inputs_key = None
            gen = torch.Generator(device=device).manual_seed(s.m * 1_000_003 + s.n)
            dtype = DTYPES[s.dtype]
            views = self.arena(device).views(s)
            views["x"].copy_(torch.randn(s.m, s.n, generator=gen, device=device, dtype=dtype))
            views["w"].copy_((1.0 + 0.5 * torch.randn(s.n, generator=gen, device=device)).to(dtype))
            views["b"].copy_((0.5 * torch.randn(s.n, generator=gen, device=device)).to(dtype))
            self._inputs_key, self._inputs = key, (views["x"], views["w"], views["b"])
        return self._inputs

    def outputs(self, k: NormKernel, s: BenchShape, device: str) -> NormOutputs:
        """The kernel's outputs, as ``NormKernel.allocate`` makes them, in the arena after x."""
        views = self.arena(device).views(s)
        return NormOutputs(y=views["y"], **{name: views[name] for name in ("mean", "rstd") if name in k.outputs})

    def timer(self, fn, regime: str, device: str):
        """The timer for one benchmark and, where it is not the planned one, why."""
        if device != "cuda":
            return timing.WallTimer(fn), None
        if regime == "decode":
            try:
                return timing.GraphTimer(fn, self.gpu()), None
            except Exception as exc:  # not capturable: say so and time with events
                torch.cuda.synchronize()
                return timing.EventTimer(fn, self.gpu()), f"CUDA-graph capture failed ({type(exc).__name__}: {exc})"[:300]
        return timing.EventTimer(fn, self.gpu()), None

    def rounds(self, regime: str, device: str) -> tuple[int, int]:
        r = self.config.getoption("bench_rounds")
        if device != "cuda":
            return r or CPU_ROUNDS, CPU_WARMUP
        return r or ROUNDS[regime], WARMUP[regime]

    # -- the report -----------------------------------------------------------------------------
    def document(self) -> dict:
        sel = self.config.stash[plugin.STATE].selection
        ceilings = {dev: {"gbps": g, "how": how} for dev, (g, how) in self._ceiling.items()}
        return {
            "schema": 1,
            "environment": environment(),
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


# -- where a benchmark's tensors live ---------------------------------------------------------
class Arena:
    """One allocation carved into a shape's x, weight, bias, y, mean and rstd at offsets that
    depend on the shape alone. It grows (a new allocation) only for a shape larger than it was
    sized for, or where the sized allocation did not fit in memory (then: ``fallback``)."""

    # Every part starts on a 2 MiB boundary (a large page): measured 0.2-1.9 points faster than
    # 4 KiB offsets for the one-pass kernels (tools/layout_check.py@790c6df, docs/perf-notes.md item 13).
    ALIGN = 2 << 20

    def __init__(self, nbytes: int, device: str) -> None:
        self.device, self.fallback = device, None
        self.prefilled = 0  # bytes of written memory left in the caching allocator (BenchContext.arena)
        try:
            self.buf = torch.empty(max(nbytes, self.ALIGN), dtype=torch.uint8, device=device)
        except torch.OutOfMemoryError as exc:
            self.fallback = f"one arena of {nbytes / 2**30:.1f} GiB did not fit ({exc}); allocated per shape"
            self.buf = torch.empty(self.ALIGN, dtype=torch.uint8, device=device)

    def describe(self) -> str:
        how = self.fallback or (f"x, weight, bias and outputs of every shape in one {self.buf.numel() / 2**30:.2f} GiB "
                                f"allocation, made once, each at a {self.ALIGN // 2**20} MiB boundary: the same "
                                "addresses in every pass")
        if self.prefilled:
            how += (f"; the caching allocator filled once with {self.prefilled / 2**30:.2f} GiB of written memory "
                    "for what kernels allocate themselves; no memory handed back during the session")
        return how

    @classmethod
    def layout(cls, s: BenchShape) -> tuple[dict, int]:
        """{part: (offset, dtype, shape)} and the bytes the shape needs."""
        dt = DTYPES[s.dtype]
        parts = (("x", dt, (s.m, s.n)), ("w", dt, (s.n,)), ("b", dt, (s.n,)), ("y", dt, (s.m, s.n)),
                 ("mean", torch.float32, (s.m,)), ("rstd", torch.float32, (s.m,)))
        out, off = {}, 0
        for name, dtype, shape in parts:
            out[name] = (off, dtype, shape)
            off += -(-math.prod(shape) * dtype.itemsize // cls.ALIGN) * cls.ALIGN
        return out, off

    def views(self, s: BenchShape) -> dict[str, torch.Tensor]:
        parts, need = self.layout(s)
        if need > self.buf.numel():
            del self.buf
            self.buf = torch.empty(need, dtype=torch.uint8, device=self.device)
        return {name: self.buf[off:off + math.prod(shape) * dt.itemsize].view(dt).view(shape)
                for name, (off, dt, shape) in parts.items()}


# -- one benchmark --------------------------------------------------------------------------
def run_benchmark(item: BenchItem, benchmark, ctx: BenchContext) -> None:
    k, s = item.kernel, item.shape
    device = device_for(k)
    dtype = DTYPES[s.dtype]
    layer = s.op == "layer_norm"
    spec = NormSpec(op=s.op, dtype=dtype, rows=s.m, n=s.n, row_stride=s.n, device=device,
                    has_weight=True, has_bias=layer)
    reason = k.unsupported(spec) or k.bench_unavailable()
    if reason:
        pytest.skip(reason)
    if device == "cuda":
        arena = ctx.arena(device)
        # x and y (outside an arena that holds them), a y the kernel may allocate itself, the
        # oracle's sample.
        own = 0 if Arena.layout(s)[1] <= arena.buf.numel() else 2 * s.m * s.n * dtype.itemsize
        need = own + s.m * s.n * dtype.itemsize + 4 * CHECK_ELEMENTS * 8
        free = torch.cuda.mem_get_info()[0] + torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
        if need > MEMORY_FRACTION * free:
            pytest.skip(f"needs about {need / 2**30:.1f} GiB of device memory, {free / 2**30:.1f} GiB free")
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
        backend=k.backend, variant=k.variant, kernel=k.name, outputs=list(k.outputs),
        bytes=nbytes, ceiling_gbps=ceiling_gbps, device=device_name(device),
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
    key = (s.group, s.repeat)
    if k.name == ctx.config.getoption("bench_baseline"):
        ctx.baseline_s[key] = median
    if key in ctx.baseline_s:
        info["speedup_vs_baseline"] = ctx.baseline_s[key] / median


def verify(k: NormKernel, s: BenchShape, x, w, b, eps, out: NormOutputs, device: str) -> tuple[list[str], float]:
    """Problems with the outputs of one call (empty when correct), and the worst ulp error seen."""
    problems = []
    for name, t in out.fields().items():
        unwritten = int(torch.isnan(t).sum())
        if unwritten:  # inputs are finite; NaN is the poison left unwritten (or a NaN computed)
            problems.append(f"{name}: {unwritten} of {t.numel()} elements unwritten or NaN")
    rows = sample_rows(s.m, s.n, device)
    sub = NormOutputs(**{name: t[rows] for name, t in out.fields().items()})
    ref = reference(s.op, x[rows], w, b, eps)
    extra = compare.rounding_allowance(k.rounding, s.op, x[rows], ref, w, b, x.dtype)
    errors = compare.compare_outputs(s.op, sub, ref, x.dtype, k.stat_dtype(x.dtype, device), w, extra)
    problems += [e.summary() for e in errors if not e.ok]
    worst = max((e.max_ulp for e in errors if math.isfinite(e.max_ulp)), default=0.0)
    return problems, worst


def sample_rows(m: int, n: int, device: str) -> torch.Tensor:
    """Rows spread evenly over all M (first and last included), at most CHECK_ELEMENTS elements."""
    k = max(2, min(m, CHECK_ELEMENTS // n))
    return torch.linspace(0, m - 1, k, device=device).round().long().unique()


def environment() -> dict:
    env = run.environment()
    if "liger_kernel" not in env:
        import importlib.metadata as md

        try:
            env["liger_kernel"] = md.version("liger-kernel")
        except md.PackageNotFoundError:
            env["liger_kernel"] = None
    return env


def device_name(device: str) -> str:
    """The device a row was timed on; with a GPU its index as the process sees it set (one
    process times one GPU: CUDA_VISIBLE_DEVICES), so merged runs name the GPU of each row."""
    import os

    gpu = os.environ.get("CUDA_VISIBLE_DEVICES")
    if device == "cuda":
        return f"{torch.cuda.get_device_name()} #{gpu if gpu is not None else torch.cuda.current_device()}"
    import platform

    if gpu is not None and os.environ.get("NORMDIFF_FAKE_GPUS"):  # a simulated multi-GPU host
        return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads) #{gpu}"
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


__all__ = ["BenchItem", "BenchShape", "run_benchmark", "sweep", "items"]
