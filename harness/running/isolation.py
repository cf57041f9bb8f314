"""Isolation and scale-out: a kernel that crashes or hangs fails only its own checks, and the
checks spread over every core and GPU of the host, through pytest-xdist.

- **Workers** (harness/running/workers.py). ``pytest harness`` runs its checks in xdist workers by default
  (``-n 0``: one process, no isolation). Each worker is pinned to one GPU (CUDA_VISIBLE_DEVICES in
  its spec, so a replacement keeps it); ``--workers-per-gpu`` sets how many share one.
- **Scheduling** (harness/running/scheduling.py): every check of a case goes to one worker; cases that
  share a kernel's compile key are kept in few workers.
- **Crashes** (here, the watch around each kernel call; harness/running/controller.py, the controller's
  side). Before each kernel call the worker writes what it is about to run into a note file;
  faulthandler writes fatal signals and timeouts into a fault file. When a worker dies, the
  controller reads both and records the check as *crashed* (signal, sticky CUDA error) or *hung*
  (its time limit passed); xdist replaces the worker. A sticky CUDA error is found by the
  synchronize right after the call, and the worker exits at once, so no later check inherits it.
  After ``--crash-limit`` crashes of one kernel its remaining checks are *not run*.
- **Shards** (``--shard K/N``, harness/running/scheduling.py): deterministic, a case's checks kept together.
"""
from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import sys
import time
from pathlib import Path

from harness.running import memory



def addoption(group) -> None:
    group.addoption("--check-timeout", type=float, default=120.0, metavar="S",
                    help="seconds one kernel call may take before its check is recorded as hung (default 120)")
    group.addoption("--compile-timeout", type=float, default=900.0, metavar="S",
                    help="seconds the first call of a compile key may take, compilation included (default 900)")
    group.addoption("--crash-limit", type=int, default=3, metavar="K",
                    help="after K crashes of one kernel, its remaining checks are not run (default 3)")
    group.addoption("--workers-per-gpu", type=int, default=None, metavar="W",
                    help="xdist workers sharing one GPU (default: the host's cores divided among its GPUs)")
    group.addoption("--shard", default=None, metavar="K/N",
                    help="run only shard K of N (1-based); a case's checks stay in one shard")
    from harness.running import resume

    resume.addoption(group)  # --resume-from, --ids-file: the other selection of whole checks


def worker_id(config) -> str | None:
    return getattr(config, "workerinput", {}).get("workerid")


# -- the watch around each kernel call --------------------------------------------------------
class KernelCrashed(RuntimeError):
    """A kernel left the CUDA context unusable (single process: the run stops after this check)."""


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def broken_context(device: str) -> str | None:
    """None when ``device``'s context still works after a failed call, else the first line of
    its error. Only CUDA has sticky errors (illegal address, misaligned access, device-side
    assert, an out-of-memory that left the context unusable)."""
    if device != "cuda":
        return None
    import torch

    error = None
    for attempt in range(3):
        try:
            torch.cuda.synchronize()
            torch.ones(1, device="cuda").add_(1).item()
            return None
        except Exception as exc:  # a sticky error: illegal address, misaligned access, device-side assert
            error = first_line(exc)
            if "out of memory" not in error:
                return error
            # Memory another worker holds for a moment is not a broken context: free ours, retry.
            torch.cuda.empty_cache()
            time.sleep(1 + attempt)
    return error


