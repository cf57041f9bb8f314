"""The native call path (impls.native): the extension builds against this torch; on a GPU, a
signature's third call replays the recorded launches from C++ with the validated call's bits, fills
in each call's own tensors and eps, and never serves what validation refuses."""
import pytest
import torch

from impls import callpath, native, registry
from impls.base import NormInputError

registry.load_all()

GPU = torch.cuda.is_available()
needs_gpu = pytest.mark.skipif(not GPU, reason="needs a CUDA GPU: the native path replays CUDA launches")


def test_extension_builds():
    """Compiles here too (no driver needed to build); without one it says so instead of loading."""
    mod = native._build()
    assert hasattr(mod, "PlanTable") and hasattr(mod, "read_graph")
    if not GPU:
        assert "libcuda" in mod.driver_error() or mod.driver_error() == ""


def test_a_build_lock_left_by_a_dead_process_is_removed(tmp_path):
    """torch waits for as long as a build's lock file exists; one left by a process that died
    mid-build is removed once stale, and a live build's lock is waited for."""
    import os
    import threading
    import time

    lock = tmp_path / "lock"
    lock.touch()
    old = time.time() - 2 * native.STALE_LOCK_S
    os.utime(lock, (old, old))
    native._wait_for_lock(lock)
    assert not lock.exists()
    lock.touch()  # a live build's: waited for until it goes
    threading.Timer(0.3, lock.unlink).start()
    t0 = time.perf_counter()
    native._wait_for_lock(lock, poll_s=0.05)
    assert 0.25 < time.perf_counter() - t0 < native.STALE_LOCK_S


def test_a_process_waits_for_its_build_at_exit(tmp_path):
    """The build runs in a daemon thread; a process that exits meanwhile waits for it, so torch's
    build lock is released rather than left behind for every later build to wait on."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    marker = tmp_path / "built"
    script = (
        "import sys, time, pathlib\n"
        "from impls import native\n"
        "def build():\n"
        "    time.sleep(1.5)\n"
        "    pathlib.Path(sys.argv[1]).write_text('done')\n"
        "    raise RuntimeError('a stand-in build')\n"
        "native._build = build\n"
        "native.module()\n"  # starts the build thread, then the process exits
    )
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "NORMDIFF_NATIVE"}
    proc = subprocess.run([sys.executable, "-c", script, str(marker)], cwd=root, env={**env, "PYTHONPATH": str(root)},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert marker.exists(), "the process exited before its build finished"


def test_off_on_cpu_tensors():
    """CPU calls never record (nothing to replay) and keep working."""
    k = registry.get("rms_norm", "torch", "eager")
    x = torch.randn(4, 64)
    for _ in range(3):
        k(x, None, None, 1e-6)
    assert not callpath.state(k)["native"]


def _project_kernels():
    return [k for k in registry.kernels() if k.project and k.unavailable() is None and "cuda" in k.devices]


def _inputs(op, m, n, dtype, weight=True, bias=True, pad=0, shift=0):
    base = torch.randn(m * (n + pad) + shift, device="cuda", dtype=dtype)
    x = base[shift:].view(m, n + pad)[:, :n]
    w = torch.randn(n, device="cuda", dtype=dtype) if weight else None
    b = torch.randn(n, device="cuda", dtype=dtype) if bias and op == "layer_norm" else None
    return x, w, b


def _bits_equal(a, b):
    for name in ("y", "mean", "rstd"):
        ta, tb = getattr(a, name), getattr(b, name)
        assert (ta is None) == (tb is None), name
        if ta is not None:
            assert torch.equal(ta.view(torch.int16 if ta.element_size() == 2 else torch.int32),
                               tb.view(torch.int16 if tb.element_size() == 2 else torch.int32)), name


SIGNATURES = [  # (m, n, dtype, weight, bias, row padding, misalignment in elements)
    (64, 4096, torch.bfloat16, True, True, 0, 0),
    (1, 4096, torch.bfloat16, True, True, 0, 0),
    (7, 1000, torch.float32, False, False, 0, 0),
    (33, 2048, torch.float16, True, False, 24, 0),
    (5, 4000, torch.bfloat16, True, True, 0, 3),
]


@needs_gpu
@pytest.mark.parametrize("sig", SIGNATURES, ids=lambda s: f"{s[0]}x{s[1]}-{str(s[2])[6:]}-w{int(s[3])}b{int(s[4])}-pad{s[5]}-shift{s[6]}")
def test_replay_gives_validated_bits(sig):
    """Per project kernel: validated (outputs given), Python fast path (records), native; the
    native call's bits are the validated call's, on fresh inputs each time (pointers filled in),
    and with another eps (eps filled in). A refusal must name its reason."""
    assert native.wait(600) is not None, native.status()
    m, n, dtype, weight, bias, pad, shift = sig
    ran = []
    for k in _project_kernels():
        if k.dtypes and dtype not in k.dtypes:
            continue
        x, w, b = _inputs(k.op, m, n, dtype, weight, bias, pad, shift)
        from impls.base import spec_of
        if k.unsupported(spec_of(k.op, x, "cuda", w, b)):
            continue
        k(x, w, b, 1e-5)
        k(x, w, b, 1e-5)  # the plan's first run: records
        for eps in (1e-5, 1e-3):
            x, w, b = _inputs(k.op, m, n, dtype, weight, bias, pad, shift)
            want = k(x, w, b, eps, out=k.allocate(x))
            got = k(x, w, b, eps)
            torch.cuda.synchronize()
            assert type(got) is type(want)
            _bits_equal(want, got)
        table = callpath.native_table(k)
        ran.append((k.name, k.op, "native" if table is not None and len(table) else native.refusals().get(k.name)))
    print(ran)
    for name, op, how in ran:
        assert how, f"{name} ({op}) neither replayed natively nor said why"


@needs_gpu
def test_main_entry_points_replay():
    """The calls issue 20's targets are on take the native path at the decode and bandwidth shapes."""
    import impls.triton as triton_api

    assert native.wait(600) is not None, native.status()
    for m, n in ((1, 4096), (64, 4096), (65536, 1024)):
        for op in ("rms_norm", "layer_norm"):
            x, w, b = _inputs(op, m, n, torch.bfloat16)
            call = (lambda: triton_api.rms_norm(x, w, 1e-6)) if op == "rms_norm" else (lambda: triton_api.layer_norm(x, w, b, 1e-5))
            for _ in range(3):
                call()
            kernel = triton_api.dispatch._variant(op, "auto")
            assert callpath.state(kernel)["native"], native.refusals().get(kernel.name)
    for variant in ("fragment", "naive_row_per_block", "splitk"):
        k = registry.get("rms_norm", "tilelang", variant)
        x, w, _ = _inputs("rms_norm", 64, 4096, torch.bfloat16)
        for _ in range(3):
            k(x, w, None, 1e-6)
        assert callpath.state(k)["native"], (variant, native.refusals().get(k.name))


