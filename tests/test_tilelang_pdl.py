"""PDL (impls.pdl) in the TileLang kernels, the fused kernels' decode rule and their fp8 forms, on
any machine: the plans (the switch in the compile key, one row a block for few rows, the fp8
settings a probe passes), and sm_90 builds read in their PTX: griddepcontrol.wait before the first
global load of a PDL program and none in the others, every load before launch_dependents and
every store after it, the fp8 scaling by a reciprocal and its 16-byte stores. With a CUDA device
the fused kernels' candidate settings also run against the eager composition.
"""
import dataclasses
import math
import re

import pytest
import torch

from impls import pdl, registry
from impls.base import NormSpec, cuda_present
from impls.fused import FusedSpec
from impls.tilelang import compiler
from tests.test_tilelang import _need_compiler
from impls.tilelang.fused import (FP8_SCALES, TileLangAddRMSNorm, TileLangRMSNormFused, _compile, choose_out_vec,
                                  fp8_scale_argument, fused_plan)
from impls.tilelang.plan import DECODE_MAX_ROWS, make_plan

HAS_CUDA = cuda_present()


@pytest.fixture
def hopper(monkeypatch):
    """As on an sm_90 device: PDL runs on CUDA wherever the switch is on."""
    real = pdl.unavailable
    monkeypatch.setattr(pdl, "unavailable", lambda dev: None if torch.device(dev).type == "cuda" else real(dev))


def _plain(op, variant):
    registry.load_builtins()
    return registry.get(op, "tilelang", variant)


def _fused(op):
    registry.load_builtins()
    return registry.get(op, "tilelang", "fused")


def _spec(op="rms_norm", n=4096, rows=1, dtype=torch.bfloat16):
    return NormSpec(op=op, dtype=dtype, rows=rows, n=n, row_stride=n, device="cuda", has_weight=True,
                    has_bias=op == "layer_norm")


def _fspec(op="add_rms_norm", n=4096, rows=1, dtype=torch.bfloat16, **kw):
    return FusedSpec(op=op, dtype=dtype, rows=rows, n=n, row_stride=n, device="cuda", has_weight=True,
                     has_bias=op.endswith("layer_norm"), residual_dtype=dtype if op.startswith("add_") else None, **kw)


# -- plans (no compiler) ------------------------------------------------------------------------
def test_declarations():
    assert _plain("rms_norm", "fragment").pdl and _plain("layer_norm", "layer_norm_fwd").pdl
    for variant in ("naive_row_per_block", "splitk", "cluster"):
        assert not _plain("rms_norm", variant).pdl
    registry.load_builtins()
    assert all(k.pdl for k in registry.kernels(["tilelang"], family="fused"))


def test_plain_kernels_take_pdl_at_few_rows_where_the_switch_is_on(hopper):
    frag = _plain("rms_norm", "fragment")
    for rows in (1, 64, DECODE_MAX_ROWS):
        with pdl.forced(True):
            on = frag.compile_key(_spec(rows=rows))
        with pdl.forced(False):
            off = frag.compile_key(_spec(rows=rows))
        assert on.pdl and not off.pdl and on != off  # another program, compiled and cached apart
        assert on.threads_per_row == off.threads_per_row and on.rows_per_block == 1
    with pdl.forced(True):
        assert not frag.compile_key(_spec(rows=DECODE_MAX_ROWS + 1)).pdl  # many rows: nothing to hide
        assert not _plain("rms_norm", "splitk").compile_key(_spec(rows=1)).pdl  # no PDL form
        ln = _plain("layer_norm", "layer_norm_fwd")
        assert ln.compile_key(_spec("layer_norm", 8192)).pdl
        # weight and bias beside 128 values a thread would spill (plan.pdl_fits); beyond the
        # register capacity the two-pass program has no PDL form
        assert not ln.compile_key(_spec("layer_norm", 16384)).pdl
        assert not ln.compile_key(_spec("layer_norm", 65536)).pdl
        x = torch.empty(1, 4096, dtype=torch.bfloat16)  # a CPU tensor: no CUDA launch, no PDL
        assert not frag._launch_plan(x, x, None).pdl


