"""Kernel timing: CUDA events on a GPU, a wall clock on the CPU; the byte count and the copy ceiling.

How one call is timed on a GPU (``EventTimer``)::

    host enqueues:  [read 256 MiB] [sleep] | start event, the kernel, end event | wait for end
    GPU runs:       [ L2 flush    ][ sleep ][start][ kernel              ][end]

1. Before each timed call, outside the events, a reduction reads a 256 MiB buffer. The 60 MB L2
   then holds clean lines of that buffer and none of the kernel's inputs or outputs. (Zeroing a
   buffer, the usual flush, leaves up to 60 MB of dirty lines whose write-back would land inside
   the next timed call; at 2^26 bf16 elements that is a fifth of the kernel's traffic.)
2. The GPU is then held busy (``torch.cuda._sleep``) for longer than the host takes to enqueue the
   start event, the kernel and the end event: the GPU never waits for the host between the
   events, so their span is the kernel's device time without the host's launch latency. The
   sleep is twice the longest enqueue seen so far for this kernel (at least ``MIN_LEAD_US``).
3. The span between the two events (``Event.elapsed_time``) is the call's time.

Decode shapes (a few rows) use ``GraphTimer``: ``GRAPH_CALLS`` calls captured in one CUDA graph,
replayed between the events, the span divided by the count. Launch overhead is then what the GPU
itself spends between kernels, as in a model's decode step captured in a graph; the inputs are
small and stay in L2 between calls, as they do between a model's kernels. A kernel that cannot be
captured falls back to ``EventTimer`` and says so.

On the CPU (``WallTimer``): ``time.perf_counter`` around the call.

How pytest-benchmark records these times: in pedantic mode it calls ``timer()`` right before and
right after ``target()`` and records the difference, with nothing subtracted or calibrated
(pytest-benchmark 5.x, ``BenchmarkFixture._raw_pedantic``); ``setup()`` runs outside that span.
The timer handed to it (with the documented ``pytest.mark.benchmark(timer=...)``) is ``CLOCK``, a
``KernelClock``: a clock that stands still except when a timed call advances it by that call's
measured time. So every duration pytest-benchmark records is exactly one call's kernel time, and
its statistics, ``--benchmark-json`` and ``--benchmark-compare`` are its own, fed with those times.
"""
from __future__ import annotations

import statistics
import time

import torch

L2_FLUSH_BYTES = 256 * 2**20  # several times the H200's 60 MB L2
MIN_LEAD_US = 30.0  # shortest sleep before a timed call
GRAPH_CALLS = 20  # calls per CUDA-graph replay for the decode regime
COPY_BYTES = {"cuda": 2 * 2**30, "cpu": 128 * 2**20}  # size of the copy that sets the ceiling


SETTLE_S = 0.05  # GPU time of back-to-back calls before a GPU benchmark's warm-up rounds


def settle(fn, seconds: float = SETTLE_S, max_calls: int = 20_000) -> int:
    """Run ``fn`` back to back for about ``seconds`` of GPU time, so the clocks and power state
    the timed rounds meet are those of this kernel, not of the (possibly far heavier) benchmark
    before it. Returns the number of calls."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    once = max(start.elapsed_time(end) / 1e3, 1e-6)
    calls = min(max_calls, int(seconds / once) + 1)
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return calls + 1


class KernelClock:
    """The timer pytest-benchmark reads: stands still except when ``advance`` adds a measured time."""

    __name__ = "normdiff_kernel_clock"  # how pytest-benchmark names the timer in its JSON

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


CLOCK = KernelClock()


def bytes_moved(m: int, n: int, dtype: torch.dtype, has_weight: bool, has_bias: bool, stats: int) -> int:
    """Fewest bytes the op must move: read x and the parameters, write y and ``stats`` float32
    statistics per row (mean and/or rstd, those the kernel writes)."""
    s = dtype.itemsize
    return 2 * m * n * s + (int(has_weight) + int(has_bias)) * n * s + stats * m * 4


def bytes_moved_backward(m: int, n: int, dtype: torch.dtype, has_weight: bool, has_bias: bool, stats: int) -> int:
    """Fewest bytes a backward pass must move: read x and dy, write dx, read the weight, write dw
    and db once, read the ``stats`` float32 statistics per row the forward saved."""
    s = dtype.itemsize
    return 3 * m * n * s + (2 * int(has_weight) + int(has_bias)) * n * s + stats * m * 4


class _Timer:
    """``setup`` runs before each timed call and is not timed; ``target`` runs one timed call and
    advances the clock by its time; ``times`` holds every call's seconds, warm-up included."""

    how = ""  # for the report
    kind = ""  # "wall", "events" or "graph"

    def __init__(self, clock: KernelClock) -> None:
        self.clock = clock
        self.times: list[float] = []

    def setup(self) -> None:
        # Each timed call starts the clock from zero, so the difference pytest-benchmark takes is
        # the measured time exactly, not a rounding of a large running total.
        self.clock.now = 0.0

    def _record(self, seconds: float) -> None:
        self.times.append(seconds)
        self.clock.advance(seconds)

    def run(self, rounds: int, warmup: int = 0) -> list[float]:
        """Time outside pytest-benchmark (the copy ceiling); returns the timed rounds."""
        for _ in range(warmup + rounds):
            self.setup()
            self.target()
        return self.times[-rounds:]


