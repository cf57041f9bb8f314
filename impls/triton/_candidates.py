"""Long-row candidates, not registered: kernels that ``tools/long_row_probe.py`` times on the GPU
beside the registered ones before any of them becomes a variant (issue: long rows at the
bandwidth limit). Checked against the oracle under the interpreter by
``tests/test_long_row_candidates.py``.

The pipelined looped kernels. The looped kernels read a row twice: pass 1 sums it, pass 2
reads it again (from L2 while the rows in flight fit) to normalise and write. Within one program
the passes are serial, so DRAM is kept busy only by other programs on the SM, and every program
added to hide that puts another row in L2 (at N = 262144 in bf16, 132 programs hold 66 MiB of
rows, more than the H200's L2). Here a persistent program carries two rows: in one loop over
the chunks it normalises and writes row i (its second read, from L2) and sums row i + GRID (its
first read, from DRAM), so the DRAM read and write streams run together in every program, and
each program keeps two rows in L2 whatever the grid. The per-row arithmetic and the order of
every sum are the looped kernels' own, so a row's bits never depend on M or the grid.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from impls.triton._kernels import _store_y
from impls.triton.layer_norm import TritonLayerNormLooped
from impls.triton.rms_norm import TritonRMSNormLooped
from impls.triton.settings import LaunchConfig, launch_config


@triton.jit
def rms_norm_pipelined(
    X, W, Y, RSTD, M, N: tl.constexpr, stride_x, stride_y, eps, GRID, ITERS,
    HAS_WEIGHT: tl.constexpr, BLOCK_N: tl.constexpr, ROUND_BF16: tl.constexpr,
):
    chunks: tl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
    row = tl.program_id(0)  # the grid is at most M programs: every program has a first row
    base = row.to(tl.int64) * stride_x
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for c in tl.range(0, chunks):
        cols = c * BLOCK_N + tl.arange(0, BLOCK_N)
        x = tl.load(X + base + cols, mask=cols < N, other=0.0, eviction_policy="evict_last").to(tl.float32)
        acc += x * x
    rstd = tl.rsqrt(tl.sum(acc, axis=0) / N + eps)
    # ITERS = cdiv(M, GRID) rounds for every program; a program with fewer rows idles through
    # its last round, every access masked. (A while loop: the interpreter cannot take a run-time
    # bound in tl.range.)
    i = 0
    while i < ITERS:
        r = row + i * GRID
        nxt = r + GRID
        nbase = nxt.to(tl.int64) * stride_x
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for c in tl.range(0, chunks):
            cols = c * BLOCK_N + tl.arange(0, BLOCK_N)
            cmask = cols < N
            xn = tl.load(X + nbase + cols, mask=cmask & (nxt < M), other=0.0,
                         eviction_policy="evict_last").to(tl.float32)
            acc += xn * xn
            live = cmask & (r < M)
            x = tl.load(X + base + cols, mask=live, other=0.0, eviction_policy="evict_first").to(tl.float32)
            y = x * rstd
            if HAS_WEIGHT:
                y = y * tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
            _store_y(Y, r.to(tl.int64) * stride_y + cols, y, live, ROUND_BF16)
        tl.store(RSTD + r, rstd, mask=r < M)
        rstd = tl.rsqrt(tl.sum(acc, axis=0) / N + eps)
        base = nbase
        i += 1


@triton.jit
def _ln_first_chunk(X, base, valid, N: tl.constexpr, BLOCK_N: tl.constexpr):
    """A row's first chunk as layer_norm_looped takes it: the shift k (the chunk's mean) and the
    chunk's shifted sums, the lanes of s1 and s2 the rest of the row adds to."""
    first: tl.constexpr = N if N < BLOCK_N else BLOCK_N
    cols = tl.arange(0, BLOCK_N)
    mask = (cols < N) & valid
    x = tl.load(X + base + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    k = tl.sum(x, axis=0) / first
    sh = tl.where(mask, x - k, 0.0)
    return k, sh, sh * sh


@triton.jit
def _ln_stats(s1, s2, N: tl.constexpr, eps):
    mean_s = tl.sum(s1, axis=0) / N
    var = tl.sum(s2, axis=0) / N - mean_s * mean_s
    var = tl.where(var < 0.0, 0.0, var)
    return mean_s, tl.rsqrt(var + eps)


@triton.jit
def layer_norm_pipelined(
    X, W, B, Y, MEAN, RSTD, M, N: tl.constexpr, stride_x, stride_y, eps, GRID, ITERS,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, ROUND_BF16: tl.constexpr,
):
    chunks: tl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
    row = tl.program_id(0)
    base = row.to(tl.int64) * stride_x
    k, s1, s2 = _ln_first_chunk(X, base, row < M, N, BLOCK_N)
    for c in tl.range(1, chunks):
        cols = c * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = cols < N
        x = tl.load(X + base + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        sh = tl.where(mask, x - k, 0.0)
        s1 += sh
        s2 += sh * sh
    mean_s, rstd = _ln_stats(s1, s2, N, eps)
    i = 0
    while i < ITERS:  # as in rms_norm_pipelined
        r = row + i * GRID
        nxt = r + GRID
        nbase = nxt.to(tl.int64) * stride_x
        k_n, s1, s2 = _ln_first_chunk(X, nbase, nxt < M, N, BLOCK_N)
        for c in tl.range(0, chunks):
            cols = c * BLOCK_N + tl.arange(0, BLOCK_N)
            cmask = cols < N
            live = cmask & (r < M)
            # row r, second read: normalise and write chunk c
            x = tl.load(X + base + cols, mask=live, other=0.0, eviction_policy="evict_first").to(tl.float32)
            y = ((x - k) - mean_s) * rstd
            if HAS_WEIGHT:
                y = y * tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
            if HAS_BIAS:
                y = y + tl.load(B + cols, mask=cmask, other=0.0).to(tl.float32)
            _store_y(Y, r.to(tl.int64) * stride_y + cols, y, live, ROUND_BF16)
            # row r + GRID, first read: chunk c + 1 (past the last chunk: masked off)
            ncols = cols + BLOCK_N
            nmask = (ncols < N) & (nxt < M)
            xn = tl.load(X + nbase + ncols, mask=nmask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            sh = tl.where(nmask, xn - k_n, 0.0)
            s1 += sh
            s2 += sh * sh
        tl.store(MEAN + r, k + mean_s, mask=r < M)
        tl.store(RSTD + r, rstd, mask=r < M)
        k = k_n
        mean_s, rstd = _ln_stats(s1, s2, N, eps)
        base = nbase
        i += 1


class _Pipelined:
    """A looped kernel's class with the pipelined kernel over a persistent grid of
    ``programs_per_sm`` programs per SM (at most M), BLOCK_N and warps from ``block_n`` and
    ``warps`` (default: the looped kernel's setting for N)."""

    kernel_fn = None
    programs_per_sm = 1
    block_n: int | None = None
    warps: int | None = None

    def config(self, n: int, dtype: torch.dtype, m: int | None = None) -> LaunchConfig:
        cfg = launch_config(n, dtype, looped=True, op=self.op, m=m)  # the looped kernels' own
        return LaunchConfig(block_n=self.block_n or cfg.block_n, rows=1, num_warps=self.warps or cfg.num_warps)

    def _meta(self, cfg: LaunchConfig) -> dict:
        return {}  # no ROWS: one row at a time per program

    def run(self, x: torch.Tensor, cfg: LaunchConfig, tensors: tuple, scalars: tuple, **meta) -> None:
        """As TritonKernel.run, over a persistent grid, with GRID and ITERS after the scalars."""
        m = x.shape[0]
        sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.device.type == "cuda" else 2
        grid = max(1, min(m, sms * self.programs_per_sm))
        self.launch("", x, cfg, *tensors, *scalars, grid, -(-m // grid), grid=(grid,), **meta)

    def launch(self, kernel_name: str, x: torch.Tensor, cfg: LaunchConfig, *args, grid=None, **meta):
        fn = self.kernel_fn  # not in impls.triton._kernels, which TritonKernel.launch looks in
        kwargs = self.launch_kwargs(x, cfg, **meta)
        if x.device.type == "cuda":
            with torch.cuda.device(x.device):
                return fn[grid](*args, **kwargs)
        return fn[grid](*args, **kwargs)


def pipelined(op: str, programs_per_sm: int = 1, block_n: int | None = None, warps: int | None = None):
    """A pipelined looped kernel for ``op`` with these launch choices (a fresh object: the probe
    times several side by side)."""
    base = TritonRMSNormLooped if op == "rms_norm" else TritonLayerNormLooped
    fn = rms_norm_pipelined if op == "rms_norm" else layer_norm_pipelined
    cls = type(f"Pipelined{base.__name__}", (_Pipelined, base),
               {"variant": "pipelined", "kernel_fn": fn, "programs_per_sm": programs_per_sm,
                "block_n": block_n, "warps": warps, "lean_launch": False})
    return cls()


# The split kernels with the exchange off the critical path ("lagged"). triton.split waits for
# every sibling's partial of row i before it stores row i, so each row costs a load plus a
# wait for the slowest of SPLITS programs. Here iteration i publishes row i's partial, then
# waits for row i - 1's (published by the siblings one iteration ago: normally there already)
# and stores row i - 1, whose x it still holds; the load of row i + 1 is in flight meanwhile.
# One epilogue iteration stores each group's last row. A fast program may publish row k while
# a slow sibling still reads row k - 3 (it waited for row k - 2 to be published, no more), so
# the workspace has LAG_SLOTS = 4 row slots per group. GPU only, as triton.split (all programs
# of a row resident at once).
LAG_SLOTS = 4


@triton.jit
def _lag_slot(WORDS, group, it, SPLITS: tl.constexpr):
    return WORDS + (group * 4 + it % 4) * SPLITS * 2


@triton.jit
def _lag_publish(WORDS, group, part, it, a, b, SPLITS: tl.constexpr):
    slot = _lag_slot(WORDS, group, it, SPLITS)
    tag = (it + 1).to(tl.int64) << 32
    tl.atomic_xchg(slot + part * 2, tag | a.to(tl.uint32, bitcast=True).to(tl.int64), sem="relaxed", scope="gpu")
    tl.atomic_xchg(slot + part * 2 + 1, tag | b.to(tl.uint32, bitcast=True).to(tl.int64), sem="relaxed", scope="gpu")


@triton.jit
def _lag_wait(WORDS, group, it, SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr):
    slot = _lag_slot(WORDS, group, it, SPLITS)
    tag = (it + 1).to(tl.int64) << 32
    j = tl.arange(0, SPLITS_P2)
    wa = tl.load(slot + j * 2, mask=j < SPLITS, other=tag, volatile=True)
    wb = tl.load(slot + j * 2 + 1, mask=j < SPLITS, other=tag, volatile=True)
    while tl.sum(((wa >> 32) != (it + 1)).to(tl.int32) + ((wb >> 32) != (it + 1)).to(tl.int32), axis=0) > 0:
        wa = tl.load(slot + j * 2, mask=j < SPLITS, other=tag, volatile=True)
        wb = tl.load(slot + j * 2 + 1, mask=j < SPLITS, other=tag, volatile=True)
    pa = (wa & 0xFFFFFFFF).to(tl.uint32).to(tl.float32, bitcast=True)
    pb = (wb & 0xFFFFFFFF).to(tl.uint32).to(tl.float32, bitcast=True)
    return tl.where(j < SPLITS, pa, 0.0), tl.where(j < SPLITS, pb, 0.0)


@triton.jit
def _lag_finish(WORDS, DONE, group, SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr):
    done = tl.atomic_add(DONE + group, 1, sem="acq_rel", scope="gpu")
    if done == SPLITS - 1:
        j = tl.arange(0, 8 * SPLITS_P2)
        tl.store(WORDS + group * 8 * SPLITS + j, tl.zeros([8 * SPLITS_P2], dtype=tl.int64), mask=j < 8 * SPLITS)
        tl.atomic_xchg(DONE + group, 0, sem="release", scope="gpu")


@triton.jit(do_not_specialize=["GROUPS"])
def rms_norm_split_lag(
    X, W, Y, RSTD, WORDS, DONE, M, N: tl.constexpr, stride_x, stride_y, eps, GROUPS,
    HAS_WEIGHT: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr,
    ROUND_BF16: tl.constexpr, RELOAD: tl.constexpr = False,
):
    # RELOAD: row i - 1 read again (from L2, read one step ago) instead of held in registers.
    group = tl.program_id(0) // SPLITS
    part = tl.program_id(0) % SPLITS
    cols = part * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    x_cur = tl.load(X + group.to(tl.int64) * stride_x + cols, mask=cmask, other=0.0)  # group < M
    # A value of its own: initialised as x_cur, Triton 3.6 drops x_prev from the loop's carried
    # values and reads x_cur in its place (bad rows: all but each group's first).
    x_prev = tl.zeros([BLOCK_N], dtype=X.dtype.element_ty)
    it = 0
    row = group
    while row < M + GROUPS:  # the last step (row >= M) only stores (a while loop: the interpreter)
        x = x_cur.to(tl.float32)
        ss = tl.sum(x * x, axis=0)
        nxt = row + GROUPS
        x_next = tl.load(X + nxt.to(tl.int64) * stride_x + cols, mask=cmask & (nxt < M), other=0.0,
                         eviction_policy="evict_last" if RELOAD else "")
        if row < M:
            _lag_publish(WORDS, group, part, it, ss, ss, SPLITS)
        if it > 0:
            ss_j, _ = _lag_wait(WORDS, group, it - 1, SPLITS, SPLITS_P2)
            rstd = tl.rsqrt(tl.sum(ss_j, axis=0) / N + eps)  # the same order in every program
            if RELOAD:
                x_prev = tl.load(X + (row - GROUPS).to(tl.int64) * stride_x + cols, mask=cmask, other=0.0,
                                 eviction_policy="evict_first")
            y = x_prev.to(tl.float32) * rstd
            if HAS_WEIGHT:
                y = y * tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
            prev = row - GROUPS
            _store_y(Y, prev.to(tl.int64) * stride_y + cols, y, cmask, ROUND_BF16)
            if part == 0:
                tl.store(RSTD + prev, rstd)
        x_prev = x_cur
        x_cur = x_next
        it += 1
        row += GROUPS
    _lag_finish(WORDS, DONE, group, SPLITS, SPLITS_P2)


@triton.jit(do_not_specialize=["GROUPS"])
def layer_norm_split_lag(
    X, W, B, Y, MEAN, RSTD, WORDS, DONE, M, N: tl.constexpr, stride_x, stride_y, eps, GROUPS,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr,
    SPLITS_P2: tl.constexpr, ROUND_BF16: tl.constexpr,
):
    # triton.split's statistics (each part's exact mean and centred M2, merged by Chan's
    # combination), lagged as rms_norm_split_lag.
    group = tl.program_id(0) // SPLITS
    part = tl.program_id(0) % SPLITS
    cols = part * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    n_part = tl.minimum(N - part * BLOCK_N, BLOCK_N).to(tl.float32)
    j = tl.arange(0, SPLITS_P2)
    n_j = tl.minimum(tl.maximum(N - j * BLOCK_N, 0), BLOCK_N).to(tl.float32)
    x_cur = tl.load(X + group.to(tl.int64) * stride_x + cols, mask=cmask, other=0.0)
    # A value of its own: initialised as x_cur, Triton 3.6 drops x_prev from the loop's carried
    # values and reads x_cur in its place (bad rows: all but each group's first).
    x_prev = tl.zeros([BLOCK_N], dtype=X.dtype.element_ty)
    m_prev = 0.0
    it = 0
    row = group
    while row < M + GROUPS:  # the last step (row >= M) only stores (a while loop: the interpreter)
        x = x_cur.to(tl.float32)
        m_part = tl.sum(x, axis=0) / n_part
        d = tl.where(cmask, x - m_part, 0.0)
        m2_part = tl.sum(d * d, axis=0)
        nxt = row + GROUPS
        x_next = tl.load(X + nxt.to(tl.int64) * stride_x + cols, mask=cmask & (nxt < M), other=0.0)
        if row < M:
            _lag_publish(WORDS, group, part, it, m_part, m2_part, SPLITS)
        if it > 0:
            m_j, m2_j = _lag_wait(WORDS, group, it - 1, SPLITS, SPLITS_P2)
            mean = tl.sum(n_j * m_j, axis=0) / N
            dm = m_j - mean
            var = (tl.sum(m2_j, axis=0) + tl.sum(n_j * dm * dm, axis=0)) / N
            rstd = tl.rsqrt(var + eps)
            d_prev = tl.where(cmask, x_prev.to(tl.float32) - m_prev, 0.0)
            y = (d_prev + (m_prev - mean)) * rstd
            if HAS_WEIGHT:
                y = y * tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
            if HAS_BIAS:
                y = y + tl.load(B + cols, mask=cmask, other=0.0).to(tl.float32)
            prev = row - GROUPS
            _store_y(Y, prev.to(tl.int64) * stride_y + cols, y, cmask, ROUND_BF16)
            if part == 0:
                tl.store(MEAN + prev, mean)
                tl.store(RSTD + prev, rstd)
        x_prev = x_cur
        x_cur = x_next
        m_prev = m_part
        it += 1
        row += GROUPS
    _lag_finish(WORDS, DONE, group, SPLITS, SPLITS_P2)


_LAG_WORKSPACE: dict = {}


def _lag_workspace(device: torch.device):
    from impls.gpu_limits import SM_MAX_BLOCKS

    key = (device, torch.cuda.current_stream(device).cuda_stream)
    if key not in _LAG_WORKSPACE:
        programs = torch.cuda.get_device_properties(device).multi_processor_count * SM_MAX_BLOCKS
        _LAG_WORKSPACE[key] = (torch.zeros(2 * LAG_SLOTS * programs, dtype=torch.int64, device=device),
                               torch.zeros(programs, dtype=torch.int32, device=device))
    return _LAG_WORKSPACE[key]


def split_lag(op: str, block_n: int | None = None, warps: int | None = None, reload: bool = False):
    """triton.split's class with the lagged kernel (a fresh object with its own launch setting;
    default: triton.split's for N)."""
    from impls import registry
    from impls.gpu_limits import cdiv, next_pow2
    from impls.triton import _split

    base = type(registry.get(op, "triton", "split"))
    fn = rms_norm_split_lag if op == "rms_norm" else layer_norm_split_lag

    def config(self, n, dtype, m=None):
        cfg = base.config(self, n, dtype, m)
        return LaunchConfig(block_n=block_n or cfg.block_n, rows=1, num_warps=warps or cfg.num_warps)

    def run(self, x, cfg, tensors, scalars, **meta):
        m, n = x.shape
        splits = cdiv(n, cfg.block_n)
        meta = dict(meta, SPLITS=splits, SPLITS_P2=next_pow2(splits), **({"RELOAD": True} if reload else {}))
        words, done = _lag_workspace(x.device)
        kwargs = self.launch_kwargs(x, cfg, **meta)
        with torch.cuda.device(x.device):
            compiled = fn.warmup(*tensors, words, done, *scalars, 1, grid=(1,), **kwargs)
            sms = torch.cuda.get_device_properties(x.device).multi_processor_count
            groups = max(1, min(m, sms * _split.programs_per_sm(compiled, x.device) // splits))
            fn[(groups * splits,)](*tensors, words, done, *scalars, groups, **kwargs)

    cls = type(f"Lagged{base.__name__}", (base,),
               {"variant": "split_lag", "config": config, "run": run, "_meta": lambda self, cfg: {},
                "lean_launch": False})
    return cls()


__all__ = ["pipelined", "rms_norm_pipelined", "layer_norm_pipelined", "split_lag", "rms_norm_split_lag",
           "layer_norm_split_lag"]