def test_without_a_device_nothing_launches_with_pdl():
    if HAS_CUDA:
        pytest.skip("a CUDA device is present")
    with pdl.forced(True):
        assert not _plain("rms_norm", "fragment").compile_key(_spec()).pdl
        assert not _fused("add_rms_norm").compile_key(_fspec()).pdl


@pytest.mark.parametrize("rows", [1, 64])
def test_fused_decode_rule_is_one_row_a_block_and_pdl(hopper, rows):
    k = _fused("add_rms_norm")
    for n in (1024, 4096, 8192):
        with pdl.forced(True):
            few = k.compile_key(_fspec(n=n, rows=rows))
        with pdl.forced(False):
            off = k.compile_key(_fspec(n=n, rows=rows))
        many = k.compile_key(_fspec(n=n, rows=DECODE_MAX_ROWS + 1))
        assert few.rows_per_block == 1 and few.min_blocks == 1 and few.pdl and not many.pdl
        assert off == dataclasses.replace(few, pdl=False) and off != few
        assert (few.threads_per_row, few.padded) == (many.threads_per_row, many.padded)  # the same reduction
    assert k.compile_key(_fspec(n=1024, rows=DECODE_MAX_ROWS + 1)).rows_per_block == 2
    with pdl.forced(True):
        assert not k.compile_key(_fspec(n=65536, rows=1)).pdl  # read twice: no PDL form


def test_fused_plan_settings_for_a_probe(hopper):
    k = TileLangRMSNormFused()
    spec = _fspec("rms_norm", 4096, 16384, out_dtype=torch.float8_e4m3fn)
    default = k.compile_key(spec)
    assert (default.out_vec, default.fp8_scale, default.pdl, default.group) == (16, "host_reciprocal", False, 16)
    k.plan_settings = {"fp8_scale": "divide", "out_vec": 8, "threads_per_row": 256, "pdl": True}
    p = k.compile_key(spec)
    assert (p.fp8_scale, p.out_vec, p.group, p.threads_per_row, p.pdl) == ("divide", 8, 8, 256, True)
    assert p.padded % (256 * 8) == 0 and p.rows_per_block == 1
    k.plan_settings = {"out_vec": 16}
    assert k.compile_key(_fspec("rms_norm", 4104, 8, out_dtype=torch.float8_e4m3fn)).out_vec == 8  # N: 8 at most
    k.plan_settings = {"warps": 4}
    with pytest.raises(TypeError):
        k.compile_key(spec)
    with pytest.raises(ValueError, match="fp8_scale"):
        fused_plan("rms_norm", "bfloat16", 4096, True, False, 8, out_dtype="float8_e4m3fn", fp8_scale="recip")
    assert _fused("rms_norm").plan_settings == {}  # the registered kernel's rules untouched


def test_fp8_out_vec_rule():
    assert choose_out_vec(4096) == 16 and choose_out_vec(5000) == 8 and choose_out_vec(769) == 1
    assert choose_out_vec(4096, (4104,)) == 8 and choose_out_vec(4096, (), (4,)) == 4
    # a bf16 x: 16 fp8 values (16 bytes) a thread, two of x's vectors; float32 x: four
    for dtype, vec in (("bfloat16", 8), ("float32", 4)):
        p = fused_plan("rms_norm", dtype, 4096, True, False, vec, out_dtype="float8_e4m3fn")
        assert p.out_vec == p.group == 16 and p.padded % (p.threads_per_row * 16) == 0
    plain = fused_plan("rms_norm", "bfloat16", 4096, True, False, 8, weight_offset=1.0)
    assert plain.out_vec is None and plain.group == 8


@pytest.mark.parametrize("scale", [0.05, 1 / 3, 3.0, 448.0, 1e-3, 7.1e-39, 1e-46, 1e39, 2.0 ** -126])
def test_host_reciprocal_is_the_float32_reciprocal(scale):
    p = fused_plan("rms_norm", "bfloat16", 4096, True, False, 8, out_dtype="float8_e4m3fn")
    got = fp8_scale_argument(p, scale)
    want = (torch.tensor(1.0) / torch.tensor(scale, dtype=torch.float32)).item()
    assert got == want or (math.isinf(got) and math.isinf(want))
    for form in ("divide", "reciprocal"):
        other = fused_plan("rms_norm", "bfloat16", 4096, True, False, 8, out_dtype="float8_e4m3fn", fp8_scale=form)
        assert fp8_scale_argument(other, scale) == scale
    assert fp8_scale_argument(fused_plan("rms_norm", "bfloat16", 4096, True, False, 8), None) == 1.0


