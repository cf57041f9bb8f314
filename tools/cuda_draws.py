"""A case's inputs as the harness draws them on a GPU, rebuilt on a CPU.

harness.judging.inputs.make_inputs and make_dy draw on the device they test: on a GPU with a CUDA
generator, whose numbers are not a CPU generator's for the same seed. ``cuda_draws`` emulates
torch's CUDA randn (distribution_elementwise_grid_stride_kernel in
ATen/native/cuda/DistributionTemplates.h over curand's Philox4x32-10 and Box-Muller), so that a
failure seen on a GPU can be studied here. x and dy (float64 draws) come out bit for bit; the
weight and bias (float32 draws, whose Box-Muller uses the approximate __sincosf, taken as exact
here) within about 1e-6. Normal x and dy only, without padding between rows; the launch is sized
as on an H100 or H200 (132 SMs of 2048 threads), which matters only beyond 270336 elements.
"""
from __future__ import annotations

import numpy as np
import torch

F32, U64, LO = np.float32, np.uint64, np.uint64(0xFFFFFFFF)
MAX_BLOCKS = 132 * 2048 // 256


def cuda_randn(seed: int, offset: int, numel: int, double: bool) -> tuple[np.ndarray, int]:
    """torch.randn(numel) on a CUDA generator seeded ``seed`` at Philox offset ``offset`` (float64
    or float32), and the generator's offset after it."""
    unroll, stride = (2 if double else 4), 256 * min(MAX_BLOCKS, -(-numel // 256))
    li = np.arange(numel, dtype=U64)  # element li: thread li % stride, its (li // (unroll stride))-th call
    c = [U64(offset // 4) + li // U64(unroll * stride), 0 * li, li % U64(stride), 0 * li]
    key = [U64(seed) & LO, U64(seed >> 32)]
    for _ in range(10):  # Philox4x32-10
        p0, p1 = U64(0xD2511F53) * c[0], U64(0xCD9E8D57) * c[2]
        c = [(p1 >> U64(32)) ^ c[1] ^ key[0], p1 & LO, (p0 >> U64(32)) ^ c[3] ^ key[1], p0 & LO]
        key = [(key[0] + U64(0x9E3779B9)) & LO, (key[1] + U64(0xBB67AE85)) & LO]
    if double:  # curand_normal2_double: one Box-Muller pair from the four words
        u = (c[0] ^ (c[1] << U64(21))).astype(np.float64) * 2.0**-53 + 2.0**-54
        v = (c[2] ^ (c[3] << U64(21))).astype(np.float64) * 2.0**-52 + 2.0**-53  # sincospi(v)
        pairs = [(np.sqrt(-2 * np.log(u)), np.pi * v)]
    else:  # curand_normal4: two float pairs, u and v from one word each
        step = F32(F32(2.0**-32) * F32(6.2831855))
        pairs = [(np.sqrt(F32(-2) * np.log(c[a].astype(F32) * F32(2.0**-32) + F32(2.0**-33))),
                  (c[a + 1].astype(F32).astype(np.float64) * step + step / 2).astype(F32)) for a in (0, 2)]
    out = np.choose((li % U64(unroll * stride) // U64(stride)).astype(np.int64),
                    [f(v.astype(np.float64)) * s for s, v in pairs for f in (np.sin, np.cos)])
    return (out if double else out.astype(F32)), offset + ((numel - 1) // (unroll * stride) + 1) * 4


def cuda_draws(case) -> list:
    """[x, weight, bias, dy] of a harness.judging.cases.Case as a GPU run draws them (CPU tensors, x's
    dtype float32 only; weight or bias None where the case has none)."""
    if case.dist != "normal" or case.row_pad or case.dy_dist != "normal" or case.dtype != "float32":
        raise ValueError(f"{case.id}: only float32 cases with normal x and dy and no padding are emulated")
    x, off = cuda_randn(case.seed, 0, case.rows * case.n, True)
    w = b = None
    if case.has_weight:
        w, off = cuda_randn(case.seed, off, case.n, False)
        w = torch.from_numpy(F32(1) + F32(0.5) * w)
    if case.has_bias:
        b = torch.from_numpy(F32(0.5) * cuda_randn(case.seed, off, case.n, False)[0])
    dy = cuda_randn(case.dy_seed, 0, case.rows * case.n, True)[0]
    return [torch.from_numpy(x).float().reshape(case.shape), w, b, torch.from_numpy(dy).float().reshape(case.shape)]