class WallTimer(_Timer):
    kind = "wall"
    how = "wall clock (time.perf_counter) around each call"

    def __init__(self, fn, clock: KernelClock = CLOCK) -> None:
        super().__init__(clock)
        self.fn = fn

    def target(self) -> None:
        t0 = time.perf_counter()
        self.fn()
        self._record(time.perf_counter() - t0)


class GpuTools:
    """What the GPU timers share in a session: the flush buffer and the sleep calibration."""

    def __init__(self, device: str = "cuda") -> None:
        self.device = device
        # float32 so the flush is one plain reduction; 0.0s keep it cheap to create.
        self.flush_buf = torch.zeros(L2_FLUSH_BYTES // 4, dtype=torch.float32, device=device)
        self.cycles_per_us = self._calibrate_sleep()

    def flush_l2(self) -> None:
        self.flush_buf.sum()  # reads only: leaves no dirty lines behind

    def _calibrate_sleep(self) -> float:
        torch.cuda._sleep(1000)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        cycles = 2_000_000
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        return cycles / (start.elapsed_time(end) * 1e3)

    def sleep(self, us: float) -> None:
        torch.cuda._sleep(int(us * self.cycles_per_us))


class EventTimer(_Timer):
    kind = "events"
    how = ("CUDA events around each call; L2 flushed by reading 256 MiB before it, GPU held busy "
           "while the host enqueues so launch latency stays outside the events")

    def __init__(self, fn, tools: GpuTools, clock: KernelClock = CLOCK, flush: bool = True) -> None:
        super().__init__(clock)
        self.fn, self.tools, self.flush = fn, tools, flush
        self.start = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)
        self.enqueue_us: list[float] = []
        self.lead_us = MIN_LEAD_US

    def setup(self) -> None:
        super().setup()
        if self.flush:
            self.tools.flush_l2()
        self.tools.sleep(self.lead_us)

    def target(self) -> None:
        h0 = time.perf_counter()
        self.start.record()
        self._call()
        self.end.record()
        h1 = time.perf_counter()
        self.end.synchronize()
        self._enqueued((h1 - h0) * 1e6)
        self._record(self.start.elapsed_time(self.end) / 1e3)

    def _call(self) -> None:
        self.fn()

    def _enqueued(self, us: float) -> None:
        self.enqueue_us.append(us)
        self.lead_us = max(self.lead_us, 2 * us)

    def host_enqueue_us(self) -> float | None:
        return statistics.median(self.enqueue_us) if self.enqueue_us else None


class GraphTimer(EventTimer):
    kind = "graph"
    how = (f"CUDA graph of {GRAPH_CALLS} calls replayed between CUDA events, time / {GRAPH_CALLS}; "
           "GPU held busy while the host enqueues; L2 warm")

    def __init__(self, fn, tools: GpuTools, clock: KernelClock = CLOCK, calls: int = GRAPH_CALLS) -> None:
        super().__init__(fn, tools, clock, flush=False)
        self.calls = calls
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # first calls off the capture, as torch.cuda.graphs asks
            fn()
            fn()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            for _ in range(calls):
                fn()
        torch.cuda.synchronize()

    def _call(self) -> None:
        self.graph.replay()

    def _record(self, seconds: float) -> None:
        super()._record(seconds / self.calls)


# -- host-inclusive cost of the call a user makes (NormKernel.user_call) -------------------------
HOST_CALLS = 200  # back-to-back calls per host measurement (fewer: the host's noise decides)
# ... but at most about this much GPU time of them, and never fewer than HOST_MIN_CALLS: every call
# queued still runs after the timing, so at long rows (4-8 ms a call) 200 calls cost over a second a
# measurement while the host's per-call figure needs far fewer calls to stand out of its noise.
HOST_GPU_SECONDS, HOST_MIN_CALLS = 0.02, 20
WALL_SECONDS = 0.01  # GPU time of back-to-back calls per wall measurement
HOST_REPEATS = 5  # measurements of each; the median is the result


