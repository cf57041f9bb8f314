"""The peer plug-ins QuACK and FlashInfer (examples/quack_backend.py, examples/flashinfer_backend.py):
they load through --backend-file, every kernel declares what the harness reads, each is skipped with
an install hint where its library is missing, their limits are refused with their reasons, and
(with stand-ins for the libraries that keep the entry points' signatures and contracts) they pass
what each library requires, unpack what it returns and match the oracle. On a GPU with the
libraries, each declared limit runs: just inside it matches the float64 oracle, just outside it is
refused with the declared reason (or, for a declared known issue, fails as declared)."""
import importlib.util
import inspect
import math
import re
import sys
import types
from pathlib import Path

import pytest
import torch

from harness.judging import runner
from harness.judging.cases import Case, case_from_id
from harness.judging.inputs import make_inputs
from impls import registry
from impls.base import NormGrads, NormKernel, NormOutputs, NormSpec, OptionalImport
from impls.reference import reference, reference_backward
from tests.test_peers import harness

ROOT = Path(__file__).resolve().parents[1]
FILES = {"quack": ROOT / "examples" / "quack_backend.py", "flashinfer": ROOT / "examples" / "flashinfer_backend.py"}
LIBRARY = {"quack": "quack", "flashinfer": "flashinfer"}
KERNELS = {"quack": {(op, v) for op in ("rms_norm", "layer_norm") for v in ("default", "tuned")},
           "flashinfer": {("rms_norm", "default"), ("layer_norm", "default")}}
HINT = {"quack": "quack not importable: pip install quack-kernels==0.6.5 nvidia-cutlass-dsl==4.7.1",
        "flashinfer": "flashinfer not importable: pip install flashinfer-python==0.7.2.post1 nvidia-cutlass-dsl==4.7.1"}


def plugin(backend: str):
    """The plug-in module, loaded once per process the way --backend-file loads it."""
    registry.load_file(FILES[backend])
    return sys.modules[f"normdiff_plugin_{FILES[backend].stem}"]


def spec(op="rms_norm", n=4000, rows=8, device="cuda", dtype=torch.bfloat16, weight=True, bias=None, stride=None):
    return NormSpec(op=op, dtype=dtype, rows=rows, n=n, row_stride=stride or n, device=device, has_weight=weight,
                    has_bias=(op == "layer_norm" and weight) if bias is None else bias)


def kernels(backend: str):
    plugin(backend)
    return registry.kernels([backend])


# -- loading and declarations ---------------------------------------------------------------------
@pytest.mark.parametrize("backend", sorted(FILES))
def test_plugin_loads_through_backend_file_and_registers_its_kernels(backend):
    assert not any(backend in m for m in registry.BUILTIN_MODULES)
    assert {(k.op, k.variant) for k in kernels(backend)} == KERNELS[backend]


@pytest.mark.parametrize("backend", sorted(FILES))
def test_every_kernel_declares_what_the_harness_reads(backend):
    for k in kernels(backend):
        assert k.devices == ("cuda",) and k.rounding == "once" and not k.project
        assert k.outputs[0] == "y" and set(k.outputs) <= {"y", "mean", "rstd"}
        assert k.dtypes and set(k.dtypes) <= {torch.float32, torch.float16, torch.bfloat16}
        assert k.packages[0] in ("quack-kernels", "flashinfer-python") and "nvidia-cutlass-dsl" in k.packages
        assert k.call_name.startswith(f"{LIBRARY[backend]}.")
        assert "written for" in k.note()
        s = spec(k.op, dtype=k.dtypes[-1])
        key = k.compile_key(s)
        hash(key)  # a compile key is hashable
        assert key is not None and key != k.compile_key(spec(k.op, n=4096, dtype=k.dtypes[-1]))
        assert k.workspace_bytes(s) >= s.rows * s.n * 2  # at least its own y
        assert type(k).prepare is not NormKernel.prepare and type(k)._call is not NormKernel._call
    quack_backward = {(k.op, k.variant): k.has_backward for k in kernels("quack")}
    assert quack_backward == {("rms_norm", "default"): True, ("layer_norm", "default"): True,
                              ("rms_norm", "tuned"): False, ("layer_norm", "tuned"): False}
    assert not any(k.has_backward for k in kernels("flashinfer"))


