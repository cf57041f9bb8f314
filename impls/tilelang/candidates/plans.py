"""Plans of the TileLang candidates: the cluster kernels' plans with another rule's choices
(_long_plan.cluster_plan's overrides, the launch bound, the exchange's forms) and the choices of
the candidate programs (CandidatePlan, built by cluster_programs)."""
from __future__ import annotations

import dataclasses

import torch

from impls.tilelang._long_plan import cluster_plan, launch_bound
from impls.tilelang.plan import Plan


@dataclasses.dataclass(frozen=True)
class CandidatePlan(Plan):
    """A cluster plan with the candidate programs' choices (cluster_programs; variants ending
    _ahead, and layer_norm_cluster_rows)."""

    # LayerNorm: the weight and bias of the segment's first wb_ahead chunks loaded into registers
    # after the block sums, in flight while the block waits for its peers' partials (0: none).
    wb_ahead: int = 0
    # Each block first brings its segment of the row l2_ahead waves ahead into L2 (one bulk
    # prefetch by thread 0; a wave: the rows the GPU holds at once at min_blocks blocks an SM), so
    # the block that will load it finds it there (0: none).
    l2_ahead: int = 0
    # LayerNorm: each cluster normalises seq_rows consecutive rows one after another, its blocks
    # holding their weight and bias segments in shared memory, loaded once for all of them
    # (cluster_programs.layer_norm_cluster_rows; 0: one row a cluster).
    seq_rows: int = 0


def candidate_plan(variant: str, dtype: torch.dtype | str, n: int, has_weight: bool, has_bias: bool, vec: int,
                   threads: int | None = None, segment_bytes: int | None = None, max_cluster: int | None = None,
                   rows: int | None = None, min_blocks: int | None = None, seq_rows: int = 0, l2_ahead: int = 0,
                   wb_ahead: int = 0, **forms) -> Plan:
    """cluster_plan with its overrides; ``min_blocks`` over its launch bound; ``forms``, Plan fields
    of the exchange and sums (mbar_exchange, relaxed_arrive, stats_in_load, one_barrier_sum); and
    the candidate programs' choices. With ``seq_rows`` the launch bound counts the weight and bias
    segments a block keeps in shared memory. A plan without those choices is a Plan, which the
    registered program builds."""
    plan = cluster_plan(variant, dtype, n, has_weight, has_bias, vec, threads, segment_bytes, max_cluster, rows)
    if seq_rows:  # the weight and bias segments too
        seg, size = plan.padded, getattr(torch, plan.dtype).itemsize
        plan = dataclasses.replace(plan, min_blocks=launch_bound(n, seg, (plan.rows_per_block + 2) * seg * size,
                                                                 plan.threads, plan.rows_per_block))
    plan = dataclasses.replace(plan, min_blocks=min_blocks or plan.min_blocks, **forms)
    if not (seq_rows or l2_ahead or wb_ahead):
        return plan
    fields = {**dataclasses.asdict(plan), "variant": "layer_norm_cluster_rows" if seq_rows else variant + "_ahead"}
    return CandidatePlan(**fields, seq_rows=seq_rows, l2_ahead=l2_ahead, wb_ahead=wb_ahead)
