"""GPU memory without a GPU: the estimate against measured allocations (the quick catalogue, on
the CPU) and against its stated formula (the full catalogue), admission of checks against one
budget by workers sharing a GPU, the out-of-memory retry and skip through outside backends that
raise it, and the report's failure groups."""
import os
import threading
import time
import weakref
from pathlib import Path

import pytest

from tests.check_needs import need_of
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from harness.judging import properties, runner
from harness.running import estimate, memory
from harness.judging.cases import backward_catalogue, catalogue
from harness.running.ledger import GpuLedger, ledger_path
from harness.running.memory import GIB, MIB
from harness.report import build_document, render_markdown
from harness.report import memory as report_memory
from impls import registry

ROOT = Path(__file__).resolve().parents[1]


class LiveBytes(TorchDispatchMode):
    """The peak of the bytes held by CPU storages that torch operators made while it was active:
    each storage counted once, from the first tensor on it until the last is gone."""

    def __init__(self):
        super().__init__()
        self.refs, self.size, self.live, self.peak = {}, {}, 0, 0

    def _drop(self, key):
        self.refs[key] -= 1
        if not self.refs[key]:
            self.live -= self.size.pop(key)
            del self.refs[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                st = t.untyped_storage()
                key = st.data_ptr()
                if key not in self.refs:
                    self.refs[key], self.size[key] = 0, st.nbytes()
                    self.live += st.nbytes()
                    self.peak = max(self.peak, self.live)
                self.refs[key] += 1
                weakref.finalize(t, self._drop, key)
        return out


def eager(op):
    registry.load_builtins()
    return next(k for k in registry.kernels(["torch"]) if k.op == op)


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_estimate_covers_measured_allocations(op):
    """The quick catalogue's largest cases (where the per-element terms decide) and its smallest
    (where the fixed part does), forward and backward, and the determinism and batch-invariance
    checks, each check's allocations measured."""
    k = eager(op)
    by_size = sorted((c for c in catalogue("quick") if c.op == op), key=lambda c: c.rows * c.n)
    bwd = sorted((c for c in backward_catalogue("quick") if c.op == op), key=lambda c: c.rows * c.n)
    plan = [("test_against_oracle", c) for c in by_size[-6:] + by_size[:2]]
    plan += [("test_backward", c) for c in bwd[-4:] + bwd[:1]]
    plan += [("test_deterministic", c) for c in by_size[-2:]] + [("test_backward_deterministic", bwd[-1])]
    plan += [("test_batch_invariant", c) for c in properties.batch_cases("quick") if c.op == op][:1]
    calls = {"test_backward": lambda c: runner.check_backward(k, c, keep_outputs=True),
             "test_against_oracle": lambda c: runner.check(k, c, keep_outputs=True),
             "test_deterministic": lambda c: properties.determinism(k, c, "cpu"),
             "test_backward_deterministic": lambda c: properties.backward_determinism(k, c, "cpu"),
             "test_batch_invariant": lambda c: properties.batch_invariance(k, c, "cpu", quick=True)}
    for test, case in plan:
        live = LiveBytes()
        with live:
            calls[test](case)
        est = estimate.check_estimate(need_of(test), case, k)
        assert live.peak <= est.total, f"{test} {case.id}: measured {live.peak} > estimate {est.total} ({est.describe()})"
        own = est.total - est.parts["worker"]  # the worker's own buffers are no allocation of the check's
        assert own < 8 * live.peak + 2 * MIB, f"{test} {case.id}: estimate {own} far above {live.peak} ({est.describe()})"


def formula(test, case, peers_kept: int) -> int:
    """ESTIMATE_DOC, written out again: the forward and backward oracle checks of an eager kernel
    (statistics in float32) beside peers of rounding "once"."""
    b, n, r = case.torch_dtype.itemsize, case.n, case.rows
    e, s = r * n, r * (n + case.row_pad)
    back = test == "test_backward"
    x, outputs, workspace = s * b + 2 * n * b, r * (n + 16) * b + 8 * r, e * b + 2 * 4 * e + 8 * r
    whole = e <= runner.ORACLE_WHOLE_ELEMENTS
    chunk = e if whole else (runner.ORACLE_CHUNK_ELEMENTS // n) * n
    work = 10 * 8 * chunk + (0 if whole else 8 * chunk + 16 * (chunk // n))
    own = 32 * MIB + x + outputs + workspace + work + ((e * b + 8 * r) + (s * b + 8 * r) if back else 0)
    if not whole:
        return own + x
    if back:
        cache = (x + 8 * e + 16 * r + s * b + 8 * e * (3 + case.has_weight) + 16 * n + 16 * r
                 + (16 * e + 32 * n) + peers_kept * (outputs + 16 * n))
    else:
        cache = x + 8 * e + 16 * r + 8 * e + 16 * r + peers_kept * outputs
    return own + cache


def test_estimate_is_the_stated_formula_on_the_full_catalogue():
    k = eager("rms_norm")
    peers = [eager("rms_norm")] * 3  # rounding "once": their outputs only
    for test, cases in (("test_against_oracle", catalogue("full")), ("test_backward", backward_catalogue("full"))):
        for c in (c for c in cases if c.op == "rms_norm"):
            got = estimate.check_estimate(need_of(test), c, k, peers=peers).total
            assert got == formula(test, c, len(peers)), (test, c.id)
    # Beyond 2**31 elements a project kernel's check fits a 24 GiB card (x, its snapshot and y,
    # judged in chunks); an eager one's upcasts do not.
    registry.load_builtins()
    project = next(k for k in registry.kernels(["triton"]) if k.op == "rms_norm")
    huge = next(c for c in catalogue("full") if c.rows * c.n >= 2**31 and c.op == "rms_norm" and c.dtype == "bfloat16")
    assert estimate.check_estimate(need_of("test_against_oracle"), huge, project).total < memory.default_budget(0, 24 * GIB)
    assert estimate.check_estimate(need_of("test_against_oracle"), huge, k).total > 24 * GIB


def test_sizes_and_messages():
    assert memory.parse_size("24GiB") == 24 * GIB and memory.parse_size("40GB") == 40 * 10**9
    assert memory.parse_size("512 MiB") == 512 * MIB and memory.parse_size("1000") == 1000
    for bad in ("24 parsecs", "", "-3GiB", "0"):
        with pytest.raises(ValueError, match="memory size"):
            memory.parse_size(bad)
    msg = "CUDA out of memory. Tried to allocate 2.50 GiB. GPU 0 has a total capacity of 79.19 GiB"
    assert memory.requested_bytes(msg) == int(2.5 * GIB)
    assert memory.is_oom(torch.OutOfMemoryError(msg)) and memory.is_oom(RuntimeError("CUDA error: out of memory"))
    wrapped = RuntimeError("launch failed")
    wrapped.__cause__ = torch.OutOfMemoryError(msg)
    assert memory.is_oom(wrapped) and not memory.is_oom(RuntimeError("illegal memory access"))
    assert memory.default_budget(80 * GIB, None) == 76 * GIB
    assert memory.default_budget(80 * GIB, 24 * GIB) == 24 * GIB - int(0.05 * 24 * GIB)
    assert memory.workers_for(22 * GIB, 16) == 13 and memory.workers_for(100 * GIB, 16) == 16


def test_budget_from_a_fake_card(monkeypatch):
    monkeypatch.setenv(memory.FAKE_MEMORY_ENV, "70GiB,80GiB")
    assert memory.gpu_budgets(None, ["0", "1"]) == {"0": 70 * GIB - int(3.5 * GIB), "1": 66.5 * GIB}
    assert memory.gpu_budgets("24GiB", ["0"]) == {"0": 24 * GIB - int(0.05 * 24 * GIB)}
    with pytest.raises(pytest.UsageError, match="more than GPU 0"):
        memory.gpu_budgets("100GiB", ["0"])
    with pytest.raises(pytest.UsageError, match="--gpu-memory: not a memory size"):
        memory.gpu_budgets("lots", ["0"])


def test_admission_keeps_workers_within_one_budget(tmp_path):
    """Four workers, a 10 GiB budget, checks of 1-7 GiB and one of 12 (larger than the budget):
    at no time do running checks hold more than the budget, except the large one, alone; every
    check runs; a retry alone waits for the others and runs alone."""
    path = tmp_path / "gpu0.ledger.json"
    GpuLedger.create(path, 10 * GIB)
    log, lock = [], threading.Lock()
    running: dict = {}

    def worker(name, needs, alone_at=None):
        ledger = GpuLedger(path, name)
        for i, need in enumerate(needs):
            alone = i == alone_at
            ledger.admit(need * GIB, alone=alone)
            with lock:
                running[name] = (need * GIB, alone)
                log.append(dict(running))
            time.sleep(0.03)
            with lock:
                running.pop(name)
            ledger.done(memory.CONTEXT_BYTES)

    jobs = {"w0": [1, 7, 2, 12, 1], "w1": [3, 3, 3, 3], "w2": [5, 1, 1, 6], "w3": [2, 2, 4, 2, 2]}
    threads = [threading.Thread(target=worker, args=(n, v, 2 if n == "w1" else None)) for n, v in jobs.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "admission deadlocked"
    assert len(log) == sum(len(v) for v in jobs.values())
    for snap in log:
        held = sum(need + memory.CONTEXT_BYTES for need, _ in snap.values())
        if any(need > 10 * GIB or alone for need, alone in snap.values()):
            assert len(snap) == 1, snap  # the largest check, and a retry alone, run with nothing else
        else:
            assert held <= 10 * GIB, snap


def test_a_dead_workers_entry_is_dropped(tmp_path):
    path = tmp_path / "gpu0.ledger.json"
    GpuLedger.create(path, 4 * GIB)
    ledger = GpuLedger(path, "gw1")
    with ledger._locked() as st:  # noqa: SLF001 (a worker killed while holding a check)
        st["workers"]["gw0"] = {"held": 3 * GIB, "need": 3 * GIB, "ticket": None, "alone": False, "pid": 2**22 + 7}
    start = time.monotonic()
    ledger.admit(3 * GIB)
    assert time.monotonic() - start < 5 and "gw0" not in ledger.snapshot()["workers"]


def test_out_of_memory_is_retried_alone_and_never_a_failure(tmp_path):
    """Outside backends raise out-of-memory: once (the retry alone passes), always (out of memory,
    with the over-allocation named), and as a sticky error that kills the worker (run again
    alone in a new worker: passes; or out of memory again: counted apart, not failed)."""
    import json
    import subprocess
    import sys

    markers = tmp_path / "markers"
    markers.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OOM_MARKERS": str(markers)}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "harness/test_differential.py", "-n", "2",
         "--backend", "oom_*", "--backend-file", str(ROOT / "tests" / "plugins" / "oom_backends.py"),
         "--op", "rms_norm", "--dtype", "bfloat16", "--profile", "quick", "-k", "769",
         f"--report-dir={tmp_path / 'report'}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    doc = json.loads((tmp_path / "report" / "correctness.json").read_text())
    recs = {r["nodeid"].split("[")[1].rstrip("]"): r for r in doc["records"]}
    once = recs["rms_norm-bfloat16-17x769-normal-oom_once.v1"]
    assert once["outcome"] == "passed" and [e["attempt"] for e in once["oom_events"]] == ["first try"]
    always = recs["rms_norm-bfloat16-3x769-normal-oom_always.v1"]
    assert always["outcome"] == "out of memory" and len(always["oom_events"]) == 2
    assert "oom_always.v1 asked for 64.00 GiB" in always["oom_events"][0]["over_allocation"]
    sticky = recs["rms_norm-bfloat16-1x769-normal-oom_sticky.v1"]
    assert sticky["outcome"] == "passed" and "sticky" in sticky["oom_events"][0]["attempt"]
    sticky_always = recs["rms_norm-bfloat16-1025x769-normal-oom_sticky_always.v1"]
    assert sticky_always["outcome"] == "out of memory" and len(sticky_always["oom_events"]) == 2
    assert sum(r["outcome"] == "failed" for r in doc["records"]) == 0
    assert sum(r["outcome"] == "passed" for r in doc["records"]) >= 8
    md = (tmp_path / "report" / "correctness.md").read_text()
    assert "2 out of memory" in md and "**Over-allocation**" in md and "oom_always.v1" in md


def test_failures_are_grouped_by_cause():
    recs = []
    for i in range(783):
        k = f"b{i % 5}.v"
        recs.append({"nodeid": f"harness/t.py::test_x[c{i}-{k}]", "kernel": k, "case": f"rms_norm-float32-{i}x{i + 7}-normal",
                     "outcome": "out of memory", "oom_events": [{"message": f"CUDA out of memory. Tried to allocate "
                                                                           f"{i}.50 GiB. GPU {i % 2} has 79.19 GiB"}]})
    for i in range(3):
        recs.append({"nodeid": f"harness/t.py::test_y[{i}]", "kernel": "tl.v", "case": f"layer_norm-bfloat16-{i}x129-normal",
                     "outcome": "failed", "errors": [{"output": "y", "mismatched": i + 1, "numel": 129, "max_abs": 0.1,
                                                      "max_ulp": 9.0, "rel_l2": 0.01, "worst_ratio": 3.0,
                                                      "worst_index": [0, 1], "worst_out": 1.0, "worst_ref": 0.9}]})
    recs.append({"nodeid": "harness/t.py::test_z[0]", "kernel": "tl.v", "outcome": "failed", "failure_kind": "crashed",
                 "crash": {"detail": "Segmentation fault"}})
    gs = report_memory.groups(recs)
    assert [g["count"] for g in gs] == [783, 3, 1]
    assert gs[0]["kind"] == "out of memory" and len(gs[0]["kernels"]) == 5 and len(gs[0]["examples"]) == 3
    assert gs[1]["signature"] == "out of tolerance: y"
    doc = build_document(records={r.pop("nodeid"): r for r in [dict(r) for r in recs]}, agreement={}, backends={},
                         selection={"profile": "full"}, environment={}, command="pytest", elapsed=1.0)
    assert doc["failure_groups"][0]["count"] == 783
    md = render_markdown(doc)
    assert md.count("CUDA out of memory. Tried to allocate <n> GiB") == 1  # one group, not 783 lines
    assert "test_y[2]" in md  # every failure stays below the groups


class FakeCuda:
    """The torch.cuda calls MemoryWatch makes, on a pretend 80 GiB card whose allocator a test drives."""

    def __init__(self, monkeypatch, free=70 * GIB, total=80 * GIB):
        self.free, self.total, self.allocated, self.reserved, self.peak, self.fraction = free, total, 0, 0, 0, None
        for name in ("mem_get_info", "memory_reserved", "memory_allocated", "max_memory_allocated",
                     "reset_peak_memory_stats", "empty_cache", "set_per_process_memory_fraction", "is_available"):
            monkeypatch.setattr(torch.cuda, name, getattr(self, name))

    def mem_get_info(self, device=None):
        return self.free, self.total

    def memory_reserved(self):
        return self.reserved

    def memory_allocated(self):
        return self.allocated

    def max_memory_allocated(self):
        return self.peak

    def reset_peak_memory_stats(self):
        self.peak = self.allocated

    def empty_cache(self):
        self.reserved = self.allocated

    def set_per_process_memory_fraction(self, fraction):
        self.fraction = fraction

    def is_available(self):
        return True

    def alloc(self, n):
        self.allocated += n
        self.reserved = max(self.reserved, self.allocated)
        self.peak = max(self.peak, self.allocated)


def gpu_watch(tmp_path, fake, asked=None, budget=20 * GIB):
    """A MemoryWatch as an xdist worker of one GPU has it, over a one-case state."""
    from types import SimpleNamespace

    from harness.running.memory_watch import MemoryWatch

    case = next(c for c in catalogue("quick") if c.op == "rms_norm" and c.shape == (1025, 769))
    registry.load_builtins()
    kernel = next(k for k in registry.kernels(["triton"]) if k.op == "rms_norm")
    GpuLedger.create(ledger_path(tmp_path, "0"), budget)
    config = SimpleNamespace(workerinput={"workerid": "gw0", "normdiff_dir": str(tmp_path), "normdiff_gpu": "0",
                                          "normdiff_workers_on_gpu": 2, "normdiff_gpu_budget": budget},
                             getoption=lambda name: asked if name == "gpu_memory" else None)
    records = {"t::a": {"test": "test_against_oracle", "needs": "oracle", "kernel": kernel.name, "op": "rms_norm",
                        "case": case.id}}
    state = SimpleNamespace(records=records, all_kernels=[kernel], kernel_index={(kernel.name, "rms_norm"): kernel},
                            case_index={case.id: case}, device_for=lambda k: "cuda")
    return MemoryWatch(config, state), case, kernel


def fake_item(nodeid, body):
    from types import SimpleNamespace

    return SimpleNamespace(nodeid=nodeid, obj=body, funcargs={}, _fixtureinfo=SimpleNamespace(argnames=()),
                           user_properties=[])


def test_on_a_gpu_a_check_is_admitted_measured_and_retried_alone(tmp_path, monkeypatch):
    """MemoryWatch's GPU path on a pretend card: the estimate and budget recorded, the peak
    measured, an out-of-memory retried once alone (passing), the ledger holding the worker's
    context and cache after the check, a leak counted, --gpu-memory capping the process."""
    fake = FakeCuda(monkeypatch)
    watch, case, kernel = gpu_watch(tmp_path, fake, asked="24GiB")
    tries = []

    def body():
        tries.append(1)
        fake.alloc(3 * MIB)
        if len(tries) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB. (pretend)")

    item = fake_item("t::a", body)
    assert watch.pytest_pyfunc_call(item) is True and len(tries) == 2
    fields = {k: v for name, f in item.user_properties if name == "normdiff" for k, v in f.items()}
    assert fields["mem_budget"] == 20 * GIB and fields["mem_estimate"] > 0 and fields["mem_peak"] >= 3 * MIB
    assert [e["attempt"] for e in fields["oom_events"]] == ["first try"] and fields["oom_events"][0]["asked"] == GIB
    assert fake.fraction == pytest.approx(24 / 80)
    me = watch.ledger.snapshot()["workers"]["gw0"]
    assert me["need"] == 0 and me["held"] == memory.CONTEXT_BYTES + fake.reserved

    # After the check: what the try that counted left allocated beyond the harness's caches (the
    # pretend allocator frees nothing: 3 MiB) is recorded as kept.
    gen = watch.pytest_runtest_teardown(item, None)
    next(gen)
    with pytest.raises(StopIteration):
        next(gen)
    kept = {k: v for name, f in item.user_properties if name == "normdiff_after" for k, v in f.items()}
    assert kept["mem_retained"] == 3 * MIB


def test_on_a_gpu_a_check_beyond_the_budget_is_skipped_up_front(tmp_path, monkeypatch):
    fake = FakeCuda(monkeypatch)
    watch, case, kernel = gpu_watch(tmp_path, fake, budget=64 * MIB)
    item = fake_item("t::a", lambda: pytest.fail("must not run"))
    with pytest.raises(pytest.skip.Exception, match="out of memory, not run: the check needs about"):
        watch.pytest_pyfunc_call(item)


def test_on_a_gpu_a_check_out_of_memory_alone_too_is_counted_apart(tmp_path, monkeypatch):
    fake = FakeCuda(monkeypatch)
    watch, case, kernel = gpu_watch(tmp_path, fake)

    def body():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 90.00 GiB. (pretend)")

    item = fake_item("t::a", body)
    with pytest.raises(pytest.skip.Exception, match="out of memory: .*retried alone and out of memory again"):
        watch.pytest_pyfunc_call(item)
    fields = {k: v for name, f in item.user_properties if name == "normdiff" for k, v in f.items()}
    assert [e["attempt"] for e in fields["oom_events"]] == ["first try", "alone"]
    assert "asked for 90.00 GiB" in fields["oom_events"][0]["over_allocation"]
    assert watch.ledger.snapshot()["workers"]["gw0"]["need"] == 0  # the ledger is left clean