def test_versions_agree_between_plugins_pack_script_and_docs():
    pack = (ROOT / "tools" / "pack_peer_wheels.sh").read_text()
    docs = (ROOT / "docs" / "backends.md").read_text()
    quack, flashinfer = plugin("quack"), plugin("flashinfer")
    pins = {"quack-kernels": quack.QUACK_VERSION, "flashinfer-python": flashinfer.FLASHINFER_VERSION,
            "nvidia-cutlass-dsl": quack.CUTLASS_DSL_VERSION, "apache-tvm-ffi": "0.1.12"}
    assert flashinfer.CUTLASS_DSL_VERSION == pins["nvidia-cutlass-dsl"]
    for name, version in pins.items():
        assert f"{name}=={version}" in pack and f"{name}=={version}" in docs, name


# -- without the library ---------------------------------------------------------------------------
@pytest.mark.parametrize("backend", sorted(FILES))
def test_each_kernel_is_skipped_with_an_install_hint_without_the_library(monkeypatch, backend):
    module = plugin(backend)
    name = "QUACK" if backend == "quack" else "FLASHINFER"
    old = getattr(module, name)
    for blocked in (LIBRARY[backend], *old.names):  # as on a machine without it, imported here or not
        monkeypatch.setitem(sys.modules, blocked, None)
    monkeypatch.setattr(module, name, OptionalImport(*old.names, missing=old.missing))
    for k in kernels(backend):
        assert k.unavailable().startswith(HINT[backend]) and "docs/backends.md" in k.unavailable()
        assert k.unsupported(spec(k.op, dtype=k.dtypes[-1])) == k.unavailable()
        result = runner.check(k, Case(op=k.op, dtype="bfloat16", shape=(3, 1000)))
        assert result.skipped == k.unavailable()


def test_doctor_reports_each_named_plugin(monkeypatch):
    """``python -m harness.doctor --backend-file ...``: each peer's state, why not and how to load it."""
    from harness import doctor

    for backend in FILES:
        module = plugin(backend)
        name = "QUACK" if backend == "quack" else "FLASHINFER"
        old = getattr(module, name)
        for blocked in (LIBRARY[backend], *old.names):
            monkeypatch.setitem(sys.modules, blocked, None)
        monkeypatch.setattr(module, name, OptionalImport(*old.names, missing=old.missing))
    rows = {r["backend"]: r for r in doctor.backends([str(f) for f in FILES.values()])}
    for backend, path in FILES.items():
        row = rows[backend]
        # the doctor counts the backend's kernels of every family (its fused ones too)
        assert row["runs"] == "no" and row["kernels"] == len(registry.kernels([backend], family=None)) > len(KERNELS[backend])
        assert row["why_not"] == [plugin(backend).availability()] and row["why_not"][0].startswith(HINT[backend])
        assert row["load"] == f"--backend-file {path.relative_to(ROOT)} --backend {backend}"
        assert "written for" in row["how"]
    text = doctor.render(doctor.machine(), list(rows.values()))
    assert "plug-in: --backend-file examples/quack_backend.py --backend quack" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only outcome")
def test_harness_skips_every_peer_check_with_the_install_hint(tmp_path):
    """The docs' command on a machine without the libraries: every check skipped with the hint."""
    doc, _ = harness("--backend", "quack*,flashinfer*", "--backend-file", str(FILES["quack"]),
                     "--backend-file", str(FILES["flashinfer"]), "--op", "rms_norm,layer_norm", "--profile", "quick",
                     "-k", "17x4000", block=["quack", "flashinfer"], tmp_path=tmp_path)
    kernels_seen = {r["kernel"] for r in doc["records"]}
    assert kernels_seen == {"quack.default", "quack.tuned", "flashinfer.default"}
    for r in doc["records"]:
        assert r["outcome"] == "skipped" and r["reason"].startswith(HINT[r["backend"]]), r


