"""apex's dx on the two drawn float32 cases that fail on the GPU, against float64 autograd.

apex's cuComputeGradInput (csrc/layer_norm_cuda_kernel.cu) multiplies each element's dy by
clamp_by_magnitude(gamma, eps) (|gamma| raised to eps), without memory_efficient too, while its row
sums take gamma as it is: where |w_j| < eps, dx_j moves by rstd * dy_j * (clamp(w_j) - w_j).
Per case: x, w, b, dy as the GPU harness draws them (a CUDA generator; on a CPU, tools.cuda_draws);
apex's forward then backward as impls/apex.py calls them, where fused_layer_norm_cuda imports on a
GPU; a float32 emulation of cuComputeGradInput (per-thread sums, shuffles, shared-memory merge, fused
multiply-adds) on apex's saved statistics (the oracle's, rounded, without apex), with and without
the clamp.   PYTHONPATH=. python -m tools.apex_one_row
"""
from __future__ import annotations

import importlib

import numpy as np
import torch
import torch.nn.functional as F

from harness.judging import compare_backward
from harness.judging.cases import case_from_id
from harness.judging.inputs import make_dy, make_inputs
from impls.base import NormGrads
from impls.reference import reference
from tools.cuda_draws import cuda_draws

FAILING = ("layer_norm-float32-1x483-normal-eps0.001-dynormal", "rms_norm-float32-1x1x129-normal-eps0.001-dynormal")
NEIGHBOURS = ("layer_norm-float32-2x483-normal-eps0.001-dynormal", "layer_norm-float32-1x484-normal-eps0.001-dynormal",
              "layer_norm-float32-1x483-normal-dynormal", "rms_norm-float32-2x129-normal-eps0.001-dynormal",
              "rms_norm-float32-1x129-normal-eps0.001-dynormal", "rms_norm-float32-1x1x129-normal-eps0.1-dynormal")
F32 = np.float32


def draw(case, device: str) -> list:
    """x, weight, bias and dy as the harness draws them on a GPU (on a CPU: tools.cuda_draws)."""
    if device != "cuda":
        return cuda_draws(case)
    inputs = make_inputs(case, device)
    return [inputs.x, inputs.weight, inputs.bias, make_dy(case, device)[0]]


def emulate_dx(op, x, w, dy, mean, rstd, eps, clamp=True) -> np.ndarray:
    """cuComputeGradInput<float, float, float, MemoryEfficient=false> with gamma: a row a block of 32 x 4."""
    x, dy, ln = x.reshape(-1, x.shape[-1]), dy.reshape(-1, x.shape[-1]), op == "layer_norm"
    n, out, steps = x.shape[1], np.empty_like(x), []
    for t in range(128):  # thread t: 4 t + 512 j + (0..3) while all four fit, then the tail one by one
        idx, l = [], 4 * t
        while l + 3 < n:
            idx, l = idx + [l, l + 1, l + 2, l + 3], l + 512
        steps.append(idx + list(range(l, n)))
    at = np.array([s + [-1] * (max(map(len, steps)) - len(s)) for s in steps])
    fma = lambda a, b, c: (np.float64(a) * b + c).astype(F32)
    k_gamma = np.where(w >= 0, np.maximum(w, F32(eps)), np.minimum(w, F32(-eps))) if clamp else w
    for r in range(x.shape[0]):
        m, iv, s1, s2 = F32(mean[r] if ln else 0), F32(rstd[r]), np.zeros(128, F32), np.zeros(128, F32)
        for j in range(at.shape[1]):
            on, i = at[:, j] >= 0, np.maximum(at[:, j], 0)
            s1 = np.where(on, fma(dy[r, i], w[i], s1), s1)
            s2 = np.where(on, fma((dy[r, i] * w[i]) * (x[r, i] - m), iv, s2), s2)
        for s in (s1, s2):  # xor shuffles 16..1 in each warp; warps 2, 3 into 0, 1; then 1 into 0
            v = s.reshape(4, 32)
            for mask in (16, 8, 4, 2, 1):
                v = v + v[:, np.arange(32) ^ mask]
            s[:] = ((v[0] + v[2]) + (v[1] + v[3]))[0]
        f = (F32(n) * dy[r]) * k_gamma - (s1[0] if ln else F32(0))
        out[r] = fma(-((x[r] - m) * iv), s2[0], f) * ((F32(1) / F32(n)) * iv)
    return out


