"""Long-row candidates in TileLang, not registered: what ``tools/long_row_probe.py`` times on the
GPU beside the registered kernels. Compiled for sm_90 without spills by
``tests/test_long_row_candidates.py``; they cannot run without a GPU, so the probe's own float64
check, repeat and batch-invariance checks are their first run.

``splitk_pipelined``: tilelang.splitk's two reads of x in segments, over a persistent grid of G
blocks, each carrying two rows: in one walk over the segments it scales and writes row r (its
second read, from L2) and sums the squares of row r + G (its first read, from DRAM), so each
block keeps the DRAM read and write streams going together and two rows in L2 whatever G. The
per-row arithmetic and summation order are splitk's, so a row's bits never depend on M or G.

``cluster_persistent``: tilelang.cluster's row over a cluster, its segment in shared memory and
the partial sums exchanged through distributed shared memory, but over a persistent grid of G
clusters that each walk rows g, g + G, ...: every block keeps two segment buffers, and while it
reduces, exchanges and stores row i, row i + G's segment is already loading into the other one
by cp.async (global to shared without registers: the loads stay in flight through the
reduction and the cluster barrier, where tilelang.cluster's block has none). Same sums in the
same order as tilelang.cluster: deterministic and batch invariant. Rows of exactly C segments
only (N a multiple of the segment, as at N = 65536-262144); padded rows are refused.
"""
# No "from __future__ import annotations": TileLang evaluates the parameter annotations.
import dataclasses

import torch

from impls import fastpath
from impls.tilelang import compiler
from impls.tilelang._kernel import _dummy
from impls.tilelang._long_plan import blocks_in_shared_memory, cluster_plan, cluster_size
from impls.tilelang.plan import Plan, make_plan
from impls.tilelang.rms_norm import TileLangRMSNormSplitK

VARIANT = "splitk_pipelined"
PERSISTENT = "cluster_persistent"


def rms_norm_splitk_pipelined(plan: Plan):
    import tilelang.language as T

    from impls.tilelang._programs import F32, _affine, _row_layout, _signature_sizes

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


