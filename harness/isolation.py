"""Isolation and scale-out: a kernel that crashes or hangs fails only its own checks, and the
checks spread over every core and GPU of the host, through pytest-xdist.

- **Workers.** ``pytest harness`` runs its checks in xdist workers by default (``-n 0``: one
  process, no isolation). Each worker is pinned to one GPU (CUDA_VISIBLE_DEVICES in its spec,
  so a replacement keeps it); ``--workers-per-gpu`` sets how many share one.
- **Scheduling** (``CaseScheduling``): every check of a case goes to one worker, so the agreement
  matrix compares every kernel that ran it; cases that share a kernel's compile key
  (``NormKernel.compile_key``) are kept in few workers.
- **Crashes.** Before each kernel call the worker writes what it is about to run into a note
  file; faulthandler writes fatal signals and timeouts into a fault file. When a worker dies,
  the controller reads both and records the check as *crashed* (signal, sticky CUDA error) or
  *hung* (its time limit passed); xdist replaces the worker. A sticky CUDA error is found by the
  synchronize right after the call, and the worker exits at once, so no later check inherits it.
  After ``--crash-limit`` crashes of one kernel its remaining checks are *not run*.
- **Shards** (``--shard K/N``): deterministic, a case's checks kept together.
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


def _runs_harness_only(config) -> bool:
    """Isolation is the default for runs of the harness's checks (``pytest harness ...``), not
    for the framework's own tests, whose subprocess runs set their own."""
    args = [a.split("::")[0] for a in config.args] or []
    if not args:
        return False
    harness = ROOT / "harness"
    for a in args:
        p = Path(a) if Path(a).is_absolute() else Path(config.invocation_params.dir) / a
        try:
            p.resolve().relative_to(harness)
        except ValueError:
            return False
    return True


