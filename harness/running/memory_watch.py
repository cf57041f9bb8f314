"""Around every check on a GPU: memory admission, the measured peak, an out-of-memory retried
alone, and memory a kernel keeps after its call (harness.running.memory has the estimate and the ledger).

Registered by harness.plugin in each process that runs checks (an xdist worker, or the one
process of ``-n 0``). Every question about device memory goes through harness.running.devmem's card: the
CUDA device, or under ``--simulate-gpu`` a simulated one for the CPU's checks; a check with no card
(the CPU, not simulating) passes through untouched.
"""
from __future__ import annotations

import gc
import json
import os
import sys
from pathlib import Path

import pytest

from harness.running import devmem, estimate, ledger, memory
from harness.running.isolation import first_line
from harness.running.memory import OOM, TOO_BIG, fmt

# Memory a check leaves allocated beyond the harness's own caches, counted from this much per check.
RETAINED_MIN = 1 * memory.MIB

# What the harness keeps between the checks of one case (oracles, kept outputs): name -> (objects,
# forget). A test module with caches of its own registers them here (harness/test_backward.py); a
# second registration under a name (another pytest session in the process) replaces the first.
CACHES: dict[str, tuple] = {}


def register_cache(name: str, objects, forget) -> None:
    CACHES[name] = (objects, forget)


def cache_bytes(card=None) -> int:
    """Bytes of the device tensors the registered caches hold (each storage once): CUDA's, or the
    CPU's where ``card`` is a simulated GPU."""
    torch = sys.modules.get("torch")
    on_card = (lambda t: t.device.type == "cpu") if card is not None and card.simulated else (lambda t: t.is_cuda)
    seen: dict[int, int] = {}

    def walk(obj, depth=0):
        if depth > 6 or obj is None:
            return
        if isinstance(obj, torch.Tensor):
            if on_card(obj):
                st = obj.untyped_storage()
                seen[st.data_ptr()] = st.nbytes()
        elif isinstance(obj, dict):
            for v in obj.values():
                walk(v, depth + 1)
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                walk(v, depth + 1)
        elif hasattr(obj, "__dict__") and not isinstance(obj, type):
            for v in vars(obj).values():
                walk(v, depth + 1)

    for objects, _ in CACHES.values():
        walk(objects())
    return sum(seen.values())


def forget_caches() -> None:
    for _, forget in CACHES.values():
        forget()