# -- declared limits -------------------------------------------------------------------------------
def test_quack_declared_limits(monkeypatch):
    module = plugin("quack")
    monkeypatch.setattr(module, "availability", lambda: None)  # as on a GPU with QuACK installed
    rms, ln = registry.get("rms_norm", "quack", "default"), registry.get("layer_norm", "quack", "default")
    tuned = registry.get("rms_norm", "quack", "tuned")
    for k in (rms, ln, tuned):
        assert k.unsupported(spec(k.op, n=262144)) is None
        beyond = k.unsupported(spec(k.op, n=262145, dtype=torch.float32))
        assert beyond == f"N=262145 exceeds {k.name}'s limit of 262144"
        assert "does not run on device 'cpu'" in k.unsupported(spec(k.op, device="cpu"))
    assert "need a weight" in ln.unsupported(spec("layer_norm", weight=False, bias=True))
    assert ln.unsupported(spec("layer_norm", bias=False)) is None
    assert registry.get("layer_norm", "quack", "tuned").unsupported(spec("layer_norm", weight=False)) is None
    assert rms.unsupported(spec(weight=False)) is None
    # The backward: float32 rows of at most 128 Ki; the tuned variant has none.
    assert rms.backward_unsupported(spec(n=131072, dtype=torch.float32)) is None
    assert "at most 131072" in ln.backward_unsupported(spec("layer_norm", n=131073, dtype=torch.float32))
    assert ln.backward_unsupported(spec("layer_norm", n=262144)) is None
    assert tuned.backward_unsupported(spec()) == "quack.tuned has no backward"
    # 16-bit rows of odd N: the default variant's known issue, refused by the tuned one.
    for dtype in ("float16", "bfloat16"):
        for k in (rms, ln):
            assert "odd N" in k.known_issue(case_from_id(f"{k.op}-{dtype}-17x4097-normal"), "cuda")
            assert k.known_issue(case_from_id(f"{k.op}-{dtype}-2x3x4000-normal-dynormal"), "cuda") is None
        assert "odd N" in tuned.unsupported(spec(n=7, dtype=getattr(torch, dtype)))
    assert rms.known_issue(case_from_id("rms_norm-float32-17x4097-normal"), "cuda") is None
    assert tuned.unsupported(spec(n=7, dtype=torch.float32)) is None


def fake_quack_config() -> types.ModuleType:
    """quack.rmsnorm_config's menu and analytical pick (0.6.5, sm_90): 75 launch configs; the pick
    here a fixed one, as the heuristic gives at bfloat16 N = 131072."""
    from dataclasses import dataclass

    m = types.ModuleType("quack.rmsnorm_config")

    @dataclass(frozen=True)
    class RmsNormFwdConfig:
        num_threads: int
        threads_per_row: int
        cluster_n: int
        reload_from: str | None
        delay_w_load: bool = False

        @classmethod
        def from_analytical_heuristic(cls, n, dtype_width, arch_major=None, is_layernorm=False):
            return cls(256, 256, 8, "smem")

    m.RmsNormFwdConfig = RmsNormFwdConfig
    m.get_all_fwd_configs = lambda: [RmsNormFwdConfig(t, p, c, r) for t in (128, 256) for p in (64, 128, 256)
                                     for c in (1, 2, 4, 8, 16) for r in (None, "smem", "gmem") if p <= t]
    return m


