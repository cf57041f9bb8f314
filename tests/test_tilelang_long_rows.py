"""The cluster kernels' plans and capacity (plain Python: their sm_90 builds are compiled by
harness/test_offline_compile.py; they run on a GPU only)."""
from __future__ import annotations

import pytest
import torch

from impls import registry
from impls.base import NormSpec
from impls.tilelang._long_plan import MAX_CLUSTER, cluster_max_n, cluster_plan, cluster_size
from impls.tilelang.plan import choose_vec, make_plan


@pytest.mark.parametrize("variant", ["cluster", "layer_norm_cluster"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n", [769, 4096, 65536, 65537, 100000, 131072, 262143, 262144])
def test_cluster_plan_covers_the_row_in_at_most_eight_blocks(variant, dtype, n):
    vec = choose_vec(dtype, n)
    if n > cluster_max_n(variant, str(dtype).removeprefix("torch."), vec):
        pytest.skip("beyond the kernel's capacity (its own test below)")
    plan = make_plan(variant, dtype, n, True, variant == "layer_norm_cluster", vec)
    assert plan == cluster_plan(variant, dtype, n, True, variant == "layer_norm_cluster", vec)
    c = cluster_size(plan)
    assert 1 <= c <= MAX_CLUSTER
    assert plan.padded % (plan.threads_per_row * plan.vec) == 0
    assert (c - 1) * plan.padded < n <= c * plan.padded  # no block without columns
    assert plan.padded // (plan.threads_per_row * plan.vec) * plan.vec * dtype.itemsize <= 256  # 64 registers of x


def test_cluster_plan_is_one_for_every_m():
    plan = make_plan("cluster", torch.bfloat16, 65536, True, False, 8, m=1)
    assert plan == make_plan("cluster", torch.bfloat16, 65536, True, False, 8)
    assert registry.get("rms_norm", "tilelang", "cluster").batch_invariant


@pytest.mark.parametrize("op,variant,dtype,n,ok", [
    ("rms_norm", "cluster", torch.bfloat16, 262144, True),
    ("rms_norm", "cluster", torch.float32, 262144, True),
    ("rms_norm", "cluster", torch.bfloat16, 262145, False),
    ("layer_norm", "layer_norm_cluster", torch.bfloat16, 131071, True),
    ("layer_norm", "layer_norm_cluster", torch.bfloat16, 262143, False),  # narrow accesses spill
])
def test_cluster_capacity_is_said(op, variant, dtype, n, ok):
    kernel = registry.get(op, "tilelang", variant)
    spec = NormSpec(op, dtype, 4, n, n, "cpu", True, op == "layer_norm")
    why = kernel.unsupported(spec) or ""
    assert ("capacity" in why) != ok, why