@needs_gpu
def test_warm_native_refuses_bad_eps_and_other_signatures():
    assert native.wait(600) is not None, native.status()
    k = registry.get("rms_norm", "triton", "auto")
    x, w, _ = _inputs("rms_norm", 8, 4096, torch.bfloat16)
    for _ in range(3):
        k(x, w, None, 1e-6)
    assert callpath.state(k)["native"], native.refusals().get(k.name)
    for eps, pattern in ((-1.0, "eps must be finite"), (float("nan"), "eps must be finite"), ("1e-5", "eps must be a number")):
        with pytest.raises(NormInputError, match=pattern):
            k(x, w, None, eps)
    with pytest.raises(NormInputError, match="weight has dtype float16"):
        k(x, w.half(), None, 1e-6)
    with pytest.raises(NormInputError, match="weight has shape"):
        k(x, torch.ones(4095, device="cuda", dtype=torch.bfloat16), None, 1e-6)


@needs_gpu
@pytest.mark.parametrize("op,variant", [("rms_norm", "cluster"), ("layer_norm", "layer_norm_cluster")])
def test_cluster_launches_are_refused_not_replayed(op, variant):
    """A thread-block-cluster launch loses its cluster shape under cuLaunchKernel (replayed so
    it faulted with an illegal instruction on the H200): it is refused, and the calls stay right."""
    assert native.wait(600) is not None, native.status()
    k = registry.get(op, "tilelang", variant)
    if k.unavailable():
        pytest.skip(k.unavailable())
    x, w, b = _inputs(op, 4, 65536, torch.bfloat16)
    want = k(x, w, b, 1e-5, out=k.allocate(x))
    for _ in range(3):
        got = k(x, w, b, 1e-5)
    torch.cuda.synchronize()
    _bits_equal(want, got)
    assert "cluster" in native.refusals().get(k.name, ""), native.refusals()