class MemoryWatch:
    def __init__(self, config, state):
        self.config, self.state = config, state
        asked = config.getoption("gpu_memory")
        self.asked = memory.parse_size(asked) if asked else None
        self.worker = getattr(config, "workerinput", {}).get("workerid")
        self.dir = Path(config.workerinput["normdiff_dir"]) if self.worker else None
        self._ready = False
        self.card = None
        self.ledger: ledger.GpuLedger | None = None
        self.budget: int | None = None
        self.workers_on_gpu = 1
        self._alone: set = set()
        self._alone_mtime = None
        self._before = 0

    # -- set-up, on the first check that runs on the GPU --------------------------------------
    def _setup(self, card) -> None:
        """The card, the budget and the ledger, once per worker; ready only when all of it is
        (a step that raises leaves the worker not ready, and the next check sets up again)."""
        if self._ready:
            return
        card.track()
        free, total = card.mem_get_info()
        if self.asked:  # behave as a card of that size: every process's allocator capped at it
            card.set_per_process_memory_fraction(min(1.0, self.asked / total))
        facts = getattr(self.config, "workerinput", {}) if self.worker else {}
        token, budget = facts.get("normdiff_gpu"), facts.get("normdiff_gpu_budget")
        if self.dir and token is not None and budget is not None:
            # The controller measured the budget once and wrote the ledger before any worker began.
            self.ledger = ledger.GpuLedger(ledger.ledger_path(self.dir, token), self.worker)
            self.budget = int(budget)
            self.workers_on_gpu = max(1, int(facts.get("normdiff_workers_on_gpu", 1)))
        else:  # one process: the free memory now, its own context and cache included
            self.budget = memory.default_budget(free + card.memory_reserved() + memory.CONTEXT_BYTES, self.asked)
        self.card, self._ready = card, True

    def reset(self) -> None:
        """After a harness error: the next check sets the worker up afresh."""
        self._ready, self.card, self.ledger, self.budget = False, None, None, None

    def _held(self) -> int:
        return memory.CONTEXT_BYTES + self.card.memory_reserved()

    def _hand_back(self) -> int:
        """While waiting for memory: the allocator's unused cache goes back to the driver."""
        self.card.empty_cache()
        return self._held()

    def _must_run_alone(self, nodeid: str) -> bool:
        path = self.dir / "alone.json" if self.dir else None
        if path is None or not path.exists():
            return False
        mtime = path.stat().st_mtime
        if mtime != self._alone_mtime:
            self._alone_mtime, self._alone = mtime, set(json.loads(path.read_text() or "[]"))
        return nodeid in self._alone

    # -- the check ----------------------------------------------------------------------------
    def _subject(self, item):
        """(record, kernel, case, device) of a check of one kernel, else None."""
        rec = self.state.records.get(item.nodeid)
        if not rec or "kernel" not in rec or "needs" not in rec:  # not a check: no estimate to admit it by
            return None
        kernel = self.state.kernel_index.get((rec["kernel"], rec["op"]))
        if kernel is None:
            return None
        return rec, kernel, self.state.case_index.get(rec.get("case")), self.state.device_for(kernel)

    def estimate(self, rec, kernel, case) -> estimate.Estimate:
        peers = [k for k in self.state.all_kernels if k.family == kernel.family and k.op == kernel.op and k is not kernel]
        return estimate.check_estimate(rec["needs"], case, kernel, peers=peers)

    @pytest.hookimpl(tryfirst=True)
    def pytest_pyfunc_call(self, pyfuncitem):
        subject = self._subject(pyfuncitem)
        if subject is None:
            return None
        rec, kernel, case, device = subject
        card = devmem.card_for(device)  # None: a CUDA-only kernel without a GPU skips in its check
        gpu = card is not None
        self._before = None
        est = self.estimate(rec, kernel, case)
        fields: dict = {}
        if gpu:
            self._setup(card)
            clean = estimate.as_held(est, rec["needs"], case, kernel, 0)  # in a worker that holds no cache
            fields.update(mem_estimate=clean.total, mem_budget=self.budget)
            if clean.total + memory.CONTEXT_BYTES > self.budget:
                self._record(pyfuncitem, fields)
                pytest.skip(f"{TOO_BIG}the check needs about {fmt(clean.total)} ({clean.describe()}), more than this "
                            f"GPU's budget of {fmt(self.budget)}{' (--gpu-memory)' if self.asked else ''}")
        events: list[dict] = []
        waited = 0.0
        # The first try (alone already if its worker died of a sticky out-of-memory), then once alone.
        attempts = ["alone"] if self._must_run_alone(pyfuncitem.nodeid) else ["first try", "alone"]
        try:
            for attempt in attempts:
                if gpu:  # what the worker holds now: the cache of this case, or none
                    need = self._need(est, rec, kernel, case)
                    fields["mem_estimate"] = need.total
                waited += self._admit(fields.get("mem_estimate", est.total), attempt == "alone", gpu)
                self._start(gpu)
                try:
                    _call(pyfuncitem)
                    break
                except BaseException as exc:  # noqa: BLE001 (an out-of-memory is retried, anything else raised)
                    if not retryable_oom(exc):
                        raise
                    events.append(self._event(exc, est, kernel, attempt, gpu))
                self._free_all(gpu)  # the failed try's tensors and the case's caches go first
                if self.ledger is not None:
                    self.ledger.done(self._held())
            else:
                raise self._give_up(events)
        finally:
            if gpu and self._before is not None:
                fields.update(mem_peak=self.card.max_memory_allocated(), mem_wait_s=round(waited, 3))
            if events:
                fields["oom_events"] = events
            if fields:
                self._record(pyfuncitem, fields)
            if self.ledger is not None:
                self.ledger.done(self._held())
        return True

    def _need(self, est, rec, kernel, case) -> estimate.Estimate:
        """The check's estimate with the cache its worker holds now (estimate.as_held); one that
        would not fit beside that cache drops it first (it fits without: checked up front)."""
        need = estimate.as_held(est, rec["needs"], case, kernel, cache_bytes(self.card))
        if need.total + memory.CONTEXT_BYTES > self.budget and need.parts.get("held"):
            self._free_all(True)
            need = estimate.as_held(est, rec["needs"], case, kernel, cache_bytes(self.card))
        return need

    def _start(self, gpu: bool) -> None:
        if gpu:
            self._before = self.card.memory_allocated() - cache_bytes(self.card)
            self.card.reset_peak_memory_stats()

    def _admit(self, need: int, alone: bool, gpu: bool) -> float:
        if self.ledger is None or not gpu:
            return 0.0
        return self.ledger.admit(need, alone=alone, while_waiting=self._hand_back)

    def _event(self, exc, est, kernel, attempt: str, gpu: bool) -> dict:
        message = first_line(exc)
        asked = memory.requested_bytes(str(exc))
        event = {"attempt": attempt, "asked": asked, "estimate": est.total, "budget": self.budget,
                 "message": message[:400]}
        if gpu:
            event["allocated"] = self.card.memory_allocated()
        limit = est.total
        if asked is not None and asked > limit:
            event["over_allocation"] = (f"{kernel.name} asked for {fmt(asked)} in one allocation, more than its "
                                        f"check's whole estimate of {fmt(limit)} (workspace included)")
        return event

    def _give_up(self, events: list) -> BaseException:
        last = events[-1]
        return pytest.skip.Exception(
            f"{OOM}{last['message'][:200]} (asked {fmt(last['asked'])}, estimate {fmt(last['estimate'])}"
            + (f", budget {fmt(last['budget'])}" if last["budget"] else "")
            + "); retried alone and out of memory again: not a result of the kernel's",
            allow_module_level=False)

    def _free_all(self, gpu: bool) -> None:
        forget_caches()
        gc.collect()
        if gpu:
            self.card.empty_cache()

    @staticmethod
    def _record(item, fields: dict) -> None:
        item.user_properties.append(("normdiff", fields))

    # -- after the check ------------------------------------------------------------------------
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(self, item, nextitem):
        yield
        subject = self._subject(item) if self._ready else None
        if subject is None or devmem.card_for(subject[3]) is None:
            return
        rec = subject[0]
        nxt = self.state.records.get(nextitem.nodeid, {}) if nextitem is not None else {}
        if nxt.get("case") != rec.get("case"):
            forget_caches()  # the next check draws another case: its inputs and oracle go now
        # pytest keeps a failed check's traceback (for a post-mortem), and its frames the tensors
        sys.last_type = sys.last_value = sys.last_traceback = None
        if hasattr(sys, "last_exc"):
            sys.last_exc = None
        if self._before is None:  # skipped before it ran
            return self._update_held()
        retained = self.card.memory_allocated() - cache_bytes(self.card) - self._before
        if retained >= RETAINED_MIN:
            gc.collect()
            retained = self.card.memory_allocated() - cache_bytes(self.card) - self._before
        if retained >= RETAINED_MIN:
            item.user_properties.append(("normdiff_after", {"mem_retained": retained}))
        self._update_held()

    def _update_held(self) -> None:
        """Hand back cache beyond this worker's share of the budget, then tell the ledger what it holds."""
        keep = (self.budget or 0) // (8 * self.workers_on_gpu)
        if self.card.memory_reserved() - self.card.memory_allocated() > keep:
            self.card.empty_cache()
        if self.ledger is not None:
            self.ledger.set_held(self._held())


