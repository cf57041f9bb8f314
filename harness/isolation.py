"""Isolation and scale-out: a kernel that crashes or hangs fails only its own checks, and the
checks spread over every core and GPU of the host, through pytest-xdist.

- **Workers.** ``pytest harness`` runs its checks in xdist workers by default (``-n 0``: one
  process, no isolation). Each worker is pinned to one GPU (CUDA_VISIBLE_DEVICES in its spec,
  so a replacement keeps it); ``--workers-per-gpu`` sets how many share one.
- **Scheduling** (harness/scheduling.py): every check of a case goes to one worker; cases that
  share a kernel's compile key are kept in few workers.
- **Crashes.** Before each kernel call the worker writes what it is about to run into a note
  file; faulthandler writes fatal signals and timeouts into a fault file. When a worker dies,
  the controller reads both and records the check as *crashed* (signal, sticky CUDA error) or
  *hung* (its time limit passed); xdist replaces the worker. A sticky CUDA error is found by the
  synchronize right after the call, and the worker exits at once, so no later check inherits it.
  After ``--crash-limit`` crashes of one kernel its remaining checks are *not run*.
- **Shards** (``--shard K/N``, harness/scheduling.py): deterministic, a case's checks kept together.
"""
from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest

from harness import memory, run

try:
    from xdist.scheduler import LoadScopeScheduling
except ImportError:  # pytest-xdist not installed: checks run in one process
    LoadScopeScheduling = object

XDIST = LoadScopeScheduling is not object
FAKE_GPUS_ENV = "NORMDIFF_FAKE_GPUS"  # simulate a host with this many GPUs (tests of the pinning)
NOT_RUN = "not run: "  # prefix of a check's skip reason when it never ran (its kernel kept crashing)
ROOT = Path(__file__).resolve().parents[1]


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


# -- worker count and pinning -------------------------------------------------------------------
def visible_gpus() -> list[str]:
    """The GPUs workers are pinned to, as CUDA_VISIBLE_DEVICES tokens."""
    fake = os.environ.get(FAKE_GPUS_ENV)
    if fake:
        return [str(i) for i in range(int(fake))]
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    from impls.base import cuda_present

    if not cuda_present():
        return []
    import torch

    count = torch.cuda.device_count()
    tokens = [t.strip() for t in listed.split(",") if t.strip()] if listed else []
    return tokens[:count] if tokens else [str(i) for i in range(count)]


def _runs_only_under(config, folder: str) -> bool:
    """Whether every path the run was given lies in the project's ``folder``."""
    args = [a.split("::")[0] for a in config.args] or []
    if not args:
        return False
    root = ROOT / folder
    for a in args:
        p = Path(a) if Path(a).is_absolute() else Path(config.invocation_params.dir) / a
        try:
            p.resolve().relative_to(root)
        except ValueError:
            return False
    return True


def _runs_harness_only(config) -> bool:
    """Isolation is the default for runs of the harness's checks (``pytest harness ...``), not
    for the framework's own tests, whose subprocess runs set their own."""
    return _runs_only_under(config, "harness")


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def plan_workers(config) -> None:
    """Before xdist reads its options: choose the workers and pin each to a GPU."""
    # A worker runs this hook too; with -p no:xdist the plugin is installed but not loaded.
    if not XDIST or hasattr(config, "workerinput") or not hasattr(config.option, "numprocesses"):
        return
    asked = config.option.numprocesses  # None unless -n was given
    if run.is_benchmark_run(config):
        if asked:
            raise pytest.UsageError("benchmarks time one GPU per process and are not xdist workers: drop -n "
                                    "(several GPUs: one pytest per GPU, see README)")
        config.option.numprocesses = 0
        return
    if config.getoption("usepdb", False) or config.getoption("collectonly", False):
        return
    if asked is None and _runs_only_under(config, "tests") and not visible_gpus() and _cores() > 1:
        # The framework's own tests (``pytest tests``) on a machine without a GPU: as with -n
        # CORES, one worker per core (they share nothing but caches that lock); -n 0 runs them in
        # one process, as on a GPU machine, where the native and kernel tests share one device.
        asked = _cores()
    if asked == 0 or (asked is None and not _runs_harness_only(config)):
        return
    gpus = visible_gpus()
    cores = _cores()
    budgets = memory.gpu_budgets(config.getoption("gpu_memory"), gpus)
    if asked in (None, "auto", "logical"):
        per_gpu = config.getoption("workers_per_gpu") or max(1, cores // max(1, len(gpus)))
        if budgets and not config.getoption("workers_per_gpu"):  # no more workers than the memory holds
            per_gpu = min(memory.workers_for(b, per_gpu) for b in budgets.values())
        count = per_gpu * len(gpus) if gpus else max(1, cores)
    else:
        count = int(asked)
    config._normdiff_gpu_budgets = budgets  # noqa: SLF001 (memory_watch.Ledgers writes each GPU's ledger)
    specs = [f"popen//env:CUDA_VISIBLE_DEVICES={gpus[i % len(gpus)]}" if gpus else "popen" for i in range(count)]
    config.option.numprocesses = None  # xdist would replace the specs with plain popen
    config.option.tx = specs
    if config.option.dist == "no":
        config.option.dist = "loadscope"
    config._normdiff_schedule = True  # noqa: SLF001 (pytest_xdist_make_scheduler)
    if config.option.maxworkerrestart is None:
        # Every kernel may crash --crash-limit times before it is stopped, plus some slack.
        from impls import registry

        registry.load_all(config.getoption("backend_file"))
        limit = config.getoption("crash_limit") * max(1, len(registry.backends())) * 2 + 2 * count
        config.option.maxworkerrestart = str(limit)


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
        self.item_compiles = 0
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
        try:
            yield
        except Exception:
            broken = broken_context(spec.device)  # looked up per call: a test may replace it
            if broken:
                self.crash(kernel, case, broken)
            raise
        finally:
            self._arm(self.item_limit())
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


# -- the controller: what a dead worker was doing ----------------------------------------------
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