def host_call_us(fn, tools: GpuTools, calls: int = HOST_CALLS) -> float:
    """Host µs per call of ``fn``: ``calls`` calls back to back, no synchronise, timed with the host
    clock while the GPU is held busy (a sleep queued first, longer than the calls take to enqueue)
    so no call waits on the GPU and the launch queue never fills."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(3):
        fn()
    guess = (time.perf_counter() - t0) / 3
    torch.cuda.synchronize()
    tools.sleep(min(2 * calls * guess * 1e6, 500_000) + 100)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    seconds = time.perf_counter() - t0
    torch.cuda.synchronize()
    return seconds / calls * 1e6


def wall_call_us(fn, device_us: float, host_us: float, seconds: float = WALL_SECONDS) -> float:
    """Wall µs per call of ``fn`` in steady state: calls back to back, host included, no graph, no
    L2 flush, one synchronise at the end of the run (calls sized from the device and host times)."""
    calls = int(min(500, max(20, seconds * 1e6 / max(device_us, host_us, 1.0))))
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def host_calls_for(device_us: float) -> int:
    """Calls of one host measurement of a call that takes ``device_us`` of GPU time."""
    return int(min(HOST_CALLS, max(HOST_MIN_CALLS, HOST_GPU_SECONDS * 1e6 / max(device_us, 1.0))))


def user_call_cost(fn, tools: GpuTools, device_us: float) -> tuple[float, float]:
    """(host µs, wall µs) per call of ``fn``, each the median of HOST_REPEATS measurements."""
    calls = host_calls_for(device_us)
    host = statistics.median(host_call_us(fn, tools, calls) for _ in range(HOST_REPEATS))
    wall = statistics.median(wall_call_us(fn, device_us, host) for _ in range(HOST_REPEATS))
    return host, wall


PAIRED_ROUNDS = 15  # rounds of a paired host measurement; each round times every call once


def paired_host_us(calls: dict, tools: GpuTools, rounds: int = PAIRED_ROUNDS, samples: dict | None = None) -> dict:
    """Host µs per call of each of ``calls`` (name -> zero-argument callable), measured in
    interleaved rounds (the order rotated each round), the median of each over the rounds. The
    host's own drift (clocks, other processes, the allocator's state) moves a figure by several
    µs between measurements minutes apart; calls compared within one round see the same host, so
    a comparison of a few µs is a comparison of the calls, not of the moments they were timed.
    ``samples``, where given, receives each call's figures round by round."""
    names = list(calls)
    got: dict = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            got[name].append(host_call_us(calls[name], tools))
    if samples is not None:
        samples.update(got)
    return {name: statistics.median(v) for name, v in got.items()}


def gpu_time_ms(fn, tools: GpuTools, rounds: int = 50, warmup: int = 5) -> float:
    """Median GPU time of ``fn()`` in milliseconds, outside pytest, timed as a benchmark is:
    settled, then EventTimer rounds (cold L2, launch latency hidden)."""
    settle(fn)
    return statistics.median(EventTimer(fn, tools, clock=KernelClock()).run(rounds, warmup)) * 1e3


def copy_ceiling_gbps(device: str, tools: GpuTools | None = None, rounds: int = 20,
                      nbytes: int | None = None) -> tuple[float, str]:
    """Copy bandwidth (bytes read plus bytes written) in GB/s, timed like the kernels; and how."""
    nbytes = nbytes or COPY_BYTES[device]
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    fn = lambda: dst.copy_(src)  # noqa: E731
    timer = EventTimer(fn, tools, clock=KernelClock()) if device == "cuda" else WallTimer(fn, clock=KernelClock())
    seconds = statistics.median(timer.run(rounds, warmup=3))
    what = "device-to-device" if device == "cuda" else "host memory"
    return 2 * nbytes / seconds / 1e9, f"{what} copy of {nbytes / 2**30:g} GiB bfloat16, median of {rounds}"


def timer_for(fn, regime: str, device: str, gpu: "GpuTools | None"):
    """The timer for one benchmark (wall clock on the CPU; a CUDA-graph replay for decode, CUDA
    events for bandwidth) and, where it is not the planned one, why."""
    if device != "cuda":
        return WallTimer(fn), None
    if regime == "decode":
        try:
            return GraphTimer(fn, gpu), None
        except Exception as exc:  # not capturable: say so and time with events
            torch.cuda.synchronize()
            return EventTimer(fn, gpu), f"CUDA-graph capture failed ({type(exc).__name__}: {exc})"[:300]
    return EventTimer(fn, gpu), None
