"""Long-row TileLang kernels: a row over a thread-block cluster (sm_90), partial statistics
exchanged through distributed shared memory, x read once (_long_programs, _long_plan)."""
from __future__ import annotations

import torch

from impls.base import NormKernel, NormOutputs, cuda_present
from impls.registry import register
from impls.tilelang._kernel import TileLangKernel
from impls.tilelang._long_plan import LONGEST_BUILT


class _ClusterKernel(TileLangKernel):
    native_replay = "a thread-block cluster launch (replayed by cuLaunchKernel it faulted on the H200: illegal instruction)"
    # Every block sums the cluster's partials in rank order, with one plan for every M.
    batch_invariant = True
    # Segments in shared memory hold longer rows than this; it is the longest compiled for sm_90
    # (offline builds) and measured (tools/long_row_probe.py) in every dtype.
    max_n = LONGEST_BUILT
    capacity = "compiled and measured"
    # Shorter rows fit one block of the row-per-block kernels, which need no cluster barrier: the
    # cluster kernels are for long rows only (and their checks stay out of the short-row catalogue).
    min_n = 16384
    # No backward: the TileLang backward takes N <= 8192, and these kernels start at min_n.
    _backward = NormKernel._backward

    def unsupported(self, spec) -> str | None:
        reason = super().unsupported(spec)
        if reason is None and spec.device == "cuda" and cuda_present() and torch.cuda.get_device_capability()[0] < 9:
            reason = f"{self.name} launches thread-block clusters: sm_90 or newer"
        return reason

    def offline_builds(self) -> tuple:
        full = "weight_bias" if self.op == "layer_norm" else "weight"
        longs = [("bfloat16", n, full, None) for n in (16384, 65536, 131072, 262144)]
        longs += [(dt, 65536, full, None) for dt in ("float32", "float16")]
        longs += [("bfloat16", n, full, None) for n in (65537, 100000, 262143)]
        return tuple(longs)


@register
class TileLangRMSNormCluster(_ClusterKernel):
    """One read of x: the row over a cluster of up to 16 blocks, each holding its segment in
    shared memory; the blocks' sums of squares meet in distributed shared memory."""

    op = "rms_norm"
    variant = "cluster"
    longer_rows_by = "tilelang.splitk"
    shorter_rows_note = "; tilelang.fragment covers shorter rows"
    outputs = ("y", "rstd")

    def _forward(self, x, weight, bias, eps, out: NormOutputs) -> None:
        plan = self._launch_plan(x, out.y, weight)
        self._run(plan, x, weight, None, eps, out, with_bias=False)


@register
class TileLangLayerNormCluster(_ClusterKernel):
    """As tilelang.cluster for LayerNorm: each block's sum and its sum of squares about its own
    mean meet in distributed shared memory and merge exactly (no E[x^2] - E[x]^2)."""

    op = "layer_norm"
    variant = "layer_norm_cluster"
    longer_rows_by = "tilelang.layer_norm_fwd"
    shorter_rows_note = "; tilelang.layer_norm_fwd covers shorter rows"
    outputs = ("y", "mean", "rstd")

    def _forward(self, x, weight, bias, eps, out: NormOutputs) -> None:
        plan = self._launch_plan(x, out.y, weight, bias)
        self._run(plan, x, weight, bias, eps, out, with_bias=True)