def test_quack_tuned_findings_and_its_autotuning_cap(monkeypatch):
    """quack.tuned's findings, declared on the cases that trigger them: N < 64 (its pruner leaves no
    config) strictly, and, where a config its capped autotuner benches needs more shared memory than
    sm_90 gives (QuACK's tile formula), the launch refusal, which may pass. The cap: the
    AUTOTUNE_MAX_CONFIGS configs nearest QuACK's pick, set on its Autotuner at the first call."""
    module = with_stand_in(monkeypatch, "quack")
    monkeypatch.setitem(sys.modules, "quack.rmsnorm_config", fake_quack_config())
    cfg = sys.modules["quack.rmsnorm_config"].RmsNormFwdConfig
    rms, tuned = registry.get("rms_norm", "quack", "default"), registry.get("rms_norm", "quack", "tuned")
    # QuACK's tile: the documented example, 2 rows x 131072 bfloat16 = 524288 bytes; its pick 32 KiB.
    assert module.tile_smem(cfg(128, 64, 1, None), 131072, 16, 16) == 524288
    assert module.tile_smem(cfg(256, 256, 8, "smem"), 131072, 16, 16) == 32768
    # N 100 in float32: cluster capped to 1, the tile 2 rows of 4 x 64 elements (the row padded to it).
    assert module.tile_smem(cfg(128, 64, 16, None), 100, 32, 32) == 2 * 256 * 4
    # The cap: the pick first, then the nearest by cluster size, threads per row, block and reload.
    menu = sys.modules["quack.rmsnorm_config"].get_all_fwd_configs()
    pick = cfg(256, 256, 8, "smem")
    near = module.capped(menu, pick)
    assert len(menu) == 75 and len(near) == module.AUTOTUNE_MAX_CONFIGS == 16
    assert near[0] == pick and {c.cluster_n for c in near[:15]} == {8} and near[15].cluster_n in (4, 16)
    # N < 64: strictly declared, on every dtype the tuned variant runs; not for the default variant.
    for case_id in ("rms_norm-float32-3x1-normal", "rms_norm-bfloat16-3x32-normal", "rms_norm-float32-3x63-normal"):
        case = case_from_id(case_id)
        assert "prunes every config" in tuned.known_issue(case, "cuda") and not tuned.known_issue_may_pass(case, "cuda")
        assert tuned.known_issue(case, "cpu") is None and rms.known_issue(case, "cuda") is None
    assert tuned.known_issue(case_from_id("rms_norm-bfloat16-3x7-normal"), "cuda") is None  # odd 16-bit: refused instead
    # Beyond the shared memory: with the stand-in's pick (cluster 8) float32 N = 32764 benches at most
    # 4 rows x 4096 x 4 bytes, inside; at N = 262144, 4 x 32768 x 4 is not (256 threads, 64 per row).
    assert tuned.known_issue(case_from_id("rms_norm-bfloat16-3x64-normal"), "cuda") is None
    assert tuned.known_issue(case_from_id("rms_norm-float32-1x32764-constant-noaffine"), "cuda") is None
    over = tuned.known_issue(case_from_id("rms_norm-float32-2x262144-normal"), "cuda")
    assert "exceeds sm_90's 232448 bytes (up to 524288 bytes)" in over
    assert tuned.known_issue_may_pass(case_from_id("rms_norm-float32-2x262144-normal"), "cuda")
    # The cap set on QuACK's Autotuner (its perf_model and top_k) by the first call.
    x = torch.randn(4, 256, dtype=torch.bfloat16)
    tuned._call(x, torch.ones(256, dtype=x.dtype), None, 1e-6)
    tuner = sys.modules["quack.rmsnorm"].rmsnorm_fwd_tuned
    assert tuner.configs_top_k == 16 and tuner.perf_model(x=x, config=pick, is_layernorm=False) == (0, 0, False, False)
    assert tuner.perf_model(x=x, config=cfg(128, 64, 1, None), is_layernorm=False) == (3, 2, True, True)
    assert "at most 16 of QuACK's launch configs per shape" in tuned.autotune_cap
    assert getattr(rms, "autotune_cap", None) is None