# -- builds for sm_90, read in their PTX --------------------------------------------------------
_LOAD = re.compile(r"^\s*(@%p\d+\s+)?ld\.global", re.M)
_STORE = re.compile(r"^\s*(@%p\d+\s+)?st\.global", re.M)


def _ptx(plan):
    compiled = _compile(plan, compiler.SM90)
    return compiled.source(), compiler.ptx(compiled)


def _pdl_order(ptx: str) -> None:
    """griddepcontrol.wait before the first global load; launch_dependents after the last load and
    before the first store (the weight loaded with the row: no load waits behind a store)."""
    wait, trigger = ptx.index("griddepcontrol.wait"), ptx.index("griddepcontrol.launch_dependents")
    loads, stores = [m.start() for m in _LOAD.finditer(ptx)], [m.start() for m in _STORE.finditer(ptx)]
    assert loads and stores
    assert wait < loads[0], "a global load before griddepcontrol.wait"
    assert loads[-1] < trigger < stores[0]


@pytest.fixture(scope="module")
def plain_builds():
    _need_compiler()
    plan = make_plan("fragment", torch.bfloat16, 4096, True, False, 8, m=1)
    return {"pdl": _ptx(dataclasses.replace(plan, pdl=True)), "plain": _ptx(plan)}


def test_plain_pdl_program_waits_before_its_loads(plain_builds):
    src, ptx = plain_builds["pdl"]
    assert "cudaGridDependencySynchronize();" in src
    _pdl_order(ptx)
    # TileLang's codegen drops __restrict__ with PDL: the loads are ld.global, not ld.global.nc
    assert "__restrict__" not in src[src.index("main_kernel("):] and ".nc" not in ptx


def test_plain_program_without_pdl_has_no_wait(plain_builds):
    src, ptx = plain_builds["plain"]
    assert "griddepcontrol" not in ptx and "cudaGridDependencySynchronize" not in src
    assert "__restrict__" in src and "ld.global.nc" in ptx


@pytest.fixture(scope="module")
def fused_builds():
    _need_compiler()
    k = TileLangAddRMSNorm()
    return {"decode_pdl": _ptx(k.build_plan(("bfloat16", 4096, "same", None, 0.0, "new", "decode_pdl"))),
            "plain": _ptx(k.build_plan(("bfloat16", 4096, "same", None, 0.0, "new")))}


def test_fused_pdl_program_waits_before_its_loads(fused_builds):
    src, ptx = fused_builds["decode_pdl"]
    assert "cudaGridDependencySynchronize();" in src and "cudaTriggerProgrammaticLaunchCompletion();" in src
    _pdl_order(ptx)
    assert len(_LOAD.findall(ptx)) == 12  # x, residual and weight: 4 vectors each, all before the stores


def test_fused_program_without_pdl_has_no_wait(fused_builds):
    _, ptx = fused_builds["plain"]
    assert "griddepcontrol" not in ptx and "ld.global.nc" in ptx


@pytest.fixture(scope="module")
def fp8_builds():
    _need_compiler()
    out = {}
    for form in FP8_SCALES:
        out[form] = _ptx(fused_plan("rms_norm", "bfloat16", 4096, True, False, 8, out_dtype="float8_e4m3fn",
                                    fp8_scale=form))
    out["out_vec_8"] = _ptx(fused_plan("rms_norm", "bfloat16", 4096, True, False, 8, out_dtype="float8_e4m3fn",
                                       out_vec=8))
    return out