def rms_norm_cluster_persistent(plan: Plan):
    import tilelang.language as T

    from impls.tilelang._long_programs import _chunk_loop, _smem_chunks
    from impls.tilelang._programs import F32, _affine, _row_layout, _signature_sizes

    N, S, vec, dt = plan.n, plan.padded, plan.vec, plan.dtype
    C = cluster_size(plan)
    K, chunks = _smem_chunks(plan)
    NW, _ = _signature_sizes(plan)
    M, LX, LY = T.dynamic("M"), T.dynamic("LX", "int64"), T.dynamic("LY", "int64")
    has_w = plan.has_weight

    @T.macro
    def load_async(X, xs, buf, row, base, tx, sxv):
        """Row ``row``'s segment into xs[buf] by cp.async, 16 bytes a thread a chunk, one commit
        group (T.async_copy finds no store to rewrite in this form)."""
        for c in T.serial(chunks):
            T.ptx_cp_async(T.access_ptr(xs[buf, c * K + tx * vec], "w", vec),
                           T.access_ptr(X[T.cast(row, "int64") * sxv * vec + base + c * K + tx * vec], "r", vec), vec)
        T.ptx_commit_group()

    @T.prim_func
    def main(
        X: T.Tensor((LX,), dt), W: T.Tensor((NW,), dt), Y: T.Tensor((LY,), dt),
        RSTD: T.Tensor((M,), F32), sxv: T.int64, syv: T.int64, eps: T.float32, G: T.int32,
    ):
        with T.Kernel(G * C, threads=plan.threads, cluster_dims=(C, 1, 1)) as bx:
            if plan.min_blocks:
                T.annotate_min_blocks_per_sm(plan.min_blocks)
            xs = T.alloc_shared((2, S), dt)
            acc = T.alloc_fragment((1, K), F32)
            ss = T.alloc_fragment((1,), F32)
            mine = T.alloc_shared((1,), F32)
            slots = T.alloc_shared((2, C), F32)  # row i's partials in slots[i % 2]
            T.annotate_layout({acc: _row_layout(plan, 1, K)})
            g = bx // C
            base = (bx % C) * S
            tx = T.get_thread_binding()
            load_async(X, xs, 0, g, base, tx, sxv)
            T.cluster_sync()  # every peer has started before the first remote store into it
            for i in T.serial((M - g + G - 1) // G):  # the host makes G <= M
                row = g + i * G
                b = i % 2
                if row + G < M:  # row + G into the other buffer, in flight through this row
                    load_async(X, xs, 1 - b, row + G, base, tx, sxv)
                    T.ptx_wait_group(1)
                else:
                    T.ptx_wait_group(0)
                T.sync_threads()
                for r, j in T.Parallel(1, K):
                    acc[r, j] = 0.0
                for c in _chunk_loop(chunks):
                    for r, j in T.Parallel(1, K):
                        acc[r, j] += T.cast(xs[b, c * K + j], F32) * T.cast(xs[b, c * K + j], F32)
                T.reduce_sum(acc, ss, dim=1)
                mine[0] = ss[0]
                # slots[b] was last read in row i - 2, before every peer passed row i - 1's barrier
                for p in T.serial(C):
                    T.copy_cluster(mine[0:1], slots[b, bx % C:bx % C + 1], dst_block=p)
                T.cluster_sync()
                ss[0] = 0.0
                for p in T.serial(C):  # rank order: the same sum in every block
                    ss[0] += slots[b, p]
                ss[0] = T.rsqrt(ss[0] / N + eps)
                for c in _chunk_loop(chunks):
                    for r, j in T.Parallel(1, K):
                        Y[T.cast(row, "int64") * syv * vec + base + c * K + j] = T.cast(_affine(
                            T.cast(xs[b, c * K + j], F32) * ss[0], W, None, base + c * K + j, has_w, False), dt)
                if bx % C == 0:
                    RSTD[row] = ss[0]
                T.sync_threads()  # xs[b] read out before row i + 1 loads row i + 2 into it

    return main


def _register_builder() -> None:
    from impls.tilelang import _programs

    _programs.BUILDERS.setdefault(VARIANT, rms_norm_splitk_pipelined)
    _programs.BUILDERS.setdefault(PERSISTENT, rms_norm_cluster_persistent)


class _PersistentCandidate(TileLangRMSNormSplitK):
    """A probe candidate over a persistent grid (a run-time G, the program's last argument), called
    through its Python path only. Not registered: tools/long_row_probe.py makes one."""

    native_replay = "a probe candidate: called through its Python path only"
    blocks_per_sm = 1

    def grid(self, plan: Plan, m: int, sms: int) -> int:
        raise NotImplementedError

    def fast_plan(self, x, x2, weight, bias, spec):
        return fastpath.generic_plan(x, x2, self.outputs, self._forward)

    def _run(self, plan: Plan, x: torch.Tensor, weight, bias, eps: float, out, with_bias: bool) -> None:
        compiled = compiler.compile_plan(plan)
        m = x.shape[0]
        sxv = x.stride(0) // plan.vec if m > 1 else 0
        syv = out.y.stride(0) // plan.vec if m > 1 else 0
        grid = self.grid(plan, m, torch.cuda.get_device_properties(x.device).multi_processor_count)
        w = weight if weight is not None else _dummy(x.device, x.dtype)
        with torch.cuda.device(x.device):
            compiled.kernel(self._flat(x), w, self._flat(out.y), out.rstd, sxv, syv, float(eps), grid)


class TileLangRMSNormSplitKPipelined(_PersistentCandidate):
    """tilelang.splitk's plan and segments, the pipelined program over ``blocks_per_sm`` x SMs
    blocks (at most M)."""

    variant = VARIANT

    def plan_for(self, dtype: torch.dtype, n: int, has_weight: bool, has_bias: bool, vec: int,
                 m: int | None = None) -> Plan:
        _register_builder()
        return dataclasses.replace(make_plan("splitk", dtype, n, has_weight, has_bias, vec, m=m), variant=VARIANT)

    def grid(self, plan: Plan, m: int, sms: int) -> int:
        return max(1, min(m, sms * self.blocks_per_sm))


class TileLangRMSNormClusterPersistent(_PersistentCandidate):
    """tilelang.cluster's plan with two segment buffers a block, over G clusters of C blocks: as
    many as are resident at once (``blocks_per_sm`` an SM where shared memory holds them), at
    most M."""

    variant = PERSISTENT
    blocks_per_sm = 2
    max_n = 262144
    min_n = 16384

    def plan_for(self, dtype: torch.dtype, n: int, has_weight: bool, has_bias: bool, vec: int,
                 m: int | None = None) -> Plan:
        _register_builder()
        plan = cluster_plan("cluster", dtype, n, has_weight, has_bias, vec)
        if cluster_size(plan) * plan.padded != n:
            raise ValueError(f"{PERSISTENT} takes rows of whole segments only: N={n} is not "
                             f"{cluster_size(plan)} x {plan.padded}")
        fit = blocks_in_shared_memory(2 * plan.padded * getattr(torch, plan.dtype).itemsize)  # two buffers
        return dataclasses.replace(plan, variant=PERSISTENT, min_blocks=max(1, min(self.blocks_per_sm, fit)))

    def grid(self, plan: Plan, m: int, sms: int) -> int:
        return max(1, min(m, sms * plan.min_blocks // cluster_size(plan)))  # every cluster resident at once


def cluster_persistent(blocks_per_sm: int = 2) -> TileLangRMSNormClusterPersistent:
    k = TileLangRMSNormClusterPersistent()
    k.blocks_per_sm = blocks_per_sm
    return k


def splitk_pipelined(blocks_per_sm: int = 1) -> TileLangRMSNormSplitKPipelined:
    k = TileLangRMSNormSplitKPipelined()
    k.blocks_per_sm = blocks_per_sm
    return k


def compile_offline(dtype: str, n: int, has_weight: bool = True) -> dict:
    """Compile the candidate for sm_90 and return its ptxas numbers (registers, spills)."""
    from impls.tilelang.plan import choose_vec

    dt = getattr(torch, dtype)
    _register_builder()
    plan = splitk_pipelined().plan_for(dt, n, has_weight, False, choose_vec(dt, n))
    compiled = compiler.compile_plan(plan, compiler.SM90)
    return {"plan": plan.describe(), **compiler.ptxas_report(compiled).to_dict()}


def compile_persistent_offline(dtype: str, n: int, blocks_per_sm: int = 2) -> tuple[dict, str]:
    """Compile cluster_persistent for sm_90: its ptxas numbers and its CUDA source."""
    from impls.tilelang.plan import choose_vec

    dt = getattr(torch, dtype)
    plan = cluster_persistent(blocks_per_sm).plan_for(dt, n, True, False, choose_vec(dt, n))
    compiled = compiler.compile_plan(plan, compiler.SM90)
    return {"plan": plan.describe(), **compiler.ptxas_report(compiled).to_dict()}, compiled.source()


__all__ = ["splitk_pipelined", "cluster_persistent", "compile_offline", "compile_persistent_offline",
           "rms_norm_splitk_pipelined", "rms_norm_cluster_persistent"]
