"""tilelang.fused (impls.tilelang.fused): registration and declarations, plans, a few builds for
sm_90 (registers and spills, the fp8 clamp before the cast, in place every load before every
store, the padding outside the statistics), and what a machine without a GPU says. The forward
against the eager composition (impls.torch_fused) runs where a CUDA device is, skipped here.
"""
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from impls import registry
from impls.base import UnsupportedCase, cuda_present
from impls.fused import FUSED_OPS, WRITES, FusedOutputs, FusedSpec
from impls.tilelang import compiler
from impls.tilelang._kernel import MAX_ROWS
from impls.tilelang.fused import (ONE_READ_MAX_N, TileLangAddLayerNorm, TileLangAddRMSNorm,
                                  TileLangLayerNormFused, TileLangRMSNormFused, stores_before_loads)

ROOT = Path(__file__).resolve().parents[1]
HAS_CUDA = cuda_present()
NO_GPU = "no CUDA device: the kernel cannot execute here (its sm_90 builds are checked above)"


def _kernel(op):
    registry.load_builtins()
    return registry.get(op, "tilelang", "fused")


def _spec(op="add_rms_norm", n=4096, rows=8, dtype=torch.bfloat16, residual_dtype=None, **kw):
    residual_dtype = (residual_dtype or dtype) if op.startswith("add_") else None
    return FusedSpec(op=op, dtype=dtype, rows=rows, n=n, row_stride=n, device="cuda", has_weight=True,
                     has_bias=op.endswith("layer_norm"), residual_dtype=residual_dtype, **kw)


# -- registration, declarations, plans (no compiler) --------------------------------------------
def test_registered_in_the_fused_family_only():
    registry.load_builtins()
    fused = registry.kernels(["tilelang"], family="fused")
    assert {(k.op, k.variant) for k in fused} == {(op, "fused") for op in FUSED_OPS}
    assert "fused" not in {k.variant for k in registry.kernels(["tilelang"])}  # the plain family's list
    for k in fused:
        assert k.project and k.stats_on == "float32_sum" and k.fp8_nan == "nan" and k.scale_convention == "divide"
        assert k.writes == (WRITES if k.op.startswith("add_") else ("new",))
        assert k.offline_builds() and not k.has_backward
    assert _kernel("add_rms_norm").weight_offsets == _kernel("rms_norm").weight_offsets == (0.0, 1.0)
    assert _kernel("add_layer_norm").out_dtypes == (None,) and _kernel("layer_norm").weight_offsets == (0.0,)
    assert torch.float8_e4m3fn in _kernel("layer_norm").out_dtypes
    assert _kernel("add_rms_norm").residual_dtypes == ("same", "float32")


