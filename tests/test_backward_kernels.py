"""The backends' backward passes against the float64 oracle (impls.reference.reference_backward),
on small shapes: N in {1, 7, 129, 1000}, M in {1, 3, 17}, every weight/bias combination, strided
rows. Tolerances here are loose sanity bounds scaled to each output's size; the harness's
backward check holds the kernels to derived ones.

Triton runs under its interpreter without a GPU; its long-row form (a row-statistics pass, then
column blocks) is forced on small N through an explicit launch setting. Determinism and dx's batch
invariance, which the Triton backward claims, are checked bitwise here too.
"""
import dataclasses
import re

import pytest
import torch

from impls import registry
from impls.base import NormGrads, NormOutputs, UnsupportedCase
from impls.reference import reference_backward

registry.load_builtins()
EPS = {"rms_norm": 1e-6, "layer_norm": 1e-5}
# Relative to the largest |reference| of each output; per dtype, for outputs of O(1) rows.
TOL = {torch.float32: 2e-5, torch.bfloat16: 3e-2, torch.float16: 5e-3}
AFFINE = {"rms_norm": [(True, False), (False, False)],
          "layer_norm": [(True, True), (True, False), (False, True), (False, False)]}


def _inputs(op, m, n, dtype, has_w, has_b, stride=None, seed=0):
    g = torch.Generator().manual_seed(seed + 131 * m + n)
    rows = torch.randn(m, stride or n, generator=g, dtype=torch.float64)
    x = (rows + (3.0 if op == "layer_norm" else 0.0)).to(dtype)[:, :n]
    dy = torch.randn(m, n, generator=g, dtype=torch.float64).to(dtype)
    w = (1 + 0.5 * torch.randn(n, generator=g, dtype=torch.float64)).to(dtype) if has_w else None
    b = (0.5 * torch.randn(n, generator=g, dtype=torch.float64)).to(dtype) if has_b else None
    return x, dy, w, b


def _scale(op, x, dy, w):
    """The size of dx's terms: rstd * |g|, the largest over the rows (dx itself can cancel to
    nearly nothing, e.g. at N = 1, where only rounding is left)."""
    x64 = x.double()
    centred = x64 - x64.mean(-1, keepdim=True) if op == "layer_norm" else x64
    rstd = 1 / torch.sqrt(centred.square().mean(-1, keepdim=True) + EPS[op])
    g = dy.double() * (w.double() if w is not None else 1.0)
    return (rstd * g.abs()).max().item()


def _check(op, kernel, m, n, dtype, has_w, has_b, stride=None, cfg=None):
    x, dy, w, b = _inputs(op, m, n, dtype, has_w, has_b, stride)
    saved = kernel(x, w, b, EPS[op])
    if cfg is None:
        got = kernel.backward(x, w, b, dy, saved, EPS[op])
    else:  # an explicit launch setting: the 2-D call, as NormKernel.backward makes it
        got = NormGrads(torch.empty_like(x), None if w is None else torch.empty_like(w),
                        None if b is None else torch.empty_like(b))
        stats = NormOutputs(y=x, mean=None if saved.mean is None else saved.mean.view(-1), rstd=saved.rstd.view(-1))
        kernel._backward(x, w, b, dy, stats, EPS[op], got, cfg)
    want = reference_backward(op, x, dy, w, b, EPS[op])
    scale = {"dx": _scale(op, x, dy, w), "dw": None, "db": None}
    for name in ("dx", "dw", "db"):
        mine, ref = getattr(got, name), getattr(want, name)
        assert (mine is None) == (ref is None), name
        if ref is None:
            continue
        assert mine.dtype == dtype and mine.shape == ref.shape, name
        # dw, db: sums of m terms each of the size of |dy x^| (|dy|): their largest partial sum.
        size = scale[name] or (dy.double().abs() * (x.double().abs() + 1)).sum(0).max().item()
        err = (mine.double() - ref).abs().max().item()
        assert err <= TOL[dtype] * size, f"{kernel.name} {name}: error {err:.3g} > {TOL[dtype]:.0e} x {size:.3g}"
    return got