def addoption(group) -> None:
    group.addoption("--simulate-gpu", default=None, metavar="SIZE",
                    help="on a machine without a GPU: run the checks on the CPU while the memory layer (budget, "
                         "ledger, admission, retry alone, peaks) behaves as one GPU of SIZE (e.g. 24GiB) shared "
                         "by the run's workers")
    group.addoption("--gpu-memory", default=None, metavar="SIZE",
                    help="GPU memory the run may use per GPU, e.g. 24GiB (default: what is free when the run "
                         "starts, less a reserve); each process is capped at it too, so a larger card behaves "
                         "as one of this size")
    group.addoption("--min-check-memory", default=None, metavar="SIZE",
                    help="run only the checks estimated to need at least SIZE of GPU memory (e.g. 1GiB beside "
                         "--gpu-memory: the checks where memory decides); the others are deselected")


def configure_simulation(config) -> None:
    """``--simulate-gpu SIZE`` (the controller, or the one process, before any worker starts): this
    process and every worker it starts simulate one GPU of SIZE (harness.running.devmem)."""
    asked = config.getoption("simulate_gpu", None)
    if not asked or hasattr(config, "workerinput"):
        return
    from impls.base import cuda_present

    if cuda_present():
        raise pytest.UsageError("--simulate-gpu is for a machine without a GPU, and this one has one: "
                                "use --gpu-memory SIZE to run as a card of SIZE")
    try:
        size = memory.parse_size(asked)
    except ValueError as exc:
        raise pytest.UsageError(f"--simulate-gpu: {exc}") from exc
    if size < memory.CONTEXT_BYTES + memory.WORKER_MIN_BYTES:
        raise pytest.UsageError(f"--simulate-gpu {asked}: a card must hold at least one worker's context and "
                                f"{memory.fmt(memory.WORKER_MIN_BYTES)} besides ({memory.fmt(memory.CONTEXT_BYTES + memory.WORKER_MIN_BYTES)})")
    import tempfile

    devmem.simulate(size, Path(tempfile.mkdtemp(prefix="normdiff-simulated-gpu-")))


