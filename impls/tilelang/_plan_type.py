"""The plan of a TileLang kernel (``Plan``): everything a generated program depends on. Made by
impls.tilelang.plan (the row kernels) and impls.tilelang._long_plan (the cluster kernels), which
both build on it. Plain Python: no tilelang import."""
from __future__ import annotations

from dataclasses import dataclass

import torch

VECTOR_BYTES = 16  # one 128-bit load or store


@dataclass(frozen=True)
class Plan:
    """Everything a generated program depends on; hashable, so a plan is its own cache key."""

    variant: str
    dtype: str  # "float32", "float16", "bfloat16"
    n: int
    has_weight: bool
    has_bias: bool
    vec: int  # elements per vector access; divides N and both row strides
    threads_per_row: int
    rows_per_block: int
    padded: int  # columns of the fragment (whole row, padded) or of one splitk segment
    # The launch bound (minimum blocks per SM) from TUNED or tools/tilelang_sweep.py; None:
    # layer_norm_fwd's rule (ln_min_blocks_per_sm), no bound for the fragment.
    min_blocks: int | None = None
    # The block's threads work on each of its rows in turn (the cluster kernels) rather than a
    # group of threads_per_row on each row.
    rows_share_threads: bool = False
    # Cluster kernels (_long_programs): the exchange of partials by st.async into each peer's
    # slots, completing on the peer's mbarrier, instead of a cluster barrier after the remote
    # stores; and the first cluster arrive relaxed (no GPU-scope fence before it). Either needs
    # the slots in shared memory of their own (compiler.SLOTS_OWN_MEMORY). The cluster plans take
    # both (_long_plan.MBAR_EXCHANGE); the defaults here are the probe's barrier exchange.
    mbar_exchange: bool = False
    relaxed_arrive: bool = False
    # Cluster kernels: each chunk of the segment summed from registers on its way into shared
    # memory, instead of read back from there (one pass over shared memory fewer for RMSNorm,
    # two for LayerNorm, whose lanes sum about their first value).
    stats_in_load: bool = False
    # Cluster kernels: each block sum by warp shuffles and one barrier (_long_programs'
    # normdiff_block_sum) instead of TileLang's AllReduce (two barriers a round, log2(threads / 32)
    # rounds); its workspace needs shared memory of its own (compiler.SLOTS_OWN_MEMORY).
    one_barrier_sum: bool = False
    # Programmatic dependent launch (impls.pdl): the program waits (griddepcontrol.wait) before its
    # first global load and lets the next kernel launch once its loads are issued; TileLang's
    # runtime then launches it with the programmatic-stream-serialization attribute. The kernels
    # set it for few rows where PDL runs (TileLangKernel.pdl_plan, fused.fused_plan).
    pdl: bool = False

    @property
    def threads(self) -> int:
        return self.threads_per_row * (1 if self.rows_share_threads else self.rows_per_block)

    def describe(self) -> str:
        affine = "+".join(n for n, on in (("weight", self.has_weight), ("bias", self.has_bias)) if on) or "no affine"
        return (f"tilelang.{self.variant} {self.dtype} N={self.n} ({affine}; vec {self.vec}, "
                f"{self.threads} threads, {self.rows_per_block} row(s)/block, {self.padded} columns"
                f"{', PDL' if self.pdl else ''})")


def max_vec(dtype: torch.dtype) -> int:
    return VECTOR_BYTES // dtype.itemsize
