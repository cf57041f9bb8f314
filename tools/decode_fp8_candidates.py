"""The decode and fp8-output probe's candidates as outside backends, so that one benchmark run
times them side by side with the registered kernels and the peers, each screened against the
float64 oracle before it is timed (harness.benchmarks), and so the checks can run on any of them:

    pytest benchmarks --benchmark-only --backend-file tools/decode_fp8_candidates.py ...
    pytest harness --backend-file tools/decode_fp8_candidates.py --backend 'probe_*' ...

Each candidate is a registered project kernel with one choice changed, under backend
``probe_<choice>`` and the kernel's own variant (so its rows sit beside the kernel's):

- ``probe_div`` (Triton), ``probe_tldiv`` (TileLang): the fp8 output divided by the scale per
  element (tl.div_rn, div.rn), the form before the reciprocal taken once;
- ``probe_tlvec8``: TileLang's fp8 output stored 8 bytes a vector, not 16;
- ``probe_nodecode``: the fused kernels with the many-row setting at decode (no decode rule);
- ``probe_w2`` / ``probe_w4`` / ``probe_w16``: the decode (and fp8) setting with 2, 4 or 16 warps.

The kernels stay registered under their own names; the candidates are extra objects of the same
classes. Where they ran and what won: docs/perf-notes.md.
"""
from __future__ import annotations

import dataclasses

import torch

if __name__ == "__main__":  # the offline PTX counts: triton loaded first, so it compiles, not interprets
    import triton  # noqa: F401

from impls import registry
from impls.tilelang.fused import TileLangAddRMSNorm, TileLangRMSNormFused
from impls.triton.fused import TritonAddLayerNorm, TritonAddRMSNorm, TritonRMSNormFused
from impls.triton.rms_norm import TritonRMSNormRowwise


def _candidate(base: type, backend: str, doc: str, **attrs) -> type:
    cls = type(f"{base.__name__}_{backend}", (base,), {"backend": backend, "project": False, "__doc__": doc, **attrs})
    registry.register(cls)
    return cls


def _with_warps(warps: int):
    def config(self, n, dtype, m=None):
        cfg = super(type(self), self).config(n, dtype, m)
        # Only the settings the probe is about: decode (w_first) and one-tile rows.
        return dataclasses.replace(cfg, num_warps=warps) if cfg.w_first or cfg.block_n >= n else cfg
    return config


def _no_decode(self, n, dtype, m=None):
    return super(type(self), self).config(n, dtype, None)


for _base in (TritonRMSNormFused, TritonAddRMSNorm):
    _candidate(_base, "probe_div", "fp8 y / scale per element", fp8_recip=False)
for _base in (TileLangRMSNormFused, TileLangAddRMSNorm):
    _candidate(_base, "probe_tldiv", "fp8 y / scale per element", plan_settings={"fp8_scale": "divide"})
    _candidate(_base, "probe_tlvec8", "fp8 y stored 8 bytes a vector", plan_settings={"out_vec": 8})
for _base in (TritonAddRMSNorm, TritonAddLayerNorm):
    _candidate(_base, "probe_nodecode", "the many-row setting at decode", config=_no_decode, pdl=False)
for _warps in (2, 4, 16):
    for _base in (TritonRMSNormFused, TritonAddRMSNorm, TritonRMSNormRowwise):
        _candidate(_base, f"probe_w{_warps}", f"{_warps} warps at decode and one-tile rows", config=_with_warps(_warps))


# -- Offline: the fp8 forms in sm_90 PTX (no GPU needed) ------------------------------------------
def _triton_ptx(kernel, m: int, n: int) -> str:
    """The PTX of a Triton fused kernel's fp8 forward launch (bf16 x, e4m3fn y), compiled for sm_90."""
    import torch

    from impls.fused import FusedParams
    from tools.triton_resources import compile_sm90

    x = torch.empty(m, n, dtype=torch.bfloat16)
    add = kernel.op.startswith("add_")
    (fn, _, args, kwargs), = kernel.launches(x, torch.empty_like(x) if add else None, torch.empty(n, dtype=x.dtype),
                                             None, FusedParams(0.0, torch.float8_e4m3fn, 0.5, "out_y" if add else "new"))
    return compile_sm90(fn, args, dict(kwargs)).asm["ptx"]


def _tilelang_ptx(kernel, m: int, n: int) -> str:
    import torch

    from impls.fused import spec_of_fused, FusedParams
    from impls.tilelang import compiler
    from impls.tilelang.fused import _compile

    x = torch.empty(m, n, dtype=torch.bfloat16)
    add = kernel.op.startswith("add_")
    spec = spec_of_fused(kernel.op, x, "cuda", torch.empty(n, dtype=x.dtype), None, x.dtype if add else None,
                         FusedParams(0.0, torch.float8_e4m3fn, 0.5, "out_y" if add else "new"))
    return compiler.ptx(_compile(kernel.compile_key(spec), compiler.SM90))


def ptx_counts(ptx: str) -> dict:
    """What a thread of the fp8 store does, counted in the PTX: correctly rounded divisions,
    reciprocals, fp8 conversions (two values each) and global stores by width."""
    import collections
    import re

    stores = collections.Counter(m.lstrip(".") for m in re.findall(r"st\.global((?:\.\w+)+)", ptx))
    return {"div.rn": len(re.findall(r"div\.rn\.f32", ptx)), "rcp": len(re.findall(r"rcp\.\w+\.f32", ptx)),
            "cvt e4m3x2": len(re.findall(r"cvt\.rn\.satfinite\.e4m3x2", ptx)), "stores": dict(stores)}


def main(argv=None) -> int:
    import argparse
    import json

    ap = argparse.ArgumentParser(description="the fp8 forms of the candidates and kernels, counted in sm_90 PTX")
    ap.add_argument("--shape", default="16384x4096")
    args = ap.parse_args(argv)
    m, n = map(int, args.shape.split("x"))
    # Every fused kernel of the two backends with an fp8 output, the candidates among them.
    rows = {}
    for kernel in registry.kernels(family="fused"):
        if kernel.op not in ("rms_norm", "add_rms_norm") or torch.float8_e4m3fn not in kernel.out_dtypes:
            continue
        # By what the kernel offers: Triton's recorded launches, TileLang's plans.
        ptx = _triton_ptx if hasattr(kernel, "launches") else _tilelang_ptx if hasattr(kernel, "plan_settings") else None
        if ptx is not None:
            rows[f"{kernel.name}/{kernel.op}"] = ptx_counts(ptx(kernel, m, n))
    print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