def plan_workers(config) -> None:
    """Before xdist reads its options: choose the workers and pin each to a GPU."""
    if not XDIST or hasattr(config, "workerinput"):  # a worker runs this hook too
        return
    asked = config.option.numprocesses  # None unless -n was given
    if config.getoption("benchmark_only", False):
        if asked:
            raise pytest.UsageError("benchmarks time one GPU per process and are not xdist workers: drop -n "
                                    "(several GPUs: one pytest per GPU, see README)")
        config.option.numprocesses = 0
        return
    if asked == 0 or (asked is None and not _runs_harness_only(config)):
        return
    if config.getoption("usepdb", False) or config.getoption("collectonly", False):
        return
    gpus = visible_gpus()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if asked in (None, "auto", "logical"):
        per_gpu = config.getoption("workers_per_gpu") or max(1, cores // max(1, len(gpus)))
        count = per_gpu * len(gpus) if gpus else max(1, cores)
    else:
        count = int(asked)
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
            error = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
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
        self.note(phase="test")
        self._arm(self.item_limit())

    def end_item(self) -> None:
        faulthandler.cancel_dump_traceback_later()
        self.note(phase="between tests")
        if self.worker:
            release_gpu_memory()

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
        self.note(phase="test")

    def crash(self, kernel, case, error: str) -> None:
        """The CUDA context is gone: in a worker, leave the note and exit now (xdist charges this
        check and replaces the worker); in one process, fail this check and stop the run."""
        message = f"sticky CUDA error after {kernel.name} on {case.id}: {error}"
        if self.worker:
            self.note(phase="call", kernel=kernel.name, case=case.id, fatal=message)
            self.fault.flush()
            os._exit(70)
        self.fatal = {"kind": "crashed", "detail": message, "where": f"{kernel.name} on {case.id}",
                      "worker": "this process", "kernel": kernel.name, "case": case.id, "phase": "call"}
        raise KernelCrashed(message + "; the run stops here (one process, -n 0: no worker to replace)")


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
        kind, detail = "crashed", note["fatal"]
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

    def pytest_configure_node(self, node):
        node.workerinput["normdiff_dir"] = str(self.dir)

    def pytest_xdist_node_collection_finished(self, node, ids):
        path = self.dir / f"{node.gateway.id}.collection.json"
        if not self.state.collected and path.is_file():
            self.state.adopt_collection(json.loads(path.read_text()))

    @pytest.hookimpl(tryfirst=True)
    def pytest_handlecrashitem(self, crashitem, report, sched):
        worker = report.node.gateway.id

        def read(suffix):
            try:
                return (self.dir / f"{worker}.{suffix}").read_text()
            except OSError:
                return ""

        try:
            note = json.loads(read("note") or "{}")
        except json.JSONDecodeError:
            note = {}
        if note.get("nodeid") not in (None, crashitem):
            note = {}
        crash = classify(note, read("fault"), worker)
        kernel = crash["kernel"] or (self.state.records.get(crashitem) or {}).get("kernel")
        report.longrepr = f"{crash['kind']}: {crash['detail']} ({crash['where']}, worker {worker})"
        self.state.crashes[crashitem] = crash
        if kernel:
            self.crashes[kernel] += 1
            if self.crashes[kernel] >= self.limit:
                banned = {k: f"{NOT_RUN}{k} crashed {n} times (--crash-limit {self.limit})"
                          for k, n in self.crashes.items() if n >= self.limit}
                tmp = self.dir / "banned.json.tmp"
                tmp.write_text(json.dumps(banned))
                os.replace(tmp, self.dir / "banned.json")


# -- scheduling ---------------------------------------------------------------------------------
def case_groups(records: dict, cases: dict, kernels: dict, device_for) -> dict[str, str]:
    """case id -> group: cases joined when some kernel compiles once for both (union-find)."""
    parent: dict[str, str] = {}

    def find(a):
        while parent.setdefault(a, a) != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    owner: dict = {}
    for rec in records.values():
        case, kernel = cases.get(rec.get("case")), kernels.get((rec.get("kernel"), rec.get("op")))
        if case is None or kernel is None:
            continue
        find(case.id)
        spec = case.spec(device_for(kernel))
        if kernel.unsupported(spec):
            continue
        key = kernel.compile_key(spec)
        if key is None:
            continue
        first = owner.setdefault((kernel.name, key), case.id)
        parent[find(case.id)] = find(first)
    return {c: find(c) for c in parent}


def weight(rec: dict | None, cases: dict) -> float:
    """Rough cost of a test, to balance workers and shards."""
    if not rec:
        return 1.0
    if rec.get("test") == "test_fuzz":
        return 40.0
    case = cases.get(rec.get("case"))
    if case is None:
        return 1.0
    return 1.0 + numel(case) / 2**22


HEAVY_ELEMENTS = 2**25  # a case this large takes GBs of GPU memory (float64 oracle, guards, comparison)
# Workers that may hold such a case at once on one GPU: the largest (16384 x 8192) took 17 GB of
# the H200's 141 in one worker; four leave room for the other workers.
HEAVY_LANES_PER_GPU = 4


def numel(case) -> int:
    n = 1
    for s in case.shape:
        n *= s
    return n


def scopes(ids: list[str], records: dict, cases: dict, kernels: dict, device_for, cap: float | None,
           heavy_lanes: int | None = None) -> dict[str, str]:
    """nodeid -> scheduling scope. A case's checks share a scope; cases sharing a compile key
    share one too, cut into pieces of at most ``cap`` weight (None: never cut). With
    ``heavy_lanes``, the cases of HEAVY_ELEMENTS or more go to that many scopes of their own, so
    at most that many workers hold one at a time (workers share a GPU's memory)."""
    groups = case_groups(records, cases, kernels, device_for)
    if heavy_lanes:  # largest first, each onto the lane with the fewest elements so far
        load = [0] * heavy_lanes
        for c in sorted((c for c in groups if numel(cases[c]) >= HEAVY_ELEMENTS), key=lambda c: (-numel(cases[c]), c)):
            lane = min(range(heavy_lanes), key=lambda i: (load[i], i))
            load[lane] += numel(cases[c])
            groups[c] = f"heavy lane {lane}"
    members: dict[str, list[str]] = {}
    for nid in ids:
        rec = records.get(nid) or {}
        if rec.get("case") in groups:
            members.setdefault(groups[rec["case"]], []).append(nid)
    out = {}
    for group, nids in members.items():
        # Cut between cases only, cases with the same shape kept adjacent.
        by_case: dict[str, list[str]] = {}
        for nid in nids:
            by_case.setdefault(records[nid]["case"], []).append(nid)
        order = sorted(by_case, key=lambda c: (str(cases[c].shape), cases[c].row_pad, c))
        piece, load = 0, 0.0
        for c in order:
            w = sum(weight(records[n], cases) for n in by_case[c])
            if cap is not None and load and load + w > cap and not group.startswith("heavy"):
                piece, load = piece + 1, 0.0
            load += w
            for n in by_case[c]:
                out[n] = f"case-group {group} #{piece}"
    for nid in ids:
        if nid in out:
            continue
        rec = records.get(nid)
        if rec and rec.get("test") != "test_fuzz" and rec.get("kernel"):
            out[nid] = f"kernel {rec['op']} {rec['kernel']} {rec['test']}"  # cheap checks of one kernel
        elif nid.startswith("harness/"):
            out[nid] = nid  # independent: spread
        else:
            out[nid] = nid.rsplit("::", 1)[0]  # the framework's tests: by module, as xdist's loadscope
    return out


class CaseScheduling(LoadScopeScheduling):
    """xdist's scope scheduling over normdiff's scopes, heaviest first; a crashed check is
    reported once and never re-run (its scope's other checks go to another worker)."""

    def __init__(self, config, log, state):
        super().__init__(config, log)
        self.state = state
        self.scope_of: dict[str, str] = {}

    def _split_scope(self, nodeid: str) -> str:
        return self.scope_of.get(nodeid, nodeid)

    def schedule(self) -> None:
        if self.collection is None and self.collection_is_completed and self._check_nodes_have_same_collection():
            ids = list(next(iter(self.registered_collections.values())))
            st = self.state
            total = sum(weight(st.records.get(n), st.case_index) for n in ids)
            cap = max(30.0, total / (3 * max(1, self.numnodes)))
            gpus = {(n.gateway.spec.env or {}).get("CUDA_VISIBLE_DEVICES") for n in self.nodes} - {None}
            self.scope_of = scopes(ids, st.records, st.case_index, st.kernel_index, st.device_for, cap,
                                   heavy_lanes=HEAVY_LANES_PER_GPU * len(gpus) if gpus else None)
            units: dict[str, dict[str, bool]] = {}
            for nid in ids:
                units.setdefault(self._split_scope(nid), {})[nid] = False
            cost = {s: sum(weight(st.records.get(n), st.case_index) for n in u) for s, u in units.items()}
            self.collection = ids
            for s in sorted(units, key=lambda s: -cost[s]):
                self.workqueue[s] = units[s]
            for node in self.nodes:
                if self.workqueue:
                    self._assign_work_unit(node)
            for node in self.nodes:
                self._reschedule(node)
            return
        if self.collection is not None:  # a replacement worker finished collecting
            for node in self.nodes:
                self._reschedule(node)
            return
        super().schedule()

    def _reschedule(self, node) -> None:
        # A replacement worker is added before it has collected; xdist's loadscope would assign
        # it work then (KeyError when two workers die close together): it waits for its collection.
        if node in self.registered_collections:
            super()._reschedule(node)

    def remove_node(self, node):
        workload = self.assigned_work.pop(node)
        pending = [nid for unit in workload.values() for nid, done in unit.items() if not done]
        if not pending:
            return None
        crashitem = pending[0]
        for unit in workload.values():
            unit.pop(crashitem, None)  # reported as crashed by the controller, never re-run
        self.workqueue.update({s: u for s, u in workload.items() if not all(u.values())})
        for other in list(self.assigned_work):
            self._reschedule(other)
        return crashitem


# -- shards -------------------------------------------------------------------------------------
def parse_shard(value: str | None) -> tuple[int, int] | None:
    if not value:
        return None
    m = re.fullmatch(r"(\d+)/(\d+)", value.strip())
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise pytest.UsageError(f"--shard must be K/N with 1 <= K <= N, got {value!r}")
    return int(m.group(1)), int(m.group(2))


def shard_of(ids: list[str], records: dict, cases: dict, kernels: dict, device_for, count: int,
             groups: dict[str, str] | None = None) -> dict[str, int]:
    """nodeid -> shard (0-based): whole scopes, heaviest first onto the lightest shard. The
    same collection gives the same answer in every process. ``groups`` names the scope of tests
    that are not checks (a benchmark's group: its kernels are timed together)."""
    scope = {**scopes(ids, records, cases, kernels, device_for, cap=None), **(groups or {})}
    units: dict[str, list[str]] = {}
    for nid in ids:
        units.setdefault(scope[nid], []).append(nid)
    load = [0.0] * count
    out = {}
    for s in sorted(units, key=lambda s: (-sum(weight(records.get(n), cases) for n in units[s]), s)):
        k = min(range(count), key=lambda i: (load[i], i))
        load[k] += sum(weight(records.get(n), cases) for n in units[s])
        for n in units[s]:
            out[n] = k
    return out
