"""The long-row probe's candidates (tools/long_row_probe.py, tools/candidate_backend.py): labels,
each with its tier and a factory of the kernel it times. The kernels themselves are the
registered ones with another plan or launch setting, or the candidates packages' own
(impls.triton.candidates, impls.tilelang.candidates), imported only when a factory is called.

Tier 1 holds the registered kernels and the open candidates, tiers 2 and 3 the baselines and the
settings already measured. What each measured, and why the registered kernels are as they are:
docs/perf-notes.md, items 44 and 51-58.
"""
from __future__ import annotations

NO_AFFINE = " no affine"  # a candidate label ending so is timed without weight and bias
NO_BIAS = " no bias"  # ... with the weight only
# The lagged split's load choices against the settings' own (x past L1, the weight and bias
# marked evict_last: settings.SPLIT_X_CACHE, SPLIT_W_EVICT): without either hint.
LOAD_CHOICES = (("", {}), (" no load hints", {"x_cache": "", "w_evict": ""}))


def affine_of(label: str, d) -> tuple:
    """The (weight, bias) a candidate runs with: the case's, or none (NO_AFFINE, NO_BIAS)."""
    if label.endswith(NO_AFFINE):
        return None, None
    return (d.weight, None) if label.endswith(NO_BIAS) else (d.weight, d.bias)


def _split(op, block_n=None, warps=None, **choices):
    from impls.triton import candidates

    return candidates.split(op, block_n, warps, **choices)


def _halves(block_n=None, warps=None):
    from impls.triton import candidates

    return candidates.store_halves(block_n, warps)


def _cluster(op, **choices):
    from impls.tilelang import candidates

    return candidates.cluster(op, **choices)


def _pipelined(blocks_per_sm=1):
    from impls.tilelang import candidates

    return candidates.splitk_pipelined(blocks_per_sm)


def _registered(op, backend, variant):
    from impls import registry

    return registry.get(op, backend, variant)


def _cluster_forms(op: str, name: str) -> list:
    """The cluster kernels' plan against its other forms: the exchange, the sums, rows a block."""
    return [
        (1, name, lambda: _cluster(op)),
        # The plan's exchange (st.async on each peer's mbarrier, the first arrive relaxed) against
        # the cluster barrier after the remote stores, with the first arrive fenced or relaxed,
        # and the mbarrier exchange with the arrive fenced
        (1, f"{name} barrier exchange", lambda: _cluster(op, mbar_exchange=False, relaxed_arrive=False)),
        (1, f"{name} barrier exchange relaxed", lambda: _cluster(op, mbar_exchange=False)),
        (1, f"{name} mbarrier exchange fenced", lambda: _cluster(op, relaxed_arrive=False)),
        # Each chunk summed from registers on its way into shared memory (Plan.stats_in_load; the
        # plan's for LayerNorm): the other form for each op
        (1, f"{name} {'stats in load' if op == 'rms_norm' else 'stats from shared memory'}",
         lambda: _cluster(op, stats_in_load=op == "rms_norm")),
        # The plans' block sums by warp shuffles and one barrier against TileLang's AllReduce;
        # 16 KB segments in clusters of up to 16
        (1, f"{name} AllReduce sums", lambda: _cluster(op, one_barrier_sum=False)),
        (2, f"{name} 16KB segments cluster<=16", lambda: _cluster(op, segment_bytes=16384, max_cluster=16)),
        # Each block's segment of the row one or two waves ahead brought into L2 first (not measured yet)
        *[(1, f"{name} L2 ahead {a}", lambda a=a: _cluster(op, l2_ahead=a)) for a in (1, 2)],
        # Rows a block: RMSNorm's plan carries 2 from N = 65536 (_long_plan.RMS_ROWS), LayerNorm's one
        (1, f"{name} {'1 row' if op == 'rms_norm' else '2 rows'}",
         lambda: _cluster(op, rows=1 if op == "rms_norm" else 2)),
    ]


def _split_choices(op: str) -> list:
    """triton.split's load choices, the L2 prefetch and the next row's load, at its widths."""
    return [
        *[(1, f"triton.split{label}", lambda c=c: _split(op, **c)) for label, c in LOAD_CHOICES],
        # Rows past the next one brought into L2 by a bulk prefetch (not measured yet)
        *[(1, f"triton.split L2 ahead {a}", lambda a=a: _split(op, l2_ahead=a)) for a in (1, 2, 4)],
        # ... and no row held ahead in registers: each row loaded in its own step, from L2 (two rows
        # in registers, not three; not measured yet)
        (1, "triton.split L2 only", lambda: _split(op, hold_next=False, l2_ahead=1)),
        (1, "triton.split L2 only ahead 2", lambda: _split(op, hold_next=False, l2_ahead=2)),
        *[(2, f"triton.split L2 only {bn}x{w}w", lambda bn=bn, w=w: _split(op, bn, w, hold_next=False, l2_ahead=1))
          for bn, w in ((1024, 2), (2048, 4), (4096, 8))],
        (1, "triton.split next first", lambda: _split(op, next_first=True)),
        (1, "triton.split next after", lambda: _split(op, next_first=False)),
        *[(2, f"triton.split next first {bn}x{w}w", lambda bn=bn, w=w: _split(op, bn, w, next_first=True))
          for bn, w in ((1024, 2), (2048, 2), (2048, 4), (4096, 4), (4096, 8), (8192, 8), (8192, 16))],
    ]


