"""Run one kernel on one shape a few times, for a profiler to wrap (CUDA; nothing is timed here).

    ncu --clock-control none -k regex:cluster --launch-skip 3 --launch-count 1 \
        --section SpeedOfLight --section WarpStateStats --section Occupancy \
        python -m tools.profile_target --op layer_norm --kernel tilelang.layer_norm_cluster --shape 4096x131072

--backward runs the kernel's backward instead (the forward once first, for its saved statistics).
Inputs: bfloat16 unless --dtype says otherwise, weight (and bias for LayerNorm) present unless
--no-affine (the forward without them: what the weight and bias reads cost).
"""
from __future__ import annotations

import argparse

import torch


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--op", required=True, choices=("rms_norm", "layer_norm"))
    p.add_argument("--kernel", required=True, help="backend.variant, e.g. triton.split")
    p.add_argument("--shape", required=True, help="MxN")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--backward", action="store_true")
    p.add_argument("--no-affine", action="store_true", help="the forward without weight and bias")
    args = p.parse_args(argv)
    from impls import registry
    from impls.base import DEFAULT_EPS, NormGrads

    registry.load_builtins()
    backend, variant = args.kernel.split(".", 1)
    k = registry.get(args.op, backend, variant)
    m, n = (int(v) for v in args.shape.lower().split("x"))
    dtype = getattr(torch, args.dtype)
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(m, n, generator=g, device="cuda").to(dtype)
    w = (1 + 0.1 * torch.randn(n, generator=g, device="cuda")).to(dtype)
    b = (0.1 * torch.randn(n, generator=g, device="cuda")).to(dtype) if args.op == "layer_norm" else None
    eps = DEFAULT_EPS[args.op]
    if args.no_affine:
        if args.backward:
            p.error("--no-affine is for the forward")
        w = b = None
    fwd = k(x, w, b, eps)
    if args.backward:
        dy = torch.randn_like(x)
        grads = NormGrads(torch.empty_like(x), torch.empty_like(w), None if b is None else torch.empty_like(b))
        for _ in range(args.calls):
            k.backward(x, w, b, dy, fwd, eps, grads)
    else:
        for _ in range(args.calls):
            k(x, w, b, eps)
    torch.cuda.synchronize()
    print(f"{args.op} {args.kernel} {m}x{n} {args.dtype}{' backward' if args.backward else ''}"
          f"{' no affine' if args.no_affine else ''}: {args.calls} calls")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