def test_import_does_not_import_tilelang():
    code = "import sys, impls.tilelang.fused; assert 'tilelang' not in sys.modules, 'tilelang imported eagerly'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_short_rows_are_read_once_and_long_rows_twice_with_one_reduction_for_every_m():
    k = _kernel("add_layer_norm")
    for n in (1, 769, 4096, 5000, ONE_READ_MAX_N):
        p = k.compile_key(_spec("add_layer_norm", n))
        assert p.segments == 1 and p.padded >= n and p.padded % (p.threads_per_row * p.vec) == 0
    for n in (ONE_READ_MAX_N + 1, 65536, 100001, 1 << 20):
        p = k.compile_key(_spec("add_layer_norm", n))
        assert p.rows_per_block == 1 and p.segments == -(-n // p.padded) > 1
    # few rows take the decode rule (a row a block, no launch bound); a row's threads, vectors and
    # columns, and so its reduction, never depend on M
    few, many = k.compile_key(_spec(rows=1)), k.compile_key(_spec(rows=1 << 20))
    assert few == k.compile_key(_spec(rows=3)) and many == k.compile_key(_spec(rows=129))
    same = lambda p: (p.threads_per_row, p.vec, p.padded, p.group, p.segments)  # noqa: E731
    assert same(few) == same(many) and (few.rows_per_block, few.min_blocks) == (1, 1)
    assert k.batch_invariant and k.m_thresholds(_spec()) == (128,)


def test_cases_it_does_not_take_say_why(monkeypatch):
    monkeypatch.setattr(compiler, "availability", lambda: None)  # as on a GPU: the declarations answer
    rms, ln = _kernel("add_rms_norm"), _kernel("add_layer_norm")
    assert rms.unsupported(_spec()) is None
    assert "int32" in rms.unsupported(_spec(rows=MAX_ROWS + 1))
    assert "weight offset 2" in rms.unsupported(_spec(weight_offset=2.0))
    assert "does not output" in ln.unsupported(_spec("add_layer_norm", out_dtype=torch.float8_e4m3fn))
    why = rms.unsupported(_spec(residual_dtype=torch.float16))
    assert "takes no float16 residual with bfloat16 x" in why
    assert "does not write 'in_place'" in _kernel("rms_norm").unsupported(_spec("rms_norm", write="in_place"))


@pytest.mark.skipif(HAS_CUDA, reason="a CUDA device is present: the kernels run here")
def test_without_a_gpu_every_call_is_refused_with_the_reason():
    reason = compiler.availability()
    assert reason  # no device: compiled for sm_90, not executed (or tilelang missing, with its install hint)
    for op in FUSED_OPS:
        k = _kernel(op)
        assert k.unavailable() == reason and k.unsupported(_spec(op)) == reason
        x = torch.randn(2, 64)
        residual = torch.randn(2, 64) if op.startswith("add_") else None
        with pytest.raises(UnsupportedCase, match=re.escape(reason)):
            k(x, residual, torch.ones(64))
    if compiler.tilelang_module()[0] is not None:
        assert reason == compiler.NOT_EXECUTED and compiler.NOT_EXECUTED in _kernel("rms_norm").note()


def test_the_in_place_check_sees_a_store_before_a_load():
    ok = "main_kernel(int M) {\n  s[0] = ((float)X[i]);\n  s[0] = s[0] + ((float)R[i]);\n  RO[i] = ((bfloat16_t)s[0]);\n}"
    assert stores_before_loads(ok) is None
    bad = "main_kernel(int M) {\n  s[0] = ((float)X[i]);\n  *(uint4*)(RO + i) = v;\n  s[0] = s[0] + ((float)R[i]);\n}"
    assert stores_before_loads(bad) == "*(uint4*)(RO + i) = v;"


# -- builds for sm_90 ---------------------------------------------------------------------------
# (kernel, build): add_rms_norm with everything (fp8, offset 1); in place read once and read twice;
# LayerNorm's fp8 at an odd N (scalar accesses, padded lanes). About 5 s each on 2 cores.
BUILDS = {
    "fp8_offset": (TileLangAddRMSNorm, ("bfloat16", 4096, "same", "float8_e4m3fn", 1.0, "new")),
    "in_place": (TileLangAddRMSNorm, ("bfloat16", 4096, "same", None, 0.0, "in_place")),
    "in_place_long": (TileLangAddLayerNorm, ("bfloat16", 65536, "same", None, 0.0, "in_place")),
    "odd_fp8": (TileLangLayerNormFused, ("float16", 769, None, "float8_e4m3fn", 0.0, "new")),
}


@pytest.fixture(scope="module")
def built():
    tl, why = compiler.tilelang_module()
    if tl is None:
        pytest.skip(why)
    if compiler.nvcc_path() is None:
        pytest.skip("nvcc not found: TileLang cannot compile CUDA kernels here")
    out = {}
    for name, (cls, build) in BUILDS.items():
        kernel = cls()
        report = kernel.build_offline(build)  # the in-place builds check stores_before_loads themselves
        source = compiler.compile_plan(kernel.build_plan(build), compiler.SM90).source()  # cached: no compile
        out[name] = report, source[source.index("main_kernel("):]
    return out


@pytest.mark.parametrize("name", list(BUILDS))
def test_builds_for_sm_90_without_spills(built, name):
    report, _ = built[name]
    assert report["sass_arch"] == report["arch"] == "sm_90"
    assert report["registers"] is not None and report["registers"] <= 255
    assert report["spill_stores"] == report["spill_loads"] == 0, report


@pytest.mark.parametrize("name", ["fp8_offset", "odd_fp8"])
def test_fp8_is_scaled_and_clamped_by_comparisons_before_the_cast(built, name):
    _, src = built[name]
    lines = src.splitlines()
    cast = next(i for i, line in enumerate(lines) if "fp8" in line.split("=")[-1] and re.search(r"cvt|\(fp8_e4_t\)", line))
    above = next(i for i, line in enumerate(lines) if re.search(r"0x1\.cp\+8f/\*4\.480000e\+02\*/ < ", line))
    below = next(i for i, line in enumerate(lines) if re.search(r" < -0x1\.cp\+8f/\*-4\.480000e\+02\*/", line))
    assert above < cast and below < cast, "the clamp to +-448 must come before the fp8 cast"
    # the "divide" convention, by the reciprocal the host passes (fused.FP8_SCALE): no division
    assert "* rs[0]" in src and "rs[0] = scale;" in src and "/ rs[0]" not in src
    assert not re.search(r"\b(fminf|fmaxf|min|max)\(", src), "min/max would turn a NaN into +-448"


def test_gemma_offset_is_added_to_the_weight(built):
    one = "0x1p+0f/*1.000000e+00*/"  # the offset, a constant of the plan: absent at offset 0
    assert one in built["fp8_offset"][1] and one not in built["in_place"][1]


@pytest.mark.parametrize("name", ["in_place", "in_place_long"])
def test_in_place_every_load_comes_before_every_store(built, name):
    _, src = built[name]
    assert stores_before_loads(src) is None
    lines = src.splitlines()
    last_load = max(i for i, line in enumerate(lines) if re.search(r"\b(X|R)\s*(\[|\+)", line.partition(" = ")[2]))
    first_store = min(i for i, line in enumerate(lines) if re.search(r"\b(Y|RO)\s*(\[|\+)", line.partition(" = ")[0]))
    if name == "in_place":  # read once: the row's reduction (a block barrier) between them
        assert "AllReduce" in "\n".join(lines[last_load:first_store])


def test_padded_lanes_stay_outside_the_statistics(built):
    _, src = built["odd_fp8"]  # N = 769 padded to 1024 lanes
    assert "7.690000e+02" in src and "1.024000e+03" not in src, "mean and variance must divide by N"
    assert re.search(r"if \(\(?\(?.*< 769", src), "the padded lanes must be guarded"


# -- on a GPU -----------------------------------------------------------------------------------
GPU_CASES = [  # (op, dtype, N, write, residual dtype, out dtype, offset)
    ("add_rms_norm", torch.bfloat16, 4096, "new", None, None, 0.0),
    ("add_rms_norm", torch.float16, 769, "in_place", None, None, 1.0),
    ("add_rms_norm", torch.bfloat16, 20000, "in_place", None, None, 0.0),
    ("add_rms_norm", torch.bfloat16, 5000, "out_y", torch.float32, torch.float8_e4m3fn, 0.0),
    ("add_layer_norm", torch.float32, 4096, "in_place", None, None, 0.0),
    ("add_layer_norm", torch.bfloat16, 70001, "new", None, None, 0.0),
    ("rms_norm", torch.bfloat16, 4096, "new", None, torch.float8_e4m3fn, 1.0),
    ("layer_norm", torch.float16, 3000, "new", None, torch.float8_e4m3fn, 0.0),
    ("layer_norm", torch.bfloat16, 40000, "new", None, torch.float8_e5m2, 0.0),
]


@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: "-".join(str(p).replace("torch.", "") for p in c))
def test_matches_the_eager_composition(case):
    if not HAS_CUDA:
        pytest.skip(NO_GPU)
    op, dtype, n, write, rdt, out_dtype, offset = case
    g = torch.Generator(device="cuda").manual_seed(n)
    make = lambda dt: torch.randn(33, n, device="cuda", generator=g).to(dt)  # noqa: E731
    x, w = make(dtype), (1 + 0.1 * torch.randn(n, device="cuda", generator=g)).to(dtype)
    residual = make(rdt or dtype) if op.startswith("add_") else None
    bias = torch.randn(n, device="cuda", generator=g).to(dtype) if op.endswith("layer_norm") else None
    if out_dtype is not None:
        x[3, 7] = float("nan")  # the row's y is NaN, which the fp8 cast must keep
    kw = dict(weight_offset=offset, out_dtype=out_dtype, scale=0.05 if out_dtype is not None else None)
    ref = registry.get(op, "torch", "fused")(x.clone(), None if residual is None else residual.clone(), w, bias, **kw)
    xs, rs = x.clone(), None if residual is None else residual.clone()
    out = None
    if write == "out_y":  # y into a buffer of the caller's, rows 8 elements apart
        y = torch.empty(33, n + 8, dtype=out_dtype or dtype, device="cuda")[:, :n]
        out = FusedOutputs(y=y, rstd=torch.empty(33, device="cuda"))
    got = _kernel(op)(xs, rs, w, bias, write=write, out=out, **kw)
    if write == "in_place":
        assert got.y.data_ptr() == xs.data_ptr() and got.residual_out.data_ptr() == rs.data_ptr()
    if write != "new":
        assert got.residual_out is rs and (out is None or got.y is out.y)
    if residual is not None:  # the float32 sum rounded once (and x's NaN)
        torch.testing.assert_close(got.residual_out, ref.residual_out, rtol=0, atol=0, equal_nan=True)
    if out_dtype is None:
        tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
        torch.testing.assert_close(got.y.float(), ref.y.float(), rtol=tol, atol=tol)
    else:  # within one fp8 step (rsqrt and FMA differ from torch's); NaN where torch's is
        step = 2.0 ** -3 if out_dtype == torch.float8_e4m3fn else 2.0 ** -2
        torch.testing.assert_close(got.y.float(), ref.y.float(), rtol=step, atol=2.0 ** -9, equal_nan=True)
        assert torch.isnan(got.y.float()[3]).all()
    torch.testing.assert_close(got.rstd, ref.rstd, rtol=1e-5, atol=0, equal_nan=True)
    if ref.mean is not None:
        torch.testing.assert_close(got.mean, ref.mean, rtol=1e-5, atol=1e-6, equal_nan=True)