def test_flashinfer_declared_limits(monkeypatch):
    module = plugin("flashinfer")
    monkeypatch.setattr(module, "availability", lambda: None)
    rms, ln = registry.get("rms_norm", "flashinfer"), registry.get("layer_norm", "flashinfer")
    assert rms.unsupported(spec(dtype=torch.float16)) is None and rms.unsupported(spec(n=262144)) is None
    assert rms.unsupported(spec(dtype=torch.float32)) == (
        "flashinfer.default does not support dtype float32 (supports float16, bfloat16)")
    assert "needs a weight" in rms.unsupported(spec(weight=False))
    assert ln.unsupported(spec("layer_norm", n=262144)) is None
    assert ln.unsupported(spec("layer_norm", dtype=torch.float16)) == (
        "flashinfer.default does not support dtype float16 (supports bfloat16)")
    assert "needs both gamma and beta" in ln.unsupported(spec("layer_norm", bias=False))
    assert "needs both gamma and beta" in ln.unsupported(spec("layer_norm", weight=False, bias=True))
    assert rms.backward_unsupported(spec()) == "flashinfer.default has no backward"
    result = runner.check(rms, Case(op="rms_norm", dtype="float32", shape=(3, 1000)))
    assert result.skipped == rms.unsupported(spec(dtype=torch.float32))


# -- the calls, with stand-ins for the libraries -----------------------------------------------------
def _vector_ok(t: torch.Tensor, vector: int, align: int) -> None:
    assert t.stride(-1) == 1, "last dimension must be contiguous"
    assert t.data_ptr() % align == 0, "misaligned start"
    assert t.dim() == 1 or t.shape[0] <= 1 or t.stride(0) % vector == 0, "row stride not a multiple of the vector"


def _stats(x, eps, centred):
    xf = x.double()
    mean = xf.mean(-1) if centred else torch.zeros(x.shape[0], dtype=torch.float64)
    return mean, torch.rsqrt((xf - mean[:, None]).square().mean(-1) + eps)


