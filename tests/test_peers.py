"""The peer backends: apex (built in, CUDA only), torch.compile (built in) and Liger-Kernel (an
outside plug-in file). Where a peer cannot run, its cases are skips with the reason; declared
limits become skips with the reason; what runs matches the oracle."""
import importlib.util
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

import impls.apex as apex
import impls.torch_compile as tc
from harness.judging import properties, runner
from harness.judging.cases import Case
from impls import registry
from impls.base import NormOutputs, NormSpec, OptionalImport
from impls.reference import reference

ROOT = Path(__file__).resolve().parents[1]
LIGER_FILE = ROOT / "examples" / "liger_backend.py"
FILTER = ["--op", "rms_norm,layer_norm", "--dtype", "bfloat16", "--profile", "quick", "-k", "17x4000"]


def harness(*args, block=(), tmp_path):
    """Run the differential check in a fresh process, with the modules in ``block`` made
    unimportable (as on a machine without them); return the report's records."""
    # One process (-n 0): the blocked modules are blocked in this process only.
    argv = [str(ROOT / "harness" / "test_differential.py"), "-q", "-p", "no:randomly", "-n", "0",
            "--report-dir", str(tmp_path), *args]
    code = (f"import sys\nfor m in {list(block)!r}: sys.modules[m] = None\n"
            f"import pytest\nsys.exit(pytest.main({argv!r}))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((tmp_path / "correctness.json").read_text())
    return doc, proc


def load_liger_plugin():
    """The plug-in, loaded once per process the way --backend-file loads it."""
    name = "normdiff_plugin_liger_backend"
    if name not in sys.modules:
        registry.load_file(LIGER_FILE)
    return sys.modules[name]


def spec(op="rms_norm", n=4000, rows=8, device="cuda", dtype=torch.bfloat16, weight=True, bias=None):
    return NormSpec(op=op, dtype=dtype, rows=rows, n=n, row_stride=n, device=device, has_weight=weight,
                    has_bias=(op == "layer_norm" and weight) if bias is None else bias)


# -- one command for all three peers --------------------------------------------------------
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only outcome")
def test_all_peers_in_one_command_on_cpu(tmp_path):
    """apex and liger skip with their reasons, torch_compile runs, in the README's command."""
    doc, proc = harness("--backend", "apex,torch_compile,liger", "--backend-file", str(LIGER_FILE), *FILTER,
                        block=["fused_layer_norm_cuda", "liger_kernel"], tmp_path=tmp_path)
    by_backend = {}
    for r in doc["records"]:
        by_backend.setdefault(r["backend"], []).append(r)
    assert set(by_backend) == {"apex", "torch_compile", "liger"}
    assert all(r["outcome"] == "skipped" and r["reason"].startswith(
        "fused_layer_norm_cuda not importable (apex built without its CUDA extensions): see README")
        for r in by_backend["apex"])
    assert all(r["outcome"] == "skipped" and r["reason"].startswith(
        "liger_kernel not importable: pip install liger-kernel==0.8.5") for r in by_backend["liger"])
    compiled = by_backend["torch_compile"]
    ran = [r for r in compiled if r["outcome"] == "passed"]
    assert ran and all(r in ran or (r["outcome"] == "skipped" and r["reason"].startswith(
        "quick profile on the CPU: torch_compile.inductor checks one case in 3")) for r in compiled), compiled
    assert {r["kernel"] for r in doc["records"]} == {
        "apex.fused", "liger.fused", "torch_compile.inductor"}
    md = (tmp_path / "correctness.md").read_text()
    assert "unavailable: fused_layer_norm_cuda not importable" in md
    assert "unavailable: liger_kernel not importable" in md


def test_quick_cpu_share_samples_cases_by_seed_and_keeps_known_issues(monkeypatch):
    """NormKernel.quick_cpu_every: on the CPU's quick profile a kernel that declares it checks the
    cases whose seed it divides, the rest skipped with the reason; a known issue is always checked
    (it must keep failing); the full profile, and a kernel that declares nothing, check every case."""
    from harness.judging.cases import catalogue
    from harness.running.state import HarnessState, quick_cpu_kept

    kernel = registry.get("rms_norm", "torch_compile")
    plain = registry.get("rms_norm", "torch")
    cases = [c for c in catalogue("quick") if c.op == "rms_norm"]
    quick, full = (HarnessState(runs={}, profile=p, selection={}) for p in ("quick", "full"))
    kept = [c for c in cases if quick.left_out(kernel, c) is None]
    assert kept == [c for c in cases if quick_cpu_kept(c, kernel.quick_cpu_every) or kernel.known_issue(c, "cpu")]
    det = properties.determinism_cases(cases, "quick")  # a seed sample of its own: not the same third
    assert 0 < sum(quick_cpu_kept(c, kernel.quick_cpu_every) for c in det) < len(det)
    assert 0.2 < len(kept) / len(cases) < 0.5
    assert "checks one case in 3" in quick.left_out(kernel, next(c for c in cases if c not in kept))
    assert all(full.left_out(kernel, c) is None and quick.left_out(plain, c) is None for c in cases)
    dropped = next(c for c in cases if c not in kept)
    monkeypatch.setattr(type(kernel), "known_issue", lambda self, case, device, inputs=None: "x" if case == dropped else None)
    assert quick.left_out(kernel, dropped) is None


# -- apex --------------------------------------------------------------------------------------
def test_apex_module_imports_without_the_extension():
    assert {("apex", "fused", op) for op in ("rms_norm", "layer_norm")} <= {
        (k.backend, k.variant, k.op) for k in registry.kernels(["apex"])}


def test_apex_unavailable_without_the_extension(monkeypatch):
    monkeypatch.setitem(sys.modules, "fused_layer_norm_cuda", None)
    monkeypatch.setattr(apex, "EXT", OptionalImport(apex.EXTENSION, missing=apex.EXT.missing))
    kernel = registry.get("layer_norm", "apex")
    assert kernel.availability() == (
        "fused_layer_norm_cuda not importable (apex built without its CUDA extensions): see README")
    assert kernel.unsupported(spec("layer_norm")) == kernel.availability()


def test_apex_declared_limits(monkeypatch):
    rms, ln = registry.get("rms_norm", "apex"), registry.get("layer_norm", "apex")
    monkeypatch.setattr(apex, "availability", lambda: None)  # as on a GPU with apex built
    assert ln.unsupported(spec("layer_norm")) is None
    assert ln.unsupported(spec("layer_norm", weight=False)) is None
    assert "weight and bias together or neither" in ln.unsupported(spec("layer_norm", bias=False))
    assert "32-bit element indexing" in rms.unsupported(spec(rows=2**16, n=2**15 + 1))
    assert rms.unsupported(spec(rows=2**16, n=2**15 - 1)) is None
    assert "does not run on device 'cpu'" in rms.unsupported(spec(device="cpu"))
    # Through the runner a limit is a skip with the reason, before any input is made.
    result = runner.check(ln, Case(op="layer_norm", dtype="bfloat16", shape=(7, 1000), affine="weight"))
    assert result.skipped and "weight and bias together or neither" in result.skipped


class FakeExtension(types.ModuleType):
    """The entry points' signatures and contracts from apex's csrc/layer_norm_cuda.cpp, on CPU
    tensors: contiguous input, weight and bias in x's dtype, float32 (n1,) statistics."""

    def __init__(self):
        super().__init__("fused_layer_norm_cuda")
        self.calls = []

    def _stats(self, x, eps, rms):
        xf = x.float()
        mean = torch.zeros(x.shape[0]) if rms else xf.mean(-1)
        var = (xf * xf).mean(-1) if rms else ((xf - mean[:, None]) ** 2).mean(-1)
        return mean, torch.rsqrt(var + eps)

    def _check(self, name, x, shape, *params):
        assert x.is_contiguous(), "input must be contiguous"
        assert list(shape) == [x.shape[-1]]
        assert all(p.dtype == x.dtype and p.is_contiguous() for p in params)
        self.calls.append(name)

    def forward(self, x, shape, eps):
        self._check("forward", x, shape)
        mean, rstd = self._stats(x, eps, rms=False)
        return [((x.float() - mean[:, None]) * rstd[:, None]).to(x.dtype), mean, rstd]

    def forward_affine(self, x, shape, gamma, beta, eps):
        self._check("forward_affine", x, shape, gamma, beta)
        mean, rstd = self._stats(x, eps, rms=False)
        return [((x.float() - mean[:, None]) * rstd[:, None] * gamma.float() + beta.float()).to(x.dtype), mean, rstd]

    def rms_forward(self, x, shape, eps):
        self._check("rms_forward", x, shape)
        _, rstd = self._stats(x, eps, rms=True)
        return [(x.float() * rstd[:, None]).to(x.dtype), rstd]

    def rms_forward_affine(self, x, shape, gamma, eps):
        self._check("rms_forward_affine", x, shape, gamma)
        _, rstd = self._stats(x, eps, rms=True)
        return [(x.float() * rstd[:, None] * gamma.float()).to(x.dtype), rstd]


@pytest.mark.parametrize("op,affine", [("rms_norm", "none"), ("rms_norm", "weight"),
                                       ("layer_norm", "none"), ("layer_norm", "weight_bias")])
def test_apex_calls_the_right_entry_point_and_normalises_its_outputs(monkeypatch, op, affine):
    """With a stand-in for the extension: the entry point that matches the affine parameters,
    strided rows made contiguous, invvar written as rstd."""
    fake = FakeExtension()
    monkeypatch.setitem(sys.modules, apex.EXTENSION, fake)
    monkeypatch.setattr(apex, "EXT", OptionalImport(apex.EXTENSION, missing=apex.EXT.missing))
    kernel = registry.get(op, "apex")
    case = Case(op=op, dtype="bfloat16", shape=(5, 300), affine=affine, row_pad=20)
    from harness.judging.inputs import make_inputs
    inputs = make_inputs(case)
    assert not inputs.x.is_contiguous()
    out = NormOutputs(y=torch.empty(5, 300, dtype=torch.bfloat16),
                      mean=torch.empty(5) if op == "layer_norm" else None, rstd=torch.empty(5))
    kernel._forward(inputs.x, inputs.weight, inputs.bias, inputs.eps, out)  # CUDA-only: bypass the device check
    prefix = "rms_" if op == "rms_norm" else ""
    assert fake.calls == [prefix + ("forward" if affine == "none" else "forward_affine")]
    ref = reference(op, inputs.x, inputs.weight, inputs.bias, inputs.eps)
    torch.testing.assert_close(out.rstd.double(), ref.rstd, rtol=1e-5, atol=0)
    torch.testing.assert_close(out.y.double(), ref.y, rtol=2e-2, atol=2e-2)


# -- torch.compile -----------------------------------------------------------------------------
needs_inductor = pytest.mark.skipif(
    tc._probe(tc._device()) is not None, reason=f"Inductor cannot run here: {tc._probe(tc._device())}")


@needs_inductor
@pytest.mark.parametrize("case", [
    Case(op="rms_norm", dtype="bfloat16", shape=(17, 1000), tags=()),
    Case(op="rms_norm", dtype="float32", shape=(5, 4097), row_pad=64),
    Case(op="rms_norm", dtype="float16", shape=(2, 3, 129), affine="none"),
    Case(op="layer_norm", dtype="bfloat16", shape=(9, 1000), dist="large_mean"),
    Case(op="layer_norm", dtype="float32", shape=(33, 1000), row_pad=1000, affine="weight"),
    Case(op="layer_norm", dtype="float16", shape=(17, 1000), dist="nan_row", affine="none"),
], ids=lambda c: c.id)
def test_torch_compile_matches_the_oracle(case):
    kernel = registry.get(case.op, "torch_compile")
    result = runner.check(kernel, case)
    assert result.skipped is None and result.ok, result.failure_message()


@needs_inductor
def test_torch_compile_compiles_once_per_shape_class_and_prepare_does_it():
    from torch._dynamo.utils import counters

    kernel = registry.get("rms_norm", "torch_compile")
    device = tc._device()
    s = NormSpec(op="rms_norm", dtype=torch.float32, rows=64, n=77, row_stride=77, device=device,
                 has_weight=True, has_bias=False)
    kernel.prepare(s)
    graphs, classes = counters["stats"]["unique_graphs"], kernel.compiled_classes()
    # The prepared class runs without compiling again; on the CPU other row counts share it.
    rows = (64, 3, 200) if tc.dynamic_rows(device) else (64,)
    for m in rows:
        x = torch.randn(m, 77, device=device)
        w = torch.randn(77, device=device)
        out = kernel(x, w, None, 1e-6)
        torch.testing.assert_close(out.y.double(), reference("rms_norm", x, w, None, 1e-6).y, rtol=1e-5, atol=1e-5)
    assert counters["stats"]["unique_graphs"] == graphs and kernel.compiled_classes() == classes


@needs_inductor
def test_torch_compile_many_shape_classes_never_hit_recompile_limits():
    """More shape classes than Dynamo's per-function recompile limit: each still compiles (a hit
    limit would raise under fullgraph, or run eager code under this backend's name)."""
    limit = torch._dynamo.config.recompile_limit
    kernel = registry.get("layer_norm", "torch_compile")
    for n in range(2, limit + 4):
        x = torch.randn(4, n, device=tc._device()) * 3 + 1
        out = kernel(x, None, None, 1e-5)
        torch.testing.assert_close(out.mean.double(), x.double().mean(-1), rtol=1e-5, atol=1e-6)


def test_torch_compile_unavailable_reason_when_inductor_fails(monkeypatch):
    def broken_compile(*args, **kwargs):
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(tc, "_PROBES", {})
    monkeypatch.setattr(tc.torch, "compile", broken_compile)
    kernel = registry.get("rms_norm", "torch_compile")
    reason = kernel.availability()
    assert reason.startswith("torch.compile (Inductor) cannot compile on") and "no C++ compiler" in reason
    assert kernel.unsupported(spec(device=tc._device())) == reason


# -- Liger-Kernel, an outside plug-in ------------------------------------------------------------
def test_liger_plugin_is_not_built_in():
    assert not any("liger" in m for m in registry.BUILTIN_MODULES)
    assert not list((ROOT / "impls").rglob("*liger*"))


def test_liger_plugin_declared_limits(monkeypatch):
    plugin = load_liger_plugin()
    rms, ln = registry.get("rms_norm", "liger"), registry.get("layer_norm", "liger")
    monkeypatch.setattr(plugin, "availability", lambda: None)  # as on a GPU with liger installed
    assert rms.unsupported(spec(n=65536)) is None
    assert rms.unsupported(spec(n=65537)) == "N=65537 exceeds liger.fused's limit of 65536"
    assert rms.unsupported(spec(weight=False)) is None
    assert "needs both weight and bias" in ln.unsupported(spec("layer_norm", weight=False))
    assert "needs both weight and bias" in ln.unsupported(spec("layer_norm", bias=False))
    # Through the runner the limit is a skip with the reason.
    result = runner.check(rms, Case(op="rms_norm", dtype="bfloat16", shape=(2, 100000)))
    assert result.skipped == "N=100000 exceeds liger.fused's limit of 65536"


def test_liger_plugin_unavailable_without_liger(monkeypatch):
    plugin = load_liger_plugin()
    monkeypatch.setitem(sys.modules, "liger_kernel", None)
    monkeypatch.setattr(plugin, "LIGER", OptionalImport(*plugin.LIGER.names, missing=plugin.LIGER.missing))
    assert registry.get("rms_norm", "liger").availability() == (
        "liger_kernel not importable: pip install liger-kernel==0.8.5")


@pytest.mark.skipif(torch.cuda.is_available() or importlib.util.find_spec("liger_kernel") is None,
                    reason="needs liger installed on a machine without CUDA")
def test_liger_installed_without_a_gpu_is_skipped_with_the_reason(tmp_path):
    doc, _ = harness("--backend", "liger", "--backend-file", str(LIGER_FILE), *FILTER, tmp_path=tmp_path)
    assert doc["records"] and all(r["outcome"] == "skipped" and r["reason"].startswith("liger needs a CUDA device")
                                  for r in doc["records"])