def _baselines(op: str, name: str) -> list:
    """Without affine, the other variants, and the settings already measured."""
    return [
        (2, "triton.split" + NO_AFFINE, lambda: _split(op)),
        (2, name + NO_AFFINE, lambda: _cluster(op)),
        (2, "triton.looped", lambda: _registered(op, "triton", "looped")),
        (2, "triton.split 8192x16w", lambda: _split(op, 8192, 16)),
        *[(3, f"triton.split {bn}x{w}w", lambda bn=bn, w=w: _split(op, bn, w))
          for bn, w in ((1024, 2), (2048, 4), (4096, 8))],
        (3, "triton.split 2048x2w", lambda: _split(op, 2048, 2)),
        (3, "triton.split 4096x4w", lambda: _split(op, 4096, 4)),
        (3, "triton.split 8192x8w", lambda: _split(op, 8192, 8)),
        (3, f"{name} 256 threads", lambda: _cluster(op, threads=256)),
        (3, f"{name} 512 threads", lambda: _cluster(op, threads=512)),
        (3, "triton.split not lagged", lambda: _split(op, lagged=False)),
        (3, f"{name} 64KB segments", lambda: _cluster(op, segment_bytes=65536)),
        (3, f"{name} 16KB segments", lambda: _cluster(op, segment_bytes=16384)),
        (3, f"{name} cluster<=16", lambda: _cluster(op, max_cluster=16)),
    ]


def _layer_norm_only(name: str) -> list:
    op = "layer_norm"
    return [
        # Weight and bias of the first chunks in flight during the wait for the peers, and three
        # blocks an SM (80 registers a thread against 64); not measured yet (4 chunks ahead spill
        # 36 bytes at bf16 100000)
        (1, f"{name} wb ahead 2", lambda: _cluster(op, wb_ahead=2)),
        (1, f"{name} wb ahead 4", lambda: _cluster(op, wb_ahead=4)),
        (1, f"{name} 3 blocks an SM", lambda: _cluster(op, min_blocks=3)),
        (1, f"{name} 3 blocks an SM wb ahead 4", lambda: _cluster(op, min_blocks=3, wb_ahead=4)),
        # Two rows a block in clusters of 16 at 16-bit 262144 and float32 131072 (two 32 KB
        # segments, two blocks an SM); elsewhere the same as '2 rows'. Not measured yet
        (1, f"{name} cluster<=16 2 rows", lambda: _cluster(op, max_cluster=16, rows=2)),
        # With the weight only: what the bias's reads cost
        (2, name + NO_BIAS, lambda: _cluster(op)),
        (2, "triton.split" + NO_BIAS, lambda: _split(op)),
        # Weight and bias held, at widths of 16 columns a thread
        *[(2, f"triton.split weight held {bn}x{w}w", lambda bn=bn, w=w: _split(op, bn, w, hold_w=True))
          for bn, w in ((1024, 2), (2048, 4), (4096, 8))],
        # The store step in two halves (fewer registers)
        (2, "triton.split store halves", lambda: _halves()),
        *[(2, f"triton.split store halves {bn}x{w}w", lambda bn=bn, w=w: _halves(bn, w))
          for bn, w in ((2048, 2), (2048, 4), (4096, 4), (8192, 8))],
        # Last (a new exchange loop: if it hung, the candidates before it are in the files): a
        # cluster normalising rows one after another with its weight and bias segments kept in
        # shared memory, in clusters of up to 16 with 16 KB segments (four blocks an SM in
        # 16-bit) or 32 KB; with the next row brought into L2 as a row starts. Not measured yet
        *[(1, f"{name} {q} rows in turn{seg}{l2}",
           lambda q=q, b=b, a=a: _cluster(op, segment_bytes=b, max_cluster=16, seq_rows=q, l2_ahead=a))
          for q, seg, b, l2, a in ((8, "", 16384, "", 0), (8, "", 16384, " L2 ahead", 1), (32, "", 16384, "", 0),
                                   (8, " 32KB segments", 32768, "", 0))],
    ]


def candidates(op: str) -> list[tuple[int, str, object]]:
    """(tier, label, factory) of ``op``: the registered long-row kernels first, then other plans
    and launch choices, in the order the probe runs a tier's."""
    name = "tilelang.cluster" if op == "rms_norm" else "tilelang.layer_norm_cluster"
    c = _cluster_forms(op, name) + _split_choices(op) + _baselines(op, name)
    if op == "layer_norm":
        c += _layer_norm_only(name)
    if op == "rms_norm":  # the weight held in registers (LayerNorm's weight and bias held: slower)
        c[2:2] = [(1, "triton.split weight held", lambda: _split(op, hold_w=True)),
                  (1, "triton.split weight loaded", lambda: _split(op, hold_w=False))]
        c.append((3, "tilelang.splitk", lambda: _registered(op, "tilelang", "splitk")))
        # splitk's segments, two rows in flight per persistent block (not measured yet)
        c.append((3, "tilelang.splitk_pipelined", lambda: _pipelined(1)))
    return c
