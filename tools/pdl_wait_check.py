"""The dependent-launch check's CPU twin: each Triton kernel that launches with PDL, its decode
launch compiled for sm_90 without a GPU (tools.triton_resources.compile_sm90) with PDL on, and
its PTX read for ``griddepcontrol.wait`` before the first global load
(harness.judging.dependent_launch.wait_before_loads). Runs in a process without Triton's
interpreter (the interpreter's kernels cannot be compiled).

    python -m tools.pdl_wait_check [--backend-file F] [--json]

Exit 1 where a kernel would read before it waits.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

SHAPE = (64, 4096)


def launches(kernels) -> list[tuple[str, object, tuple, dict]]:
    out = []
    m, n = SHAPE
    for k in kernels:
        x = torch.empty(m, n, dtype=torch.bfloat16)
        w = torch.empty(n, dtype=torch.bfloat16)
        b = torch.empty(n, dtype=torch.bfloat16) if k.op.endswith("layer_norm") else None
        if getattr(k, "family", "plain") == "fused":
            r = torch.empty_like(x) if k.op.startswith("add_") else None
            (fn, _, args, kwargs), = k.launches(x, r, w, b)
        else:
            launch, = k.launches(x, w, b, cfg=k.config(n, x.dtype, m))
            fn, args, kwargs = launch.fn, launch.args, dict(launch.kwargs)
        kwargs["PDL"] = True
        kwargs.pop("launch_pdl", None)
        out.append((k.name + "/" + k.op, fn, args, kwargs))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend-file", action="append", default=[])
    ap.add_argument("--backend", default=None, help="only kernels of these backends (comma-separated)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    import triton  # noqa: F401  (before impls: loaded first, it stays compiled, not interpreted)
    from harness.judging.dependent_launch import wait_before_loads
    from impls import registry
    from impls.triton._launch import TritonKernel
    from tools.triton_resources import compile_sm90

    registry.load_all(args.backend_file)
    backends = set(args.backend.split(",")) if args.backend else None
    # The registered Triton kernels that launch with PDL themselves (the dispatch entry points run
    # one of them, checked on its own).
    kernels = [k for k in registry.kernels(family=None) if getattr(k, "pdl", False)
               and (isinstance(k, TritonKernel) or (k.backend == "triton" and k.family == "fused"))
               and k.variant not in ("auto", "invariant") and (backends is None or k.backend in backends)]
    results = {}
    for name, fn, a, kw in launches(kernels):
        ptx = compile_sm90(fn, a, kw).asm["ptx"]
        results[name] = wait_before_loads(ptx)
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        for name, problem in results.items():
            print(f"{name}: {problem or 'waits before its first load'}")
    return 1 if any(results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