class Ledgers:
    """On the controller: one ledger per GPU in the workers' directory, with the budget measured
    when the run started (workers.plan_workers), and each worker told its GPU and how many share it."""

    def __init__(self, config, directory: Path):
        self.config, self.budgets = config, getattr(config, "_normdiff_gpu_budgets", {}) or {}
        for token, budget in self.budgets.items():
            ledger.GpuLedger.create(ledger.ledger_path(directory, token), budget)

    def pytest_configure_node(self, node):
        token = (node.gateway.spec.env or {}).get("CUDA_VISIBLE_DEVICES")
        if token in self.budgets:
            node.workerinput["normdiff_gpu"] = token
            node.workerinput["normdiff_gpu_budget"] = self.budgets[token]
            specs = self.config.option.tx or []
            node.workerinput["normdiff_workers_on_gpu"] = sum(1 for s in specs if s.endswith(f"={token}")) or 1


def retry_alone(controller, worker: str, crashitem: str) -> bool:
    """On the controller: a worker died of a sticky out-of-memory in ``crashitem``. The first time,
    the check goes back to the queue to run alone on its GPU (a worker reads alone.json) and the
    event is recorded; the second time it is charged, as *out of memory* (Controller.pytest_handlecrashitem)."""
    note = controller.note(worker)
    if note.get("nodeid") != crashitem or not memory.is_oom_text(note.get("fatal")):
        return False
    if crashitem in controller.oom_retried:
        return False
    controller.oom_retried.add(crashitem)
    tmp = controller.dir / "alone.json.tmp"
    tmp.write_text(json.dumps(sorted(controller.oom_retried)))
    os.replace(tmp, controller.dir / "alone.json")
    controller.state.records.setdefault(crashitem, {}).setdefault("oom_events", []).append(
        memory.sticky_oom_event("first try (sticky: the worker's CUDA context was lost)", note["fatal"], worker))
    return True


def deselect_below(state, items) -> None:
    """``--min-check-memory``: only the checks whose estimate reaches it stay selected."""
    floor = state.config.getoption("min_check_memory")
    if not floor:
        return
    floor = memory.parse_size(floor)
    kernels, cases = state.kernel_index, state.case_index

    def below(item) -> bool:
        rec = state.records.get(item.nodeid)
        kernel = rec and "needs" in rec and kernels.get((rec["kernel"], rec["op"]))
        if not kernel:
            return True
        peers = [k for k in state.all_kernels if k.family == kernel.family and k.op == kernel.op and k is not kernel]
        return estimate.check_estimate(rec["needs"], cases.get(rec.get("case")), kernel, peers=peers).total < floor

    marked = {i.nodeid: below(i) for i in items}
    drop = [i for i in items if marked[i.nodeid]]
    if drop:
        state.config.hook.pytest_deselected(items=drop)
        items[:] = [i for i in items if not marked[i.nodeid]]


def retryable_oom(exc: BaseException) -> bool:
    """An out-of-memory (pytest's own outcomes never are one), which a check retries alone and a
    benchmark skips with its reason (harness.bench)."""
    if isinstance(exc, (pytest.skip.Exception, pytest.fail.Exception, pytest.xfail.Exception)):
        return False
    return memory.is_oom(exc)


def _call(pyfuncitem) -> None:
    """The test function with its fixtures, as pytest's own pytest_pyfunc_call calls it."""
    funcargs = pyfuncitem.funcargs
    testargs = {arg: funcargs[arg] for arg in pyfuncitem._fixtureinfo.argnames}  # noqa: SLF001
    pyfuncitem.obj(**testargs)
