"""TileLang candidates: plans and programs that tools/long_row_probe.py times beside the registered
kernels (and tools/candidate_backend.py checks as backends of their own). Nothing in the backend
imports this package; its factories add the candidate programs to the compiler's builders
(``register_programs``) where TileLang is installed. A candidate that a probe finds faster moves
into the registered kernels (_long_plan, _long_programs); one that loses is deleted, its numbers
kept in docs/perf-notes.md.
They cannot run without a GPU: tests/test_long_row_candidates.py compiles them for sm_90, and the
probe's float64 check, repeat and batch-invariance checks are their first run.

- ``cluster``: tilelang.cluster or tilelang.layer_norm_cluster with another plan (plans), or with
  the candidate programs' choices (cluster_programs: an L2 prefetch a wave ahead, LayerNorm's
  weight and bias ahead of the wait for the peers, LayerNorm's rows in turn);
- ``splitk_pipelined``: tilelang.splitk's segments with two rows in flight a block (splitk_pipelined).
"""
# No "from __future__ import annotations": TileLang evaluates the parameter annotations.
import copy

import torch

from impls.tilelang import compiler
from impls.tilelang.candidates.plans import CandidatePlan, candidate_plan
from impls.tilelang.candidates.splitk_pipelined import (VARIANT, TileLangRMSNormSplitKPipelined,
                                                        rms_norm_splitk_pipelined)


def register_programs() -> None:
    """Add the candidate programs to the compiler's builders, once, where TileLang is installed:
    the programs import tilelang.language, and without it the kernels say why they cannot run."""
    if compiler.tilelang_module()[0] is None:
        return
    from impls.tilelang import _programs
    from impls.tilelang.candidates import cluster_programs

    for variant, builder in {**cluster_programs.BUILDERS, VARIANT: rms_norm_splitk_pipelined}.items():
        _programs.BUILDERS.setdefault(variant, builder)


def cluster(op: str, **choices):
    """tilelang.cluster (RMSNorm) or tilelang.layer_norm_cluster with the plan candidate_plan
    makes of ``choices`` (threads, segment_bytes, max_cluster, rows, min_blocks, seq_rows,
    l2_ahead, wb_ahead, and Plan fields of the exchange and sums); the registered plan without."""
    from impls import callpath, registry

    register_programs()
    variant = "cluster" if op == "rms_norm" else "layer_norm_cluster"
    k = copy.copy(registry.get(op, "tilelang", variant))
    callpath.forget(k)  # the copy's own call-path caches, not the registered kernel's
    if choices:
        k.plan_for = lambda dtype, n, hw, hb, vec, m=None: candidate_plan(variant, dtype, n, hw, hb, vec, **choices)
    return k


def splitk_pipelined(blocks_per_sm: int = 1) -> TileLangRMSNormSplitKPipelined:
    register_programs()
    k = TileLangRMSNormSplitKPipelined()
    k.blocks_per_sm = blocks_per_sm
    return k


def compile_offline(dtype: str, n: int, has_weight: bool = True, kernel=None) -> dict:
    """Compile a candidate (default: splitk_pipelined) for sm_90 and return its plan and ptxas
    numbers (registers, spills)."""
    from impls.tilelang.plan import choose_vec

    register_programs()
    dt = getattr(torch, dtype)
    kernel = kernel or splitk_pipelined()
    plan = kernel.plan_for(dt, n, has_weight, has_weight and kernel.op == "layer_norm", choose_vec(dt, n))
    compiled = compiler.compile_plan(plan, compiler.SM90)
    return {"plan": plan.describe(), **compiler.ptxas_report(compiled).to_dict()}


__all__ = ["CandidatePlan", "candidate_plan", "cluster", "compile_offline", "register_programs", "splitk_pipelined"]