def test_fp8_scaling_by_a_reciprocal(fp8_builds):
    count = lambda form, op: len(re.findall(rf"\b{op}\.rn\.f32", fp8_builds[form][1]))  # noqa: E731
    # host_reciprocal: no division; reciprocal: 1/scale once a thread (rcp.rn, IEEE); divide: one
    # division a value (32 a thread)
    assert count("host_reciprocal", "div") == count("host_reciprocal", "rcp") == 0
    assert count("reciprocal", "div") == 0 and count("reciprocal", "rcp") == 1
    assert count("divide", "div") == 32
    for form in FP8_SCALES:  # saturation kept: the compares before the RNE, satfinite conversion
        src, ptx = fp8_builds[form]
        assert "cvt.rn.satfinite.e4m3x2.f32" in ptx and "0x1.cp+8f" in src


def test_fp8_y_stores_16_bytes_a_thread(fp8_builds):
    assert "*(fp8_e4_16_t*)(Y + " in fp8_builds["host_reciprocal"][0]
    assert "*(fp8_e4_8_t*)(Y + " in fp8_builds["out_vec_8"][0]
    # x still loads in 16-byte vectors, two a group of 16 columns
    assert "ld.global.nc.v4.u32" in fp8_builds["host_reciprocal"][1]


# -- on a GPU -----------------------------------------------------------------------------------
GPU_SETTINGS = [{}, {"fp8_scale": "divide"}, {"fp8_scale": "reciprocal"}, {"out_vec": 8},
                {"fp8_scale": "divide", "out_vec": 8, "threads_per_row": 256}]


@pytest.mark.parametrize("rows", [1, 64, 1000])
@pytest.mark.parametrize("settings", GPU_SETTINGS, ids=lambda s: "-".join(f"{k}={v}" for k, v in s.items()) or "rule")
def test_fp8_settings_match_the_eager_composition(settings, rows):
    if not HAS_CUDA:
        pytest.skip("no CUDA device: the kernel cannot execute here (its sm_90 builds are checked above)")
    g = torch.Generator(device="cuda").manual_seed(rows)
    x = torch.randn(rows, 4096, device="cuda", generator=g).to(torch.bfloat16)
    r = torch.randn(rows, 4096, device="cuda", generator=g).to(torch.bfloat16)
    w = (1 + 0.1 * torch.randn(4096, device="cuda", generator=g)).to(torch.bfloat16)
    x[0, 7] = float("nan")
    kw = dict(out_dtype=torch.float8_e4m3fn, scale=0.05)
    ref = registry.get("add_rms_norm", "torch", "fused")(x.clone(), r.clone(), w, **kw)
    k = TileLangAddRMSNorm()
    k.plan_settings = settings
    got = k(x.clone(), r.clone(), w, **kw)
    torch.testing.assert_close(got.residual_out, ref.residual_out, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(got.y.float(), ref.y.float(), rtol=2.0 ** -3, atol=2.0 ** -9, equal_nan=True)
    assert torch.isnan(got.y.float()[0]).all()


@pytest.mark.parametrize("rows", [1, 64])
def test_pdl_forms_give_the_bits_of_the_others(rows):
    """The PDL forms only wait, trigger and load the weight and bias earlier: the same bits."""
    why = "no CUDA device" if not HAS_CUDA else pdl.unavailable("cuda")
    if why:
        pytest.skip(f"PDL cannot run here: {why}")
    g = torch.Generator(device="cuda").manual_seed(rows)
    x, r = (torch.randn(rows, 4096, device="cuda", generator=g).to(torch.bfloat16) for _ in range(2))
    w, b = ((1 + 0.1 * torch.randn(4096, device="cuda", generator=g)).to(torch.bfloat16) for _ in range(2))
    for kernel, args in ((_plain("rms_norm", "fragment"), (x, w)), (_plain("layer_norm", "layer_norm_fwd"), (x, w, b)),
                         (_fused("add_rms_norm"), (x, r, w)), (_fused("add_layer_norm"), (x, r, w, b))):
        outs = []
        for on in (True, False):
            with pdl.forced(on):
                assert kernel.compile_key(_fspec(kernel.op, rows=rows) if kernel.family == "fused"
                                          else _spec(kernel.op, rows=rows)).pdl == on
                outs.append({k: v.clone() for k, v in kernel(*(a.clone() for a in args)).fields().items()})
        for name, t in outs[0].items():
            assert torch.equal(t, outs[1][name]), (kernel.name, name)
