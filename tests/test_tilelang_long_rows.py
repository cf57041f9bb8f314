"""The cluster kernels' plans and capacity (plain Python: their sm_90 builds are compiled by
harness/test_offline_compile.py; they run on a GPU only)."""
from __future__ import annotations

import pytest
import torch

from impls import registry
from impls.base import NormSpec
from impls.gpu_limits import SM_REGISTERS, SM_SHARED
from impls.tilelang._long_plan import (LONGEST_BUILT, MAX_CLUSTER, MIN_REGISTERS, WIDE_CLUSTER, WIDE_SEGMENT_BYTES,
                                       cluster_plan, cluster_size)
from impls.tilelang.plan import choose_vec, make_plan


@pytest.mark.parametrize("variant", ["cluster", "layer_norm_cluster"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n", [769, 4096, 65536, 65537, 100000, 131072, 262143, 262144])
def test_cluster_plan_covers_the_row_in_at_most_sixteen_blocks(variant, dtype, n):
    """At most MAX_CLUSTER (portable) blocks a row, WIDE_CLUSTER only where MAX_CLUSTER's segments
    would hold more than WIDE_SEGMENT_BYTES of x (float32 beyond N = 131072)."""
    vec = choose_vec(dtype, n)
    if n > LONGEST_BUILT:
        pytest.skip("beyond the kernel's capacity (its own test below)")
    plan = make_plan(variant, dtype, n, True, variant == "layer_norm_cluster", vec)
    assert plan == cluster_plan(variant, dtype, n, True, variant == "layer_norm_cluster", vec)
    c = cluster_size(plan)
    wide = -(-n // MAX_CLUSTER) * dtype.itemsize > WIDE_SEGMENT_BYTES
    assert 1 <= c <= (WIDE_CLUSTER if wide else MAX_CLUSTER)
    assert wide == (dtype == torch.float32 and n > 131072)
    assert plan.padded % (plan.threads_per_row * plan.vec) == 0
    assert (c - 1) * plan.padded < n <= c * plan.padded  # no block without columns
    seg_bytes = plan.padded * dtype.itemsize
    assert seg_bytes + 1024 <= SM_SHARED  # the segment (and the exchange slots) fit one block's shared memory
    rows = plan.rows_per_block
    assert plan.rows_share_threads  # every thread of the block works on each of its rows
    if plan.min_blocks:  # a launch bound that shared memory and the register floor (per row) both allow
        assert plan.min_blocks * (rows * seg_bytes + 1024) <= SM_SHARED
        assert plan.min_blocks * plan.threads * MIN_REGISTERS * rows <= SM_REGISTERS


def test_cluster_plan_shares_an_sm_at_the_long_rows():
    """Segments of at most 32 KB up to N = 131072 in 16-bit (four blocks of 256 threads an SM at
    one row a block), 64 KB at 262144 (512 threads, two blocks at the register floor), and 64 KB
    for float32 at 262144 (clusters of 16, two blocks an SM where 8 blocks of 128 KB left one)."""
    def plan(dtype, n):
        return cluster_plan("cluster", dtype, n, True, False, 16 // dtype.itemsize)

    assert (cluster_size(plan(torch.bfloat16, 32768)), plan(torch.bfloat16, 32768).min_blocks) == (2, 4)
    assert plan(torch.bfloat16, 131072).padded * 2 == 32768
    assert (plan(torch.bfloat16, 262144).threads, plan(torch.bfloat16, 262144).min_blocks) == (512, 2)
    f32 = plan(torch.float32, 262144)
    assert (cluster_size(f32), f32.padded * 4, f32.threads, f32.min_blocks) == (16, 65536, 512, 2)


@pytest.mark.parametrize("dtype,n,rows", [
    (torch.bfloat16, 32768, 1), (torch.bfloat16, 65536, 2), (torch.float16, 131072, 2), (torch.bfloat16, 262144, 1),
    (torch.float32, 65536, 2), (torch.float32, 131072, 1),
])
def test_rmsnorm_blocks_carry_two_rows_where_a_segment_takes_256_threads(dtype, n, rows):
    """_long_plan.RMS_ROWS from N = 65536 while a row's segment takes 256 threads, at two blocks an
    SM (2 x 64 registers a thread); LayerNorm keeps one row a block."""
    vec = 16 // dtype.itemsize
    plan = cluster_plan("cluster", dtype, n, True, False, vec)
    assert (plan.rows_per_block, plan.threads) == (rows, 256 if rows == 2 else plan.threads)
    if rows == 2:
        assert plan.min_blocks == 2 and cluster_size(plan) == -(-n // plan.padded)
    assert cluster_plan("layer_norm_cluster", dtype, n, True, True, vec).rows_per_block == 1


@pytest.mark.parametrize("variant", ["cluster", "layer_norm_cluster"])
@pytest.mark.parametrize("dtype,n,blocks", [(torch.bfloat16, 16384, 1), (torch.float16, 16384, 1),
                                            (torch.bfloat16, 16392, 2), (torch.float32, 16384, 2),
                                            (torch.bfloat16, 262144, 8), (torch.float32, 262143, 16)])
def test_cluster_plan_exchanges_by_mbarrier_only_between_blocks(variant, dtype, n, blocks):
    """The mbarrier exchange with its relaxed arrive where a row spans blocks; a row of one block
    keeps the barrier exchange (the mbarrier form faulted there on the H200)."""
    plan = cluster_plan(variant, dtype, n, True, variant == "layer_norm_cluster", choose_vec(dtype, n))
    assert cluster_size(plan) == blocks
    assert plan.mbar_exchange == plan.relaxed_arrive == (blocks > 1)
    assert plan.stats_in_load == (blocks > 1 and variant == "layer_norm_cluster")
    assert plan.one_barrier_sum == (blocks > 1)  # a row of one block keeps TileLang's reduce_sum


def test_cluster_plan_is_one_for_every_m():
    plan = make_plan("cluster", torch.bfloat16, 65536, True, False, 8, m=1)
    assert plan == make_plan("cluster", torch.bfloat16, 65536, True, False, 8)
    assert registry.get("rms_norm", "tilelang", "cluster").batch_invariant


@pytest.mark.parametrize("op,variant,dtype,n,ok", [
    ("rms_norm", "cluster", torch.bfloat16, 262144, True),
    ("rms_norm", "cluster", torch.float32, 262144, True),
    ("rms_norm", "cluster", torch.bfloat16, 262145, False),
    ("layer_norm", "layer_norm_cluster", torch.bfloat16, 131071, True),
    ("layer_norm", "layer_norm_cluster", torch.bfloat16, 262143, True),  # narrow accesses: in shared memory too
    ("layer_norm", "layer_norm_cluster", torch.float32, 262145, False),
])
def test_cluster_capacity_is_said(op, variant, dtype, n, ok):
    kernel = registry.get(op, "tilelang", variant)
    spec = NormSpec(op, dtype, 4, n, n, "cpu", True, op == "layer_norm")
    why = kernel.unsupported(spec) or ""
    assert ("capacity" in why) != ok, why