# -- Triton -------------------------------------------------------------------------------------
def _triton(op, variant):
    k = registry.get(op, "triton", variant)
    reason = k.unavailable()
    if reason:
        pytest.skip(reason)
    return k


@pytest.mark.parametrize("n", [1, 7, 129, 1000])
@pytest.mark.parametrize("m", [1, 3, 17])
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_triton_backward_matches_the_oracle(op, m, n):
    """Every affine combination, in float32; the variant users call (auto)."""
    kernel = _triton(op, "auto")
    for has_w, has_b in AFFINE[op]:
        _check(op, kernel, m, n, torch.float32, has_w, has_b)


@pytest.mark.parametrize("variant", ["invariant", "looped", "rowwise"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_triton_backward_in_16_bits_on_strided_rows(op, dtype, variant):
    kernel = _triton(op, variant)
    full = AFFINE[op][0]
    _check(op, kernel, 17, 129, dtype, *full, stride=160)
    _check(op, kernel, 3, 1000, dtype, *full, stride=1003)


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_triton_backward_long_row_form(op):
    """The form for rows beyond one tile, forced at small N: c1 and c2 from a statistics pass,
    then column blocks; an M tail (33 rows: a partial block of 1) and padded column blocks."""
    from impls.triton.backward import backward_config

    kernel = _triton(op, "invariant")
    for n, col in ((1000, 256), (129, 64)):
        cfg = backward_config(n, torch.float32, one_tile_max=32, col_block=col)
        assert not cfg.one_tile
        for has_w, has_b in AFFINE[op][:2]:
            _check(op, kernel, 33, n, torch.float32, has_w, has_b, stride=n + 5, cfg=cfg)


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_triton_backward_several_programs(op):
    """Explicit settings of few rows per program: several dw/db partials, a last program past M
    (33 rows), tiles of 1 and 2 rows, strided rows, 16-bit and float32."""
    from impls.triton.backward import backward_config

    kernel = _triton(op, "invariant")
    for dtype, n, setting in ((torch.float32, 129, (8, 2, 2)), (torch.bfloat16, 1000, (4, 1, 1)),
                              (torch.float16, 129, (16, 4, 4))):
        cfg = backward_config(n, dtype, setting=setting)
        assert (cfg.block_m, cfg.rows, cfg.num_warps) == setting
        _check(op, kernel, 33, n, dtype, *AFFINE[op][0], stride=n + 3, cfg=cfg)
    with pytest.raises(ValueError, match="must divide"):
        backward_config(129, torch.float32, setting=(6, 4, 2))


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_triton_backward_pipelined_form(op):
    """Settings with stages >= 2 (tiles ahead by Triton's software pipeline, not registers) give
    the same gradients: an M tail, padded N, strided rows, the one-tile and the long-row form.
    Stages of 1 or below 0, or a sixth field, are refused by name."""
    from impls.triton.backward import backward_config

    kernel = _triton(op, "invariant")
    for dtype, n, setting in ((torch.bfloat16, 1000, (8, 1, 2, 0, 3)), (torch.float32, 129, (16, 2, 2, 0, 2))):
        cfg = backward_config(n, dtype, setting=setting)
        assert (cfg.stages, cfg.maxnreg) == (setting[4], None)
        _check(op, kernel, 33, n, dtype, *AFFINE[op][0], stride=n + 3, cfg=cfg)
    long_form = dataclasses.replace(backward_config(1000, torch.float32, one_tile_max=32, col_block=256), stages=3)
    _check(op, kernel, 33, 1000, torch.float32, *AFFINE[op][0], stride=1005, cfg=long_form)
    for bad, match in (((8, 1, 2, 0, 1), "stages must be"), ((8, 1, 2, 0, -2), "stages must be"),
                       ((8, 1, 2, 0, 3, 9), "3 to 5 fields")):
        with pytest.raises(ValueError, match=match):
            backward_config(129, torch.float32, setting=bad)


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_triton_backward_is_deterministic_and_dx_batch_invariant(op):
    kernel = _triton(op, "invariant")
    assert kernel.backward_nondeterministic is None and kernel.backward_batch_invariant
    x, dy, w, b = _inputs(op, 40, 129, torch.bfloat16, True, op == "layer_norm")
    saved = kernel(x, w, b)
    first, again = (kernel.backward(x, w, b, dy, saved) for _ in range(2))
    for name, t in first.fields().items():
        assert torch.equal(t, getattr(again, name)), name
    part = kernel.backward(x[5:9], w, b, dy[5:9], kernel(x[5:9], w, b))  # the same rows in a batch of 4
    assert torch.equal(part.dx, first.dx[5:9])


def test_every_triton_kernel_has_a_backward():
    for k in registry.kernels(["triton"]):
        assert k.has_backward, k.name


# -- torch.compile ------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_torch_compile_backward_matches_the_oracle(op):
    kernel = registry.get(op, "torch_compile", "inductor")
    if kernel.unavailable():
        pytest.skip(kernel.unavailable())
    _check(op, kernel, 17, 129, torch.float32, *AFFINE[op][0], stride=140)


# -- peers that need a GPU ----------------------------------------------------------------------
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_apex_backward(op):
    """apex's backward entry points (a CUDA build of apex only); elsewhere refused with the reason."""
    kernel = registry.get(op, "apex")
    assert kernel.has_backward
    reason = kernel.unavailable()
    if reason:
        x, dy, w, b = _inputs(op, 2, 8, torch.float32, True, op == "layer_norm")
        stats = NormOutputs(y=x, mean=torch.zeros(2), rstd=torch.ones(2))
        with pytest.raises(UnsupportedCase, match="fused_layer_norm_cuda"):
            kernel.backward(x, w, b, dy, stats)
        pytest.skip(reason)
    for has_w, has_b in ((True, op == "layer_norm"), (False, False)):
        _check(op, kernel, 17, 129, torch.bfloat16, has_w, has_b, stride=160)


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_liger_plugin_backward(op):
    """Liger's backward through the plug-in (a CUDA machine with liger-kernel only); elsewhere
    refused with the reason."""
    from tests.test_peers import load_liger_plugin

    load_liger_plugin()
    kernel = registry.get(op, "liger")
    assert kernel.has_backward
    reason = kernel.unavailable()
    if reason:
        x, dy, w, b = _inputs(op, 2, 8, torch.float32, True, op == "layer_norm")
        with pytest.raises(UnsupportedCase, match="liger"):
            kernel.backward(x, w, b, dy, NormOutputs(y=x, mean=torch.zeros(2), rstd=torch.ones(2)))
        pytest.skip(reason)
    _check(op, kernel, 17, 129, torch.bfloat16, True, op == "layer_norm", stride=160)
    if op == "rms_norm":
        _check(op, kernel, 17, 129, torch.bfloat16, False, False)


# -- TileLang (compiled for sm_90 by harness/test_offline_compile.py; executed only on a GPU) ----
def test_tilelang_backward_is_declared_once_per_op_and_refused_without_a_gpu():
    from impls.tilelang.backward import BWD_MAX_N, backward_plan

    everyone = registry.kernels(["tilelang"])
    kernels = [k for k in everyone if k.has_backward]
    # Every kernel but the long-row cluster kernels, which start beyond the backward's N.
    assert {k.name for k in everyone} - {k.name for k in kernels} == {"tilelang.cluster", "tilelang.layer_norm_cluster"}
    assert kernels
    declared = {k.op for k in kernels for b in k.offline_builds() if b[0] == "backward"}
    assert declared == {"rms_norm", "layer_norm"}
    # The plan pads the row to whole vectors per thread, as the forward's, up to BWD_MAX_N.
    for n, vec in ((4000, 8), (769, 1), (BWD_MAX_N, 8), (1, 1)):
        plan = backward_plan("layer_norm", torch.bfloat16, n, True, vec)
        assert plan.padded >= n and plan.padded % (plan.threads_per_row * vec) == 0
    k = registry.get("layer_norm", "tilelang", "layer_norm_fwd")
    if k.unavailable():
        x, dy, w, b = _inputs("layer_norm", 2, 8, torch.float32, True, True)
        with pytest.raises(UnsupportedCase):
            k.backward(x, w, b, dy, NormOutputs(y=x, mean=torch.zeros(2), rstd=torch.ones(2)))
        pytest.skip(k.unavailable())
    for op, variant in (("rms_norm", "fragment"), ("layer_norm", "layer_norm_fwd")):
        kernel = registry.get(op, "tilelang", variant)
        for has_w, has_b in AFFINE[op]:
            _check(op, kernel, 17, 1000, torch.bfloat16, has_w, has_b, stride=1008)


def test_tilelang_backward_plan_rule(monkeypatch):
    """One vector a thread (up to 1024 threads at 16-byte vectors, 512 narrower), a launch bound
    aiming ptxas at 64 registers, db's partials only where db is asked for, and rows per block
    filling one wave of the GPU unless the plan fixes them."""
    from impls.tilelang import backward as bwd

    rms = bwd.backward_plan("rms_norm", torch.bfloat16, 1024, True, 8, has_bias=True)
    assert not rms.has_bias and rms.threads == 128 and rms.min_blocks == 8 and rms.prefetch
    assert bwd.backward_plan("layer_norm", torch.bfloat16, 1024, True, 8).has_bias
    assert not bwd.backward_plan("layer_norm", torch.bfloat16, 1024, True, 8, has_bias=False).has_bias
    wide = bwd.backward_plan("rms_norm", torch.bfloat16, bwd.BWD_MAX_N, True, 8)
    assert wide.threads == 1024 and wide.min_blocks == 1 and wide.padded == bwd.BWD_MAX_N
    assert bwd.backward_plan("rms_norm", torch.bfloat16, 8191, True, 1).threads == 512
    monkeypatch.setattr(bwd, "_SMS", {0: 132})
    assert rms.block_m is None and rms.block_rows(65536, "cuda:0") == 65536 // (132 * 8) + 1
    assert rms.block_rows(5, "cuda:0") == 1
    fixed = bwd.backward_plan("rms_norm", torch.bfloat16, 1024, True, 8, block_m=32)
    assert fixed.block_rows(65536, "cuda:0") == fixed.block_rows(7, "cuda:0") == 32


def test_tilelang_backward_loads_16_byte_vectors():
    """x and dy load as 16-byte vectors (two stores in one parallel loop had made TileLang's
    vectorizer fall back to 4-byte loads), under the plan's launch bound; RMSNorm's program
    keeps no db accumulator."""
    from impls.tilelang import compiler
    from impls.tilelang.backward import backward_plan

    tl, why = compiler.tilelang_module()
    if tl is None or compiler.nvcc_path() is None:
        pytest.skip(why or "nvcc not found")
    for op in ("rms_norm", "layer_norm"):
        plan = backward_plan(op, torch.bfloat16, 1024, True, 8)
        src = compiler.compile_plan(plan, compiler.SM90).source()
        for t in ("X", "DY"):
            assert f"*(uint4*)({t} + " in src and not re.search(rf"\*\(uint[12]\*\)\({t} \+", src), (op, t)
        assert "__launch_bounds__(128, 8)" in src
        assert ("adb[" in src) == (op == "layer_norm")


def test_tilelang_backward_capacity_is_a_skip_reason_not_a_failure():
    """A row longer than TileLang's backward holds is refused before any call (the check skips it
    with this reason; on the H200 it had failed inside the call)."""
    import torch

    from impls.base import NormSpec

    for op, variant in (("rms_norm", "fragment"), ("layer_norm", "layer_norm_fwd")):
        k = registry.get(op, "tilelang", variant)
        spec = NormSpec(op=op, dtype=torch.float32, rows=64, n=12345, row_stride=12345, device="cuda",
                        has_weight=True, has_bias=op == "layer_norm")
        assert "backward capacity (max 8192)" in k.backward_unsupported(spec)
