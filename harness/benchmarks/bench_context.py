"""The benchmark session's shared state (``BenchContext``, registered as a plugin object by
harness.bench): the collected benchmarks, their skips and failures, the copy ceiling, the arena
every benchmark takes its tensors from, the timers and rounds, and the report it writes."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import pytest

from harness.benchmarks import timing
from harness.running import progress, run
from harness.benchmarks.arena import Arena, beyond_budget, device_budget, shape_need
from harness.benchmarks.bench_forward import CHECK_ELEMENTS
from harness.benchmarks.bench_sweep import BenchItem, BenchShape
from harness.judging.cases import DTYPES, Case
from harness.judging.inputs import make_inputs
from harness.judging.runner import device_for
from impls import native
from impls.base import NormKernel, NormOutputs

ROUNDS = {"bandwidth": 40, "decode": 50}
WARMUP = {"bandwidth": 5, "decode": 5}
CPU_ROUNDS, CPU_WARMUP = 15, 2


@dataclass(eq=False)  # hashed by identity: pytest keeps the plugin objects it has seen in a set
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
               "shape": f"{it.shape.m}x{it.shape.n}", "regime": it.shape.regime, "repeat": it.shape.repeat,
               "pdl": it.pdl}
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
        """Device bytes the benchmarks may use (harness.benchmarks.arena.device_budget), measured once."""
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
        """The run's kernels of ``op`` whose host cost the entry points are held to: every peer (a
        kernel that does not declare ``NormKernel.project``) that can run here
        (``harness.report.host``)."""
        state = self.config.stash[run.STATE]
        return [k for k in state.kernels if k.op == op and not k.project and not k.unavailable()]

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
            "environment": run.environment(self.config.stash[run.STATE].kernels
                                           + self.config.stash[run.STATE].fused_kernels),
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