class CallWatch:
    """Limits each kernel call in time and leaves a note of what runs, so a crash is attributed.

    In an xdist worker the note and fault files live in the controller's directory; in a single
    process the fault output goes to stderr and there is no note."""

    def __init__(self, config):
        self.check_timeout = config.getoption("check_timeout")
        self.compile_timeout = config.getoption("compile_timeout")
        self.worker = worker_id(config)
        self.nodeid: str | None = None
        self.item_compiles = 0  # calls of the running test that compiled first
        self.item_compile_s = 0.0  # and the seconds they took (the report's phases)
        self.compiled: set = set()
        self.note_path = self.fault = None
        if self.worker:
            directory = Path(config.workerinput["normdiff_dir"])
            self.note_path = directory / f"{self.worker}.note"
            self.fault = open(directory / f"{self.worker}.fault", "w")  # noqa: SIM115 (kept open for faulthandler)
        self._enabled = False
        self.banned_path = Path(config.workerinput["normdiff_dir"]) / "banned.json" if self.worker else None
        self._banned: dict = {}
        self.fatal: dict | None = None  # one process: the sticky error that ends the run
        self._banned_mtime = None

    def item_limit(self) -> float:
        return self.compile_timeout + self.check_timeout

    def _arm(self, seconds: float) -> None:
        faulthandler.dump_traceback_later(seconds, exit=True, file=self.fault or sys.stderr)

    def note(self, **fields) -> None:
        if self.note_path is None:
            return
        fields.update(nodeid=self.nodeid, pid=os.getpid(), time=time.time())
        with open(self.note_path, "w") as f:
            f.write(json.dumps(fields, default=str))

    def start_item(self, nodeid: str) -> None:
        if self.fault is not None and not self._enabled:
            # Here, not at configure: pytest's own faulthandler plugin points it at stderr then.
            faulthandler.enable(file=self.fault)
            self._enabled = True
        self.nodeid = nodeid
        self.item_compiles, self.item_compile_s = 0, 0.0
        self.note(phase="test")
        self._arm(self.item_limit())

    def end_item(self, kernel: str | None = None, case: str | None = None, session=None) -> None:
        """After each test: a sticky CUDA error its own code left (a check that calls kernels
        outside ``call``, such as the determinism and batch-invariance checks, or an error that
        surfaced only later) is charged to this test, and the worker exits before another test
        can inherit the broken context."""
        faulthandler.cancel_dump_traceback_later()
        broken = _after_test_probe()
        if broken:
            self.crash_after_test(kernel, case, broken, session)
            return
        self.note(phase="between tests")
        if self.worker:
            try:
                release_gpu_memory()
            except Exception as exc:  # noqa: BLE001 (an error raised here would end the whole xdist session)
                self.crash_after_test(kernel, case, first_line(exc), session)

    def crash_after_test(self, kernel: str | None, case: str | None, error: str, session=None) -> None:
        """As ``crash``, for an error found after the test rather than in a watched call: in one
        process the run stops after this test (nothing is raised: the test has ended)."""
        self._fatal(kernel, case, f"sticky CUDA error after {self.nodeid}: {error}", "test")
        if session is not None:
            session.shouldstop = f"{self.fatal['detail']}: the CUDA context is unusable (one process, -n 0: no worker to replace)"

    def banned(self, kernel: str) -> str | None:
        """Why ``kernel`` must not run any more (it crashed too often), else None."""
        if self.banned_path is None:
            return None
        try:
            mtime = self.banned_path.stat().st_mtime
        except FileNotFoundError:
            return None
        if mtime != self._banned_mtime:
            self._banned_mtime, self._banned = mtime, json.loads(self.banned_path.read_text() or "{}")
        return self._banned.get(kernel)

    @contextlib.contextmanager
    def call(self, kernel, case, spec):
        """Around one kernel call and its synchronize."""
        key = kernel.compile_key(spec)
        compiling = key is not None and (kernel.name, key) not in self.compiled
        limit = self.compile_timeout if compiling else self.check_timeout
        phase = "compile" if compiling else "call"
        self.note(phase=phase, kernel=kernel.name, case=case.id, limit_s=limit)
        self._arm(limit)
        began = time.perf_counter()
        try:
            yield
        except Exception:
            broken = broken_context(spec.device)  # looked up per call: a test may replace it
            if broken:
                self.crash(kernel, case, broken)
            raise
        finally:
            self._arm(self.item_limit())
            if compiling:  # a first call counts as compile, raised or not
                self.item_compile_s += time.perf_counter() - began
        if compiling:
            self.compiled.add((kernel.name, key))
            self.item_compiles += 1
        self.note(phase="test")

    def crash(self, kernel, case, error: str) -> None:
        """The CUDA context is gone: in a worker, leave the note and exit now (xdist charges this
        check and replaces the worker); in one process, fail this check and stop the run."""
        self._fatal(kernel.name, case.id, f"sticky CUDA error after {kernel.name} on {case.id}: {error}", "call")
        raise KernelCrashed(self.fatal["detail"] + "; the run stops here (one process, -n 0: no worker to replace)")

    def _fatal(self, kernel: str | None, case: str | None, message: str, phase: str) -> None:
        """A worker notes the error and exits; one process records it as ``fatal``."""
        if self.worker:
            self.note(phase=phase, kernel=kernel, case=case, fatal=message)
            self.fault.flush()
            os._exit(70)
        kind = "out of memory" if memory.is_oom_text(message) else "crashed"
        self.fatal = {"kind": kind, "detail": message, "where": f"{kernel} on {case}" if kernel else self.nodeid,
                      "worker": "this process", "kernel": kernel, "case": case, "phase": phase}


def _cuda_initialized() -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and torch.cuda.is_initialized()


def _after_test_probe() -> str | None:
    """The sticky CUDA error a test left, if any: one synchronize (a sticky error fails every
    one), and broken_context's full probe only when it raises. Without CUDA in use there is
    nothing to probe but broken_context itself (which the CPU tests simulate faults through)."""
    if not _cuda_initialized():
        return broken_context("cpu")
    import torch

    try:
        torch.cuda.synchronize()
        return None
    except Exception as exc:  # noqa: BLE001 (classified below)
        return broken_context("cuda") or first_line(exc)


def release_gpu_memory(keep_bytes: int = 2 << 30) -> None:
    """Hand cached GPU memory back when this worker holds more than ``keep_bytes``: workers share
    a GPU, and one worker's cache must not starve another's large case."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return
    if torch.cuda.memory_reserved() - torch.cuda.memory_allocated() > keep_bytes:
        torch.cuda.empty_cache()