def _quack_takes(*ts):
    for t in ts:
        if t is not None:
            v = math.gcd(t.shape[-1], 16 // t.element_size())
            _vector_ok(t, v, v * t.element_size())


def fake_quack() -> types.ModuleType:
    """quack.rmsnorm's entry points (0.6.5 signatures), on CPU tensors, with its asserts."""
    m = types.ModuleType("quack.rmsnorm")

    def rmsnorm_fwd(x, weight=None, bias=None, residual=None, out_dtype=None, residual_dtype=None, eps=1e-6,
                    store_rstd=False, weight_offset=0.0):
        _quack_takes(x, weight)
        ref = reference("rms_norm", x, weight, None, eps)
        return ref.y.to(x.dtype), x, ref.rstd.float() if store_rstd else None

    def layernorm_fwd(x, weight, bias=None, eps=1e-6, return_rstd=False, return_mean=False):
        assert x.dim() == 2 and weight.dim() == 1 and weight.dtype == torch.float32
        assert bias is None or bias.dtype == torch.float32
        _quack_takes(x, weight, bias)
        ref = reference("layer_norm", x, weight, bias, eps)
        return ref.y.to(x.dtype), ref.rstd.float(), ref.mean.float()  # (out, rstd, mean)

    def rmsnorm_fwd_tuned(x, weight, out, bias=None, rstd=None, mean=None, residual=None, residual_out=None,
                          eps=1e-6, is_layernorm=False, per_head=False, weight_offset=0.0, config=None):
        _quack_takes(x, weight, bias)
        ref = reference("layer_norm" if is_layernorm else "rms_norm", x, weight, bias, eps)
        out.copy_(ref.y)
        rstd.copy_(ref.rstd)
        if is_layernorm:
            mean.copy_(ref.mean)

    def rmsnorm_bwd(x, weight, dout, rstd, dresidual_out=None, has_bias=False, has_residual=False, weight_offset=0.0):
        _quack_takes(x, dout)
        g = reference_backward("rms_norm", x, dout, weight, None, 1e-6)
        return g.dx.to(x.dtype), None if weight is None else g.dw.to(weight.dtype), None, None

    def layernorm_bwd(x, weight, dout, rstd, mean, has_bias=True):
        assert x.dim() == 2 and weight.dim() == 1
        _quack_takes(x, dout)
        g = reference_backward("layer_norm", x, dout, weight, torch.zeros_like(weight) if has_bias else None, 1e-5)
        return g.dx.to(x.dtype), g.dw.to(weight.dtype), g.db.to(weight.dtype) if has_bias else None

    for f in (rmsnorm_fwd, layernorm_fwd, rmsnorm_fwd_tuned, rmsnorm_bwd, layernorm_bwd):
        setattr(m, f.__name__, f)
    return m


def fake_flashinfer_norm() -> types.ModuleType:
    """flashinfer.norm's entry points (0.7.2.post1 signatures), on CPU tensors, with its contracts."""
    m = types.ModuleType("flashinfer.norm")

    def rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None):
        assert input.dtype in (torch.float16, torch.bfloat16) and weight.dtype == input.dtype
        size, n = input.element_size(), input.shape[-1]
        if input.is_contiguous():
            _vector_ok(input, 1, math.gcd(128, n * size))
        else:
            _vector_ok(input, math.gcd(n, 16 // size), 16)
        _vector_ok(weight, 1, 16)
        return reference("rms_norm", input, weight, None, eps).y.to(input.dtype)

    def layernorm(input, gemma, beta, eps=1e-6):
        assert input.dtype == torch.bfloat16 and gemma.dtype == beta.dtype == torch.float32
        _vector_ok(input, math.gcd(input.shape[-1], 8), 16)
        return reference("layer_norm", input, gemma, beta, eps).y.to(input.dtype)

    for f in (rmsnorm, layernorm):
        setattr(m, f.__name__, f)
    return m


STAND_INS = {"quack": ("QUACK", "quack.rmsnorm", fake_quack), "flashinfer": ("FLASHINFER", "flashinfer.norm",
                                                                            fake_flashinfer_norm)}


def with_stand_in(monkeypatch, backend):
    module = plugin(backend)
    attr, name, make = STAND_INS[backend]
    monkeypatch.setitem(sys.modules, name, make())
    monkeypatch.setattr(module, attr, OptionalImport(name, missing="stand-in"))
    return module


CASES = [Case(op="rms_norm", dtype="bfloat16", shape=(5, 1000), row_pad=64),  # strided rows, taken as they are
         Case(op="rms_norm", dtype="float16", shape=(3, 4097), row_pad=3),
         Case(op="rms_norm", dtype="bfloat16", shape=(4, 256), affine="none"),
         Case(op="layer_norm", dtype="bfloat16", shape=(5, 1000), row_pad=1),  # a stride off the vector: copied
         Case(op="layer_norm", dtype="bfloat16", shape=(7, 300), affine="weight"),
         Case(op="layer_norm", dtype="bfloat16", shape=(2, 3, 770))]


@pytest.mark.parametrize("backend", sorted(FILES))
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_calls_pass_what_the_library_requires_and_unpack_what_it_returns(monkeypatch, backend, case):
    """Every kernel's forward (and backward) through a stand-in: the library's contracts hold on what
    the plug-in passes, the outputs land in the caller's buffers matching the oracle, and the timed
    callable and the user's call run the same entry point on inputs prepared before them."""
    with_stand_in(monkeypatch, backend)
    inputs = make_inputs(case)
    x2 = inputs.x.reshape(-1, case.n) if inputs.x.dim() > 2 else inputs.x
    for k in registry.kernels([backend], case.op):
        if k.unsupported(spec(case.op, n=case.n, dtype=case.torch_dtype, weight=case.has_weight,
                              bias=case.has_bias, device="cuda")):
            continue
        out = NormOutputs(y=torch.empty(x2.shape, dtype=x2.dtype), mean=torch.empty(x2.shape[0]) if "mean" in k.outputs
                          else None, rstd=torch.empty(x2.shape[0]) if "rstd" in k.outputs else None)
        k._forward(x2, inputs.weight, inputs.bias, inputs.eps, out)  # CUDA-only kernels: the 2-D call, on CPU tensors
        ref = reference(case.op, x2, inputs.weight, inputs.bias, inputs.eps)
        torch.testing.assert_close(out.y.double(), ref.y, rtol=2e-2, atol=2e-2)
        for name in ("mean", "rstd"):
            if getattr(out, name) is not None:
                torch.testing.assert_close(getattr(out, name).double(), getattr(ref, name), rtol=1e-5, atol=1e-6)
        y_timed = k.bench_callable(x2, inputs.weight, inputs.bias, inputs.eps, out)()
        name, call = k.user_call(x2, inputs.weight, inputs.bias, inputs.eps)
        assert name == k.call_name and type(call()) is type(y_timed)
        if k.has_backward:  # the 2-D call, as NormKernel.backward makes it
            dy = torch.randn(x2.shape, dtype=torch.float64).to(x2.dtype)
            like = lambda t: None if t is None else torch.empty_like(t)  # noqa: E731
            grads = NormGrads(dx=torch.empty_like(x2), dw=like(inputs.weight), db=like(inputs.bias))
            k._backward(x2, inputs.weight, inputs.bias, dy, NormOutputs(y=x2, mean=out.mean, rstd=out.rstd),
                        inputs.eps, grads)
            want = reference_backward(case.op, x2, dy, inputs.weight, inputs.bias, inputs.eps)
            torch.testing.assert_close(grads.dx.double(), want.dx, rtol=5e-2, atol=5e-2)


def test_stand_ins_keep_the_installed_libraries_signatures():
    """Where QuACK or FlashInfer is installed, the stand-ins' parameters are the real ones."""
    checked = 0
    for backend, (_, name, make) in STAND_INS.items():
        if importlib.util.find_spec(LIBRARY[backend]) is None:
            continue
        try:
            real = importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 (installed but not loadable here: nothing to compare)
            pytest.skip(f"{name} does not import here: {exc}")
        fake = make()
        for fn in vars(fake).values():
            if callable(fn):
                target = getattr(real, fn.__name__)
                target = getattr(target, "fn", target)  # QuACK's @autotune wraps the function in an Autotuner
                want = list(inspect.signature(target).parameters)
                assert list(inspect.signature(fn).parameters) == want, fn.__name__
                checked += 1
    if not checked:
        pytest.skip("neither quack nor flashinfer is installed here")


# -- on a GPU: each declared limit, just inside and just outside ----------------------------------------
def _gpu_reason() -> str | None:
    if not torch.cuda.is_available():
        return "needs a CUDA device with quack-kernels and flashinfer-python installed"
    missing = [b for b in FILES if plugin(b).availability()]
    if not missing:
        return None
    return f"{', '.join(missing)} not usable here: " + "; ".join(plugin(b).availability() for b in missing)


# (backend, variant, inside case, outside case, what the outside case is refused with); a reason of
# "known issue: <pattern>" expects the call itself to fail as the plug-in declares, with an error
# matching the pattern.
LIMITS = [
    ("quack", "default", Case(op="rms_norm", dtype="float32", shape=(2, 262144)),
     Case(op="rms_norm", dtype="float32", shape=(2, 262145)), "exceeds quack.default's limit of 262144"),
    ("quack", "default", Case(op="layer_norm", dtype="bfloat16", shape=(2, 262144)),
     Case(op="layer_norm", dtype="bfloat16", shape=(2, 262146)), "exceeds quack.default's limit of 262144"),
    ("quack", "tuned", Case(op="rms_norm", dtype="bfloat16", shape=(2, 262144)),
     Case(op="rms_norm", dtype="bfloat16", shape=(2, 262146)), "exceeds quack.tuned's limit of 262144"),
    ("quack", "default", Case(op="layer_norm", dtype="bfloat16", shape=(7, 1000), affine="weight"),
     Case(op="layer_norm", dtype="bfloat16", shape=(7, 1000), affine="bias"), "need a weight"),
    ("quack", "default", Case(op="rms_norm", dtype="bfloat16", shape=(17, 1538)),
     Case(op="rms_norm", dtype="bfloat16", shape=(17, 1537)), "known issue: cp_size"),
    ("quack", "default", Case(op="layer_norm", dtype="float16", shape=(17, 6)),
     Case(op="layer_norm", dtype="float16", shape=(17, 7)), "known issue: cp_size"),
    ("quack", "tuned", Case(op="rms_norm", dtype="float32", shape=(3, 64)),
     Case(op="rms_norm", dtype="float32", shape=(3, 63)), "known issue: min\\(\\)"),
    ("quack", "tuned", Case(op="layer_norm", dtype="bfloat16", shape=(17, 1538)),
     Case(op="layer_norm", dtype="bfloat16", shape=(17, 1537)), "odd N"),
    ("flashinfer", "default", Case(op="rms_norm", dtype="float16", shape=(17, 1000)),
     Case(op="rms_norm", dtype="float32", shape=(17, 1000)), "does not support dtype float32"),
    ("flashinfer", "default", Case(op="rms_norm", dtype="bfloat16", shape=(2, 262143)),
     Case(op="rms_norm", dtype="bfloat16", shape=(7, 1000), affine="none"), "needs a weight"),
    ("flashinfer", "default", Case(op="layer_norm", dtype="bfloat16", shape=(2, 262144)),
     Case(op="layer_norm", dtype="float16", shape=(7, 1000)), "does not support dtype float16"),
    ("flashinfer", "default", Case(op="layer_norm", dtype="bfloat16", shape=(5, 1000), row_pad=1),
     Case(op="layer_norm", dtype="bfloat16", shape=(7, 1000), affine="weight"), "needs both gamma and beta"),
]
BACKWARD_LIMITS = [
    (op, Case(op=op, dtype="float32", shape=(3, 131072)), Case(op=op, dtype="float32", shape=(3, 131074)))
    for op in ("rms_norm", "layer_norm")
]


@pytest.mark.parametrize("backend,variant,inside,outside,reason", LIMITS,
                         ids=[f"{b}.{v}-{i.id}-vs-{o.id}" for b, v, i, o, _ in LIMITS])
def test_each_declared_limit_on_the_gpu(backend, variant, inside, outside, reason):
    why = _gpu_reason()
    if why:
        pytest.skip(why)
    k = registry.get(inside.op, backend, variant)
    result = runner.check(k, inside)
    assert result.skipped is None and result.ok, result.failure_message()
    if reason.startswith("known issue: "):
        assert k.known_issue(outside, "cuda") and k.unsupported(outside.spec("cuda")) is None
        with pytest.raises(Exception, match=reason.removeprefix("known issue: ")):
            runner.check(k, outside)
        return
    assert reason in (runner.check(k, outside).skipped or "")


@pytest.mark.parametrize("op,inside,outside", BACKWARD_LIMITS, ids=[o for o, _, _ in BACKWARD_LIMITS])
def test_quack_backward_limit_on_the_gpu(op, inside, outside):
    why = _gpu_reason()
    if why:
        pytest.skip(why)
    k = registry.get(op, "quack", "default")
    result = runner.check_backward(k, inside)
    assert result.skipped is None and result.ok, result.failure_message()
    assert "at most 131072" in (runner.check_backward(k, outside).skipped or "")
