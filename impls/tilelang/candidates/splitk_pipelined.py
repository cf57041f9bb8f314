"""``splitk_pipelined``: tilelang.splitk's two reads of x in segments, over a persistent grid of G
blocks, each carrying two rows: in one walk over the segments it scales and writes row r (its
second read, from L2) and sums the squares of row r + G (its first read, from DRAM), so each
block keeps the DRAM read and write streams going together and two rows in L2 whatever G. The
per-row arithmetic and summation order are splitk's, so a row's bits never depend on M or G.
Not measured yet (docs/perf-notes.md, item 42).
"""
# No "from __future__ import annotations": TileLang evaluates the parameter annotations.
import dataclasses

import torch

from impls import fastpath
from impls.tilelang import compiler
from impls.tilelang._kernel import _dummy
from impls.tilelang.plan import Plan, make_plan
from impls.tilelang.rms_norm import TileLangRMSNormSplitK

VARIANT = "splitk_pipelined"


def rms_norm_splitk_pipelined(plan: Plan):
    import tilelang.language as T

    from impls.tilelang._program_parts import F32, _affine, _row_layout, _signature_sizes

    N, K, vec, dt = plan.n, plan.padded, plan.vec, plan.dtype
    segs = -(-N // K)
    NW, _ = _signature_sizes(plan)
    M, LX, LY = T.dynamic("M"), T.dynamic("LX", "int64"), T.dynamic("LY", "int64")
    has_w = plan.has_weight

    @T.prim_func
    def main(
        X: T.Tensor((LX,), dt), W: T.Tensor((NW,), dt), Y: T.Tensor((LY,), dt),
        RSTD: T.Tensor((M,), F32), sxv: T.int64, syv: T.int64, eps: T.float32, G: T.int32,
    ):
        with T.Kernel(G, threads=plan.threads) as bx:
            seg = T.alloc_fragment((1, K), dt)
            nseg = T.alloc_fragment((1, K), dt)
            acc = T.alloc_fragment((1, K), F32)
            ss = T.alloc_fragment((1,), F32)
            T.annotate_layout({seg: _row_layout(plan, 1, K), nseg: _row_layout(plan, 1, K),
                               acc: _row_layout(plan, 1, K)})
            for r, j in T.Parallel(1, K):
                acc[r, j] = 0.0
            for s in T.unroll(segs, annotations={"pragma_unroll_factor": 2}):  # row bx, first read
                for r, j in T.Parallel(1, K):
                    seg[r, j] = T.if_then_else(
                        s * K + j < N, X[T.cast(bx, "int64") * sxv * vec + s * K + j], T.cast(0, dt))
                for r, j in T.Parallel(1, K):
                    acc[r, j] += T.cast(seg[r, j], F32) * T.cast(seg[r, j], F32)
            T.reduce_sum(acc, ss, dim=1)
            ss[0] = T.rsqrt(ss[0] / N + eps)
            # Rows bx, bx + G, ...: (M - bx + G - 1) // G of them (the host makes G <= M).
            for i in T.serial((M - bx + G - 1) // G):
                row = bx + i * G
                for r, j in T.Parallel(1, K):
                    acc[r, j] = 0.0
                for s in T.unroll(segs, annotations={"pragma_unroll_factor": 2}):
                    for r, j in T.Parallel(1, K):  # row + G, first read
                        nseg[r, j] = T.if_then_else(
                            (s * K + j < N) and (row + G < M),
                            X[T.cast(row + G, "int64") * sxv * vec + s * K + j], T.cast(0, dt))
                    for r, j in T.Parallel(1, K):
                        acc[r, j] += T.cast(nseg[r, j], F32) * T.cast(nseg[r, j], F32)
                    for r, j in T.Parallel(1, K):  # row, second read
                        seg[r, j] = T.if_then_else(
                            s * K + j < N, X[T.cast(row, "int64") * sxv * vec + s * K + j], T.cast(0, dt))
                    for r, j in T.Parallel(1, K):
                        if s * K + j < N:
                            Y[T.cast(row, "int64") * syv * vec + s * K + j] = T.cast(_affine(
                                T.cast(seg[r, j], F32) * ss[0], W, None, s * K + j, has_w, False), dt)
                RSTD[row] = ss[0]
                T.reduce_sum(acc, ss, dim=1)
                ss[0] = T.rsqrt(ss[0] / N + eps)

    return main


class TileLangRMSNormSplitKPipelined(TileLangRMSNormSplitK):
    """tilelang.splitk's plan and segments, the pipelined program over ``blocks_per_sm`` x SMs
    blocks (at most M). Not registered: tools/long_row_probe.py makes one."""

    variant = VARIANT
    native_replay = "a probe candidate: called through its Python path only"
    blocks_per_sm = 1

    def plan_for(self, dtype: torch.dtype, n: int, has_weight: bool, has_bias: bool, vec: int,
                 m: int | None = None) -> Plan:
        return dataclasses.replace(make_plan("splitk", dtype, n, has_weight, has_bias, vec, m=m), variant=VARIANT)

    def fast_plan(self, x, x2, weight, bias, spec):
        return fastpath.generic_plan(x, x2, self.outputs, self._forward)

    def _run(self, plan: Plan, x: torch.Tensor, weight, bias, eps: float, out, with_bias: bool) -> None:
        compiled = compiler.compile_plan(plan)
        m = x.shape[0]
        sxv = x.stride(0) // plan.vec if m > 1 else 0
        syv = out.y.stride(0) // plan.vec if m > 1 else 0
        sms = torch.cuda.get_device_properties(x.device).multi_processor_count
        grid = max(1, min(m, sms * self.blocks_per_sm))
        w = weight if weight is not None else _dummy(x.device, x.dtype)
        with torch.cuda.device(x.device):
            compiled.kernel(self._flat(x), w, self._flat(out.y), out.rstd, sxv, syv, float(eps), grid)
