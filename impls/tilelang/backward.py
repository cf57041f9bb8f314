"""The TileLang backward pass (program: _bwd_programs.norm_bwd), attached to every TileLang
kernel: all of them save rstd (and LayerNorm's mean) in the same layout, so the RMSNorm variants
share one backward kernel. Plain Python until a kernel is compiled.

- dx: one kernel, one row at a time, the row padded in registers as the forward pads it.
- dw, db: the kernel writes float32 partial sums per block of ``block_m`` rows (from N alone,
  never from M); torch sums the partials over blocks in float32 (``sum(0)``: a reduction without
  atomics) and rounds once into the caller's buffer. Deterministic; the grouping of rows is fixed.
  db's partials only where db is asked for (LayerNorm with bias).
- Rows up to BWD_MAX_N: the backward holds x and dy (and, prefetching, the next row's) in the
  input dtype and one or two float32 accumulators in registers.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from impls.base import NormGrads, NormOutputs, UnsupportedCase
from impls.gpu_limits import SM_REGISTERS, SM_THREADS, cdiv, next_pow2
from impls.tilelang import compiler
from impls.tilelang.plan import Plan, choose_vec

BWD_MAX_N = 8192
BWD_MAX_THREADS = 1024
# The plan rule (measured on the H200 only through tools/tilelang_bwd_probe.py so far):
BWD_VECTORS = 1  # vectors per thread per row (more where N needs over BWD_MAX_THREADS threads)
# Rows per block (and so per dw/db partial): None fills the GPU in one wave, cdiv(M, SMs x
# min_blocks) rows each (no tail of a second, part-filled wave; dw's grouping then follows M and
# the SM count); a number fixes it for every M.
BWD_BLOCK_M: int | None = None
BWD_PREFETCH = True  # load the next row before this row's reductions
# Registers per thread the launch bound aims ptxas at (by vectors per thread; the row's x and dy,
# the next row's and the accumulators are 2-3 registers per element): blocks per SM follow.
BWD_REG_BUDGET = {1: 64, 2: 64}


@dataclass(frozen=True)
class BwdPlan(Plan):
    """A backward plan: ``has_bias`` means db is computed; ``block_m`` rows per block (and per
    partial); ``prefetch``: the next row's loads issued before this row's reductions."""

    block_m: int | None = BWD_BLOCK_M
    prefetch: bool = BWD_PREFETCH

    def describe(self) -> str:
        rows = f"{self.block_m} rows/block" if self.block_m else "rows/block filling one wave"
        return (super().describe().replace("row(s)/block", f"concurrent row(s), {rows}")
                + f", min_blocks {self.min_blocks}, prefetch {self.prefetch}")

    def block_rows(self, m: int, device) -> int:
        if self.block_m:
            return self.block_m
        return cdiv(m, _sm_count(device) * self.min_blocks)


_SMS: dict = {}


def _sm_count(device) -> int:
    key = torch.device(device).index if torch.device(device).index is not None else torch.cuda.current_device()
    if key not in _SMS:
        _SMS[key] = torch.cuda.get_device_properties(key).multi_processor_count
    return _SMS[key]


def backward_plan(op: str, dtype, n: int, has_weight: bool, vec: int, has_bias: bool | None = None,
                  vectors: int | None = None, block_m: int | None = None, prefetch: bool | None = None,
                  min_blocks: int | None = None) -> BwdPlan:
    """The backward's plan from (op, dtype, N, weight, db asked for, vector width); the keyword
    overrides are for the probe and sweeps (tools/tilelang_bwd_probe.py). ``has_bias`` None:
    LayerNorm computes db."""
    dt = dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")
    has_bias = op == "layer_norm" if has_bias is None else has_bias and op == "layer_norm"
    per_thread = vectors or BWD_VECTORS
    # Narrow vectors (odd N or strides) hold more elements a thread: at 1024 threads (64 registers)
    # they spill, so half that.
    most = BWD_MAX_THREADS if vec * torch.finfo(getattr(torch, dt)).bits == 128 else BWD_MAX_THREADS // 2
    tpr = min(most, max(32, next_pow2(cdiv(cdiv(n, vec), per_thread))))
    padded = cdiv(n, tpr * vec) * tpr * vec
    vpt = padded // (tpr * vec)
    if min_blocks is None:
        budget = next((regs for most, regs in sorted(BWD_REG_BUDGET.items()) if vpt <= most), None)
        min_blocks = max(1, min(SM_THREADS // tpr, SM_REGISTERS // (tpr * budget))) if budget else 1
    return BwdPlan(f"{op}_bwd", dt, n, has_weight, has_bias, vec, tpr, 1, padded, min_blocks,
                   block_m=BWD_BLOCK_M if block_m is None else block_m or None, prefetch=BWD_PREFETCH if prefetch is None else prefetch)


def _flat(t: torch.Tensor) -> torch.Tensor:
    m, n = t.shape
    return t.as_strided(((m - 1) * t.stride(0) + n,), (1,))


class TileLangBackward:
    """Mixin of TileLangKernel: ``_backward``, and the backward's offline builds."""

    backward_nondeterministic = None
    # dx: one plan for every M, each row's dx alone (rows per block follow M, dx's bits do not);
    # dw and db are sums over the batch, grouped by rows per block.
    backward_batch_invariant = True

    # (dtype, N, affine): the fewest threads (128 at the 64-register bound), a padded N with
    # 16-byte vectors, the capacity edge (1024 threads), and for LayerNorm an odd N (scalar
    # accesses; the program is the same for both ops).
    BACKWARD_BUILDS = (("bfloat16", 1024, "full"), ("bfloat16", 4000, "full"), ("bfloat16", BWD_MAX_N, "full"))
    BACKWARD_BUILDS_LN = (("float32", 769, "full"),)

    def backward_builds(self) -> tuple:
        """The backward's offline builds, ("backward", dtype, N, affine): declared by one kernel
        per op (the RMSNorm variants share the program)."""
        if self.variant not in ("fragment", "layer_norm_fwd"):
            return ()
        extra = self.BACKWARD_BUILDS_LN if self.op == "layer_norm" else ()
        return tuple(("backward", *b) for b in self.BACKWARD_BUILDS + extra)

    def backward_build_plan(self, build) -> Plan:
        """The plan of one of ``backward_builds`` (compiled by TileLangKernel.build_offline)."""
        _, dtype, n, affine = build
        dt = getattr(torch, dtype)
        return backward_plan(self.op, dt, n, affine == "full", choose_vec(dt, n))

    def backward_unsupported(self, spec) -> str | None:
        if spec.n > BWD_MAX_N:  # true on any machine, so said first (as the forward's capacity)
            return f"N={spec.n} exceeds tilelang's backward capacity (max {BWD_MAX_N})"
        return super().backward_unsupported(spec)

    def _backward(self, x, weight, bias, dy, saved: NormOutputs, eps, out: NormGrads) -> None:
        m, n = x.shape
        if n > BWD_MAX_N:
            raise UnsupportedCase(f"N={n} exceeds tilelang's backward capacity (max {BWD_MAX_N})")
        strides = (x.stride(0), dy.stride(0), out.dx.stride(0)) if m > 1 else ()
        offsets = tuple((t.data_ptr() % 16) // t.element_size() for t in (x, dy, out.dx, weight) if t is not None)
        plan = backward_plan(self.op, x.dtype, n, weight is not None, choose_vec(x.dtype, n, strides, offsets),
                             has_bias=out.db is not None)
        run_backward_plan(plan, x, weight, dy, saved, out)


def run_backward_plan(plan: BwdPlan, x, weight, dy, saved: NormOutputs, out: NormGrads) -> None:
    """Compile (once) and run one backward plan into ``out``; any plan of the shape (the probe
    times several)."""
    m, n = x.shape
    compiled = compiler.compile_plan(plan)
    rows = plan.block_rows(m, x.device)
    # One partial buffer (dw's columns, then db's): one torch reduction for both.
    parts = torch.empty(cdiv(m, rows), n * (2 if plan.has_bias else 1), dtype=torch.float32, device=x.device)
    w = weight if weight is not None else x.new_zeros(1)
    mean = saved.mean if saved.mean is not None else saved.rstd  # RMSNorm: never read
    v = plan.vec
    with torch.cuda.device(x.device):
        compiled.kernel(_flat(x), _flat(dy), w, mean, saved.rstd, _flat(out.dx), parts,
                        x.stride(0) // v if m > 1 else 0, dy.stride(0) // v if m > 1 else 0,
                        out.dx.stride(0) // v if m > 1 else 0, rows)
    if out.dw is None and out.db is None:
        return
    sums = parts.sum(0)
    pairs = [(t, s) for t, s in ((out.dw, sums[:n]), (out.db, sums[n:])) if t is not None]
    torch._foreach_copy_([t for t, _ in pairs], [s for _, s in pairs])  # one launch for dw and db
