"""Print a TileLang kernel's generated CUDA source (and optionally its ptxas report).

    python -m impls.tilelang.source --variant fragment --dtype bfloat16 --n 4000 [--no-weight]
        [--bias] [--vec 8] [--arch sm_90] [--ptxas] [--pdl] [--ptx]

Compiles for the given arch (default: the GPU here, else sm_90); needs tilelang, and nvcc for
--ptxas and --ptx. The vector width defaults to the widest the dtype and N allow (contiguous rows).
--pdl: the decode plan (one row) in its PDL form (fragment, layer_norm_fwd).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys

from impls.base import SUPPORTED_DTYPES, dtype_name


def main(argv: list[str] | None = None) -> int:
    from impls.tilelang import VARIANTS
    from impls.tilelang import compiler
    from impls.tilelang.plan import PDL_VARIANTS, choose_vec, make_plan

    dtypes = {dtype_name(d): d for d in SUPPORTED_DTYPES}
    p = argparse.ArgumentParser(prog="python -m impls.tilelang.source", description=__doc__.splitlines()[0])
    p.add_argument("--variant", required=True, choices=VARIANTS)
    p.add_argument("--dtype", default="bfloat16", choices=sorted(dtypes))
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--no-weight", action="store_true", help="compile the specialization without weight")
    p.add_argument("--bias", action="store_true", help="layer_norm_fwd: with bias (needs the weight)")
    p.add_argument("--vec", type=int, default=None, help="vector width in elements (default: widest possible)")
    p.add_argument("--arch", default=None, help="e.g. sm_90 (default: the GPU here, else sm_90)")
    p.add_argument("--ptxas", action="store_true", help="also print registers, shared memory and spills")
    p.add_argument("--plan", action="store_true", help="also print the launch plan")
    p.add_argument("--pdl", action="store_true", help="the decode plan in its PDL form (fragment, layer_norm_fwd)")
    p.add_argument("--ptx", action="store_true", help="print the PTX nvcc makes of it instead of the source")
    a = p.parse_args(argv)
    if a.n < 1:
        p.error("--n must be at least 1")
    has_bias = a.bias and a.variant == "layer_norm_fwd"
    dtype = dtypes[a.dtype]
    vec = a.vec or choose_vec(dtype, a.n)
    plan = make_plan(a.variant, dtype, a.n, not a.no_weight, has_bias, vec, m=1 if a.pdl else None)
    if a.pdl:
        if plan.variant not in PDL_VARIANTS:
            p.error(f"--pdl: {plan.variant} has no PDL form (only {', '.join(PDL_VARIANTS)})")
        plan = dataclasses.replace(plan, pdl=True)
    target = {"kind": "cuda", "arch": a.arch} if a.arch else None
    try:
        compiled = compiler.compile_plan(plan, target)
    except compiler.TileLangCompileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"// {plan.describe()}, target {compiled.target}")
    print(compiler.ptx(compiled) if a.ptx else compiled.source())
    if a.ptxas:
        r = compiler.ptxas_report(compiled)
        print(f"// ptxas {r.arch} (cubin: {r.sass_arch}): {r.registers} registers/thread, "
              f"{r.smem_static} B static + {r.smem_dynamic} B dynamic shared memory/block, "
              f"spill stores {r.spill_stores} B, spill loads {r.spill_loads} B, stack {r.stack} B")
    return 0


if __name__ == "__main__":
    sys.exit(main())
