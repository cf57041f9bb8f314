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