def judge(op, x, w, b, dy, eps, got) -> str:
    """Worst |dx - float64 autograd| / the harness's allowance (> 1 fails), rel L2 error, @ its index."""
    x64 = x.double().requires_grad_()
    y = F.layer_norm(x64, x.shape[-1:], w.double(), b.double(), eps) if op == "layer_norm" else \
        F.rms_norm(x64, x.shape[-1:], w.double(), eps)
    want = NormGrads(dx=torch.autograd.grad(y, x64, dy.double())[0])
    ref = compare_backward.BackwardReference(op, x, dy, w, b, want, reference(op, x, None, None, eps))
    s = compare_backward.compare_grads(NormGrads(dx=torch.as_tensor(got).reshape(x.shape).to(x.device)), ref,
                                       torch.float32, torch.float32)[0]
    return f"{s.worst_ratio:7.2f}x {s.rel_l2:8.2g} @{s.worst_index[-1]:<4}"


def run_case(case_id: str, device: str, ext) -> None:
    case = case_from_id(case_id)
    (x, w, b, dy), op, eps, n = draw(case, device), case.op, case.eps_value, [case.n]
    small = [(j, round(float(w[j]), 6)) for j in (w.abs() < eps).nonzero().flatten().tolist()]
    fwd, line = reference(op, x, None, None, eps), f"{case_id:<50} w below eps {small}"
    stats = [fwd.mean.float() if op == "layer_norm" else None, fwd.rstd.float()]
    if ext is not None:  # as impls/apex.py: the forward, then the backward on its saved mean and invvar
        from impls.apex import _backward_call
        if op == "layer_norm":
            stats = ext.forward_affine(x, n, w, b, eps)[1:]
            got = _backward_call(ext.backward_affine, dy, *stats, x, n, w, b, eps)[0]
        else:
            stats = [None, ext.rms_forward_affine(x, n, w, eps)[1]]
            got = _backward_call(ext.rms_backward_affine, dy, stats[1], x, n, w, eps)[0]
        em = [t.numpy() for t in cuda_draws(case)[:2]]  # the CPU's emulation of these CUDA draws
        line += (f" | emulated draws: x {'==' if (em[0] == x.cpu().numpy()).all() else '!='}, w within "
                 f"{np.abs(em[1] - w.cpu().numpy()).max():.1g} | apex {judge(op, x, w, b, dy, eps, got)}")
    args = [op, x.cpu().numpy(), w.cpu().numpy(), dy.cpu().numpy(), *[t if t is None else t.cpu().reshape(-1).numpy()
                                                                       for t in stats], eps]
    line += f" | emulated {judge(op, x, w, b, dy, eps, emulate_dx(*args))}"
    print(line + f" | no clamp {judge(op, x, w, b, dy, eps, emulate_dx(*args, clamp=False))}")


def main() -> None:
    device, ext = ("cuda" if torch.cuda.is_available() else "cpu"), None
    try:
        ext = importlib.import_module("fused_layer_norm_cuda") if device == "cuda" else None
    except ImportError:
        pass
    print(("apex's fused_layer_norm_cuda present: apex, then the emulation" if ext is not None else
           "apex absent (no fused_layer_norm_cuda or no GPU): the emulation alone, on the CUDA draws emulated")
          + "; each dx: worst |error| / allowance, rel L2 error, @ its index")
    for case_id in FAILING + NEIGHBOURS:
        run_case(case_id, device, ext)


if __name__ == "__main__":
    main()
