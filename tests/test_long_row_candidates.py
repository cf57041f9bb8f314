"""The long-row candidates that tools/long_row_probe.py times on the GPU (impls/triton/_candidates.py)
are right before any device time is spent on them: under Triton's interpreter, against the float64
oracle, with a padded last chunk, an uneven share of rows per program, large-mean rows, every
affine combination, and a row's bits independent of how many rows share the call."""
import pytest
import torch

import impls.triton as tri
from impls.reference import reference

pytestmark = pytest.mark.skipif(tri.availability() is not None, reason=f"triton cannot run: {tri.availability()}")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _inputs(op, m, n, dtype, weight, bias, large_mean=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, n, generator=g, dtype=torch.float64)
    if large_mean:
        x = x + 1e4
    w = (1 + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)) if weight else None
    b = (0.1 * torch.randn(n, generator=g, dtype=torch.float64)) if (bias and op == "layer_norm") else None
    to = lambda t: None if t is None else t.to(dtype).to(DEVICE)  # noqa: E731
    return to(x), to(w), to(b)


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("programs_per_sm", [1, 2])
@pytest.mark.parametrize("affine", ["weight_bias", "none"])
def test_pipelined_matches_the_oracle(op, dtype, programs_per_sm, affine):
    from impls.triton._candidates import pipelined

    m, n, eps = 5, 3000, 1e-5  # 3 chunks of 1024, the last padded; 5 rows over 2 or 4 programs
    x, w, b = _inputs(op, m, n, dtype, affine != "none", affine == "weight_bias", large_mean=op == "layer_norm")
    k = pipelined(op, programs_per_sm, block_n=1024, warps=4)
    out = k(x, w, b, eps)
    ref = reference(op, x, w, b, eps)
    scale = ref.y.abs().max().item()
    tol = 2 ** -7 if dtype != torch.float32 else 2e-5
    assert (out.y.double() - ref.y).abs().max().item() <= tol * max(scale, 1.0)
    assert ((out.rstd.double() - ref.rstd).abs() / ref.rstd).max().item() <= 1e-4
    if op == "layer_norm":
        assert ((out.mean.double() - ref.mean).abs() / ref.mean.abs()).max().item() <= 1e-6
    alone = k(x[:2].contiguous(), w, b, eps)  # a row's bits do not move with M or the grid
    assert torch.equal(alone.y, out.y[:2])


def test_pipelined_takes_one_row_and_rows_of_one_chunk():
    from impls.triton._candidates import pipelined

    for op in ("rms_norm", "layer_norm"):
        for m, n in ((1, 3000), (3, 1000)):
            x, w, b = _inputs(op, m, n, torch.float32, True, True, seed=1)
            out = pipelined(op, 1, block_n=1024, warps=4)(x, w, b, 1e-5)
            ref = reference(op, x, w, b, 1e-5)
            assert (out.y.double() - ref.y).abs().max().item() <= 2e-5 * max(ref.y.abs().max().item(), 1.0)


def test_pipelined_compiles_for_sm90_without_spills():
    """Compiled for sm_90 (Triton's own ptxas, no GPU needed) at the long-row setting the looped
    kernels use (BLOCK_N 8192, 32 warps), both ops, bf16 and float32: no stack, registers within
    a thread's 255. A subprocess: this one may run the interpreter, whose kernels cannot compile."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = r'''
import json, torch, triton
from impls.triton import _candidates as c
from tools.triton_resources import compile_sm90, _usage
out = []
for op, fn in (("rms_norm", c.rms_norm_pipelined), ("layer_norm", c.layer_norm_pipelined)):
    for dtype in (torch.bfloat16, torch.float32):
        n = 262144
        x = torch.empty(2, n, dtype=dtype); w = torch.empty(n, dtype=dtype)
        s = torch.empty(2, dtype=torch.float32)
        tensors = (x, w, x, s) if op == "rms_norm" else (x, w, w, x, s, s)
        meta = dict(HAS_WEIGHT=True, BLOCK_N=8192, ROUND_BF16=False, num_warps=32)
        if op == "layer_norm":
            meta["HAS_BIAS"] = True
        compiled = compile_sm90(fn, (*tensors, 2048, n, n, n, 1e-5, 132, 16), meta)
        regs, stack = _usage(compiled)
        out.append({"op": op, "dtype": str(dtype), "registers": regs, "stack": stack})
print(json.dumps(out))
'''
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", script], cwd=root, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(rows) == 4
    for r in rows:
        assert r["stack"] == 0 and 0 < r["registers"] <= 255, r


def test_pipelined_takes_the_looped_setting_unless_told():
    import torch as t

    from impls.triton._candidates import pipelined
    from impls.triton.settings import launch_config

    for op in ("rms_norm", "layer_norm"):
        looped = launch_config(65536, t.bfloat16, looped=True, op=op)
        cfg = pipelined(op).config(65536, t.bfloat16, 8192)
        assert (cfg.block_n, cfg.num_warps, cfg.rows) == (looped.block_n, looped.num_warps, 1)
        assert pipelined(op, 2, 4096, 16).config(65536, t.bfloat16).block_n == 4096


def test_tilelang_pipelined_compiles_for_sm90_without_spills():
    """The TileLang candidate (impls/tilelang/_candidates.py) built for sm_90 with nvcc at the
    probe's N, a padded N and float32: an sm_90 binary, registers within 255, no spills. It
    cannot run here; the probe's checks on the GPU are its first run."""
    from impls.tilelang import compiler

    tl, why = compiler.tilelang_module()
    if tl is None:
        pytest.skip(why)
    if compiler.nvcc_path() is None:
        pytest.skip("nvcc not found (CUDA_HOME or PATH): TileLang cannot compile CUDA kernels here")
    from impls.tilelang._candidates import compile_offline

    for dtype, n in (("bfloat16", 65536), ("bfloat16", 100000), ("float32", 262144)):
        r = compile_offline(dtype, n)
        assert r["sass_arch"] == "sm_90" and r["registers"] is not None and r["registers"] <= 255, r
        assert r["spill_stores"] == 0 and r["spill_loads"] == 0, r
