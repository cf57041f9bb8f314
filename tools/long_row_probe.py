"""Long rows on the GPU: the candidate kernels at N = 65536, 131072, 262144, each as % of a copy
timed in the same process (harness.timing, as harness.measure times), with a float64 check of
sampled rows, a repeat compared bit for bit and the first rows run alone (batch invariance).

    python -m tools.long_row_probe --out "$OUT" [--ops rms_norm,layer_norm] [--dtype bfloat16]

Candidates run in tiers (the new kernels first, then the baselines and alternative launch
settings), each N's one after another. With --jobs, the TileLang plans and Triton candidates are
compiled first in parallel; with --again each N's candidates are timed once more in reverse
order (the mean of the two readings cancels a drift over the group). No candidate starts after
--budget seconds, which are shared out over the tiers' N by their number of candidates, so a
short budget drops the last candidates of each N rather than whole N. M: x of about 1 GiB
(--bench-rows: the benchmark's M, harness.shapes.bandwidth_rows, 2^31 elements and more at
N >= 131072). Writes long_rows.json and long_rows.txt under --out.
"""
from __future__ import annotations

import argparse
import copy
import json
import re
import time
import traceback
from pathlib import Path

import torch

from harness import timing
from harness.cases import DTYPES, Case, make_inputs
from harness.shapes import bandwidth_rows
from impls import registry
from impls.base import UnsupportedCase, dtype_name, spec_of

SAMPLE_ROWS = 8  # rows checked against float64 (the first ones; the last row too)
NO_AFFINE = " no affine"  # a candidate label ending so is timed without weight and bias
NO_BIAS = " no bias"  # ... with the weight only


def affine_of(label: str, d) -> tuple:
    """The (weight, bias) a candidate runs with: the case's, or none (NO_AFFINE, NO_BIAS)."""
    if label.endswith(NO_AFFINE):
        return None, None
    return (d.weight, None) if label.endswith(NO_BIAS) else (d.weight, d.bias)


def _triton_split(op, depth=1, block_n=None, warps=None, lag=True, **choices):
    """triton.split with another launch setting: columns x warps, and the lagged kernels' load
    choices (LaunchConfig's hold_w, x_cache, w_evict, next_first) over the setting's own."""
    import dataclasses

    k = copy.copy(registry.get(op, "triton", "split"))
    k.__dict__.pop("_plans", None)  # the copy's own fast-path plans
    k.depth = depth
    if not lag:  # the kernel that waits for row i's partials before storing row i
        k.kernel_name = lambda n: k._kernel_name
    own = k.config
    k.config = lambda n, dtype, m=None: dataclasses.replace(
        own(n, dtype), **({"block_n": block_n, "num_warps": warps} if block_n else {}), **choices)
    return k


def _triton_halves(block_n=None, warps=None):
    """triton.split's LayerNorm with its lagged rows run by the store-halves candidate
    (impls.triton._candidates), which always loads the next row first and never holds the weight."""
    from impls.triton import _candidates
    from impls.triton.settings import SPLIT_LAG_MIN_N

    k = _triton_split("layer_norm", 1, block_n, warps, hold_w=False, next_first=True)
    k.kernel_module = _candidates
    k.kernel_name = lambda n: "layer_norm_split_lag_halves" if n >= SPLIT_LAG_MIN_N else k._kernel_name
    return k


def _triton_l2_only(op, block_n=None, warps=None, ahead=1):
    """triton.split's lagged kernel with no row held ahead in registers (LaunchConfig.hold_next
    off): each step loads its own row, which a bulk prefetch ``ahead`` steps earlier brought into L2."""
    return _triton_split(op, 1, block_n, warps, hold_next=False, l2_ahead=ahead)


def _tilelang_cluster(op, threads=None, segment_bytes=None, max_cluster=None, rows=None, min_blocks=None,
                      seq_rows=None, **exchange):
    """tilelang.cluster or tilelang.layer_norm_cluster with another plan: threads, segment size,
    cluster limit, rows a block carries (None: the plan's rule), launch bound (blocks an SM), and
    Plan fields of the kernels' forms (mbar_exchange, relaxed_arrive, stats_in_load)."""
    import dataclasses

    from impls.tilelang._long_plan import cluster_plan

    variant = "cluster" if op == "rms_norm" else "layer_norm_cluster"
    k = copy.copy(registry.get(op, "tilelang", variant))
    k.__dict__.pop("_plans", None)
    if threads or segment_bytes or max_cluster or rows is not None or min_blocks or seq_rows is not None or exchange:
        def plan_for(dtype, n, hw, hb, vec, m=None):
            plan = cluster_plan(variant, dtype, n, hw, hb, vec, threads, segment_bytes, max_cluster, rows, seq_rows)
            return dataclasses.replace(plan, min_blocks=min_blocks or plan.min_blocks, **exchange)
        k.plan_for = plan_for
    return k


def _tilelang_tma(op, segment_bytes=None, min_blocks=None):
    from impls.tilelang._candidates import cluster_tma

    return cluster_tma(op, segment_bytes, min_blocks)


def _tilelang_pipelined(blocks_per_sm=1):
    from impls.tilelang._candidates import splitk_pipelined

    return splitk_pipelined(blocks_per_sm)


# The lagged split's load choices against the settings' own (x past L1, the weight and bias
# marked evict_last: settings.SPLIT_X_CACHE, SPLIT_W_EVICT): without either hint.
LOAD_CHOICES = (("", {}), (" no load hints", {"x_cache": "", "w_evict": ""}))


def candidates(op: str) -> list[tuple[int, str, object]]:
    """(tier, label, factory): the registered long-row kernels first, then other launch choices.
    Measured at 2bfae55 and dbe314e (docs/perf-notes.md item 44): the cluster kernels with
    segments in shared memory beat segments in registers by 10-25 points; clusters of up to 16
    and 16 or 64 KB segments no faster than the rule; the lagged split beat the waiting one by up
    to 35 points at 262144, and split programs of 16384 or 32768 columns were slower. At 4bd3a63
    and 6696c2b (item 51): the segment loaded by cp.async, the split's loads staged by Triton's
    pipeliner and a second row ahead in the lagged split were all slower (removed). At 585cb45
    (item 52): without weight and bias the kernels gain up to 22 points; the lagged split with
    its weight held in registers led at RMSNorm bf16 131072 (92.7% against 85.8%; not repeated
    at 444e9ee). At 444e9ee-73545c4 (item 53): x past L1 with the weight kept in it gained up to
    6.5 points (now the settings'), the weight held led for float32 RMSNorm only, and the TMA
    segments and LayerNorm register caps (maxnreg 64, 80: 18-77%) were slower. At 630c0b1-98d44c4
    (item 54): the next row's load before the row's reductions gained LayerNorm 0.4-13 points
    (now the settings' for LayerNorm), caps of 96 and 112 registers on that kernel did not gain
    (removed), and weight and bias held at 2048 x 4 warps led for float32 LayerNorm 65536 only.
    At 725bf38 and 53ab279 (item 55): two rows a TileLang block at two blocks an SM led for
    RMSNorm (now its plan) and lost for LayerNorm; two or four rows with smaller segments, and
    the weight and bias loaded into registers before the reductions, were slower or level
    (removed); triton.split's store step in two halves led by at most 3 points (not taken). At
    dfc0b9d (item 56): the exchange by st.async on each peer's mbarrier with the first cluster
    arrive relaxed led the cluster barrier exchange by 2.3-10.5 points at all 18 shapes (now the
    plan's); either change alone and triton.split at one warp a program were slower. At 5cdceca
    (item 56): LayerNorm's chunks summed on their way into shared memory led on that exchange by
    1.5-3.0 points at 8 of 9 shapes (now its plan's); RMSNorm's were level. At c41385e (item 57,
    the H200): block sums with one barrier led TileLang's AllReduce at 15 of 18 shapes by 1.0-5.1
    points (now the plans'), clusters of 16 led at float32 262144 (now the rule there), 16 KB
    segments and 512 threads lost LayerNorm up to 22 points, RMSNorm at one row a block led the
    two-row plan at three 16-bit shapes by 1.4-2.0 (not taken: one probe), and LayerNorm without
    its bias ran 1.7-8 points faster."""
    name = "tilelang.cluster" if op == "rms_norm" else "tilelang.layer_norm_cluster"
    c = [
        (1, name, lambda: _tilelang_cluster(op)),
        # The plan's exchange (st.async on each peer's mbarrier, the first arrive relaxed: item 56)
        # against the cluster barrier after the remote stores, with the first arrive fenced or
        # relaxed, and the mbarrier exchange with the arrive fenced
        (1, f"{name} barrier exchange", lambda: _tilelang_cluster(op, mbar_exchange=False, relaxed_arrive=False)),
        (1, f"{name} barrier exchange relaxed", lambda: _tilelang_cluster(op, mbar_exchange=False)),
        (1, f"{name} mbarrier exchange fenced", lambda: _tilelang_cluster(op, relaxed_arrive=False)),
        # Each chunk summed from registers on its way into shared memory (Plan.stats_in_load):
        # one pass over shared memory fewer (RMSNorm), two (LayerNorm)
        # (the plan's for LayerNorm: _long_plan.LN_STATS_IN_LOAD; the other form for each op)
        (1, f"{name} {'stats in load' if op == 'rms_norm' else 'stats from shared memory'}",
         lambda: _tilelang_cluster(op, stats_in_load=op == "rms_norm")),
        # The plans' block sums by warp shuffles and one barrier (_long_plan.ONE_BARRIER_SUM, from
        # c41385e's probe, where the other labels here were "one-barrier sums ...") against
        # TileLang's AllReduce (two barriers a round); 16 KB segments in clusters of up to 16
        (1, f"{name} AllReduce sums", lambda: _tilelang_cluster(op, one_barrier_sum=False)),
        (2, f"{name} 16KB segments cluster<=16", lambda: _tilelang_cluster(op, segment_bytes=16384, max_cluster=16)),
        # Each block's segment of the row one or two waves ahead brought into L2 first
        # (Plan.l2_ahead); built after 29bbf56, not measured yet
        *[(1, f"{name} L2 ahead {a}", lambda a=a: _tilelang_cluster(op, l2_ahead=a)) for a in (1, 2)],
        # Rows a block (the same threads on each; one weight and bias load for them): RMSNorm's
        # plan carries 2 from N = 65536 (_long_plan.RMS_ROWS), LayerNorm's one
        (1, f"{name} {'1 row' if op == 'rms_norm' else '2 rows'}",
         lambda: _tilelang_cluster(op, rows=1 if op == "rms_norm" else 2)),
        (2, f"{name} TMA", lambda: _tilelang_tma(op)),
        (2, f"{name} TMA 16KB segments", lambda: _tilelang_tma(op, segment_bytes=16384)),
        (2, f"{name} TMA 6 blocks", lambda: _tilelang_tma(op, min_blocks=6)),
        *[(1, f"triton.split{label}", lambda c=c: _triton_split(op, **c)) for label, c in LOAD_CHOICES],
        # Rows past the next one brought into L2 by a bulk prefetch (LaunchConfig.l2_ahead): HBM
        # reads in flight that hold no registers; built after 29bbf56, not measured yet
        *[(1, f"triton.split L2 ahead {a}", lambda a=a: _triton_split(op, l2_ahead=a)) for a in (1, 2, 4)],
        # ... and no row held ahead in registers (LaunchConfig.hold_next off): each row loaded in its
        # own step, from L2 (two rows in registers, not three: LayerNorm bf16 131072 at 4096 x 4
        # warps 96 registers against 128, sm_90 offline); built after 29bbf56, not measured yet
        (1, "triton.split L2 only", lambda: _triton_l2_only(op)),
        (1, "triton.split L2 only ahead 2", lambda: _triton_l2_only(op, ahead=2)),
        *[(2, f"triton.split L2 only {bn}x{w}w", lambda bn=bn, w=w: _triton_l2_only(op, bn, w))
          for bn, w in ((1024, 2), (2048, 4), (4096, 8))],
        (1, "triton.split next first", lambda: _triton_split(op, next_first=True)),
        (1, "triton.split next after", lambda: _triton_split(op, next_first=False)),
        *[(2, f"triton.split next first {bn}x{w}w", lambda bn=bn, w=w: _triton_split(op, 1, bn, w, next_first=True))
          for bn, w in ((1024, 2), (2048, 2), (2048, 4), (4096, 4), (4096, 8), (8192, 8), (8192, 16))],
        (2, "triton.split" + NO_AFFINE, lambda: _triton_split(op)),
        (2, name + NO_AFFINE, lambda: _tilelang_cluster(op)),
        (2, "triton.looped", lambda: registry.get(op, "triton", "looped")),
        (2, "triton.split 8192x16w", lambda: _triton_split(op, 1, 8192, 16)),
        *[(3, f"triton.split {bn}x{w}w", lambda bn=bn, w=w: _triton_split(op, 1, bn, w))
          for bn, w in ((1024, 2), (2048, 4), (4096, 8))],
        (3, "triton.split 2048x2w", lambda: _triton_split(op, 1, 2048, 2)),
        (3, "triton.split 4096x4w", lambda: _triton_split(op, 1, 4096, 4)),
        (3, "triton.split 8192x8w", lambda: _triton_split(op, 1, 8192, 8)),
        (3, f"{name} 256 threads", lambda: _tilelang_cluster(op, threads=256)),
        (3, f"{name} 512 threads", lambda: _tilelang_cluster(op, threads=512)),
        (3, "triton.split not lagged", lambda: _triton_split(op, lag=False)),
        (3, f"{name} 64KB segments", lambda: _tilelang_cluster(op, segment_bytes=65536)),
        (3, f"{name} 16KB segments", lambda: _tilelang_cluster(op, segment_bytes=16384)),
        (3, f"{name} cluster<=16", lambda: _tilelang_cluster(op, max_cluster=16)),
    ]
    if op == "layer_norm":
        # Weight and bias of the first chunks in flight during the wait for the peers
        # (Plan.wb_ahead), and three blocks an SM (80 registers a thread against 64): built after
        # b99c842, not measured yet (4 chunks ahead spill 36 bytes at bf16 100000)
        c += [(1, f"{name} wb ahead 2", lambda: _tilelang_cluster(op, wb_ahead=2)),
              (1, f"{name} wb ahead 4", lambda: _tilelang_cluster(op, wb_ahead=4)),
              (1, f"{name} 3 blocks an SM", lambda: _tilelang_cluster(op, min_blocks=3)),
              (1, f"{name} 3 blocks an SM wb ahead 4", lambda: _tilelang_cluster(op, min_blocks=3, wb_ahead=4))]
        # Two rows a block (one weight and bias load for both) at 16-bit 262144 and float32 131072
        # in clusters of 16 (256 threads, two 32 KB segments, two blocks an SM), where the plan
        # has 8 blocks of 512 threads and one row; elsewhere the same as '2 rows'. Built after
        # 29bbf56 (sm_90: 128 registers, no spills), not measured yet
        c += [(1, f"{name} cluster<=16 2 rows", lambda: _tilelang_cluster(op, max_cluster=16, rows=2))]
        # With the weight only: what the bias's reads cost
        c += [(2, name + NO_BIAS, lambda: _tilelang_cluster(op)),
              (2, "triton.split" + NO_BIAS, lambda: _triton_split(op))]
        # Weight and bias held, at widths of 16 columns a thread (item 54)
        c += [(2, f"triton.split weight held {bn}x{w}w", lambda bn=bn, w=w: _triton_split(op, 1, bn, w, hold_w=True))
              for bn, w in ((1024, 2), (2048, 4), (4096, 8))]
        # impls/triton/_candidates.py: the store step in two halves (fewer registers); within 3
        # points of triton.split at 725bf38 (item 55)
        c += [(2, "triton.split store halves", lambda: _triton_halves())]
        c += [(2, f"triton.split store halves {bn}x{w}w", lambda bn=bn, w=w: _triton_halves(bn, w))
              for bn, w in ((2048, 2), (2048, 4), (4096, 4), (8192, 8))]
        # Last (a new exchange loop: if it hung, the candidates before it are in the files):
        # a cluster normalising rows one after another with its weight and bias segments kept in
        # shared memory (Plan.seq_rows; _long_programs.layer_norm_cluster_rows): no weight or bias
        # read from L2 after a cluster's first row. Clusters of up to 16 with 16 KB segments (four
        # blocks an SM in 16-bit), or 32 KB; with the next row brought into L2 as a row starts.
        # Built after 29bbf56 (sm_90, every dtype: no spills), not measured yet
        c += [(1, f"{name} {q} rows in turn{seg}{l2}",
               lambda q=q, b=b, a=a: _tilelang_cluster(op, segment_bytes=b, max_cluster=16, seq_rows=q, l2_ahead=a))
              for q, seg, b, l2, a in ((8, "", 16384, "", 0), (8, "", 16384, " L2 ahead", 1), (32, "", 16384, "", 0),
                                       (8, " 32KB segments", 32768, "", 0))]
    if op == "rms_norm":  # the weight held in registers (LayerNorm's weight and bias held: slower, item 52)
        c[2:2] = [(1, "triton.split weight held", lambda: _triton_split(op, hold_w=True)),
                  (1, "triton.split weight loaded", lambda: _triton_split(op, hold_w=False))]
        c.append((3, "tilelang.splitk", lambda: registry.get(op, "tilelang", "splitk")))
        # impls/tilelang/_candidates.py: splitk's segments, two rows in flight per persistent block
        # (sm_90, bf16: 143 registers at 256 threads, one block an SM); not measured yet
        c.append((3, "tilelang.splitk_pipelined", lambda: _tilelang_pipelined(1)))
    return c


def reference(op, x, w, b, eps):
    x = x.double()
    if op == "rms_norm":
        rstd = torch.rsqrt((x * x).mean(-1, keepdim=True) + eps)
        y = x * rstd
    else:
        mean = x.mean(-1, keepdim=True)
        rstd = torch.rsqrt(((x - mean) ** 2).mean(-1, keepdim=True) + eps)
        y = (x - mean) * rstd
    if w is not None:
        y = y * w.double()
    if b is not None:
        y = y + b.double()
    return y, rstd.squeeze(-1)


def check(op, kernel, x, w, b, eps, out) -> dict:
    rows = list(range(SAMPLE_ROWS)) + [x.shape[0] - 1]
    tol = 2 ** -7 if x.dtype != torch.float32 else 1e-5  # about one bf16 ulp of y; fp32: 1e-5
    ref_y, ref_rstd = reference(op, x[rows], w, b, eps)
    y = out.y[rows].double()
    scale = ref_y.abs().max().item()
    err = (y - ref_y).abs().max().item()
    rstd_rel = ((out.rstd.reshape(-1)[rows].double() - ref_rstd).abs() / ref_rstd).max().item()
    again = kernel(x, w, b, eps)
    alone = kernel(x[:SAMPLE_ROWS].contiguous(), w, b, eps)
    row_err = (y - ref_y).abs().amax(dim=1)
    return {"y_max_abs_err": err, "y_max_abs": scale, "rstd_max_rel_err": rstd_rel,
            "bad_rows": [r for r, e in zip(rows, row_err.tolist()) if e > tol * max(scale, 1.0)],
            "ok": err <= tol * max(scale, 1.0) and rstd_rel <= 1e-4,
            "repeat_bitwise": bool(torch.equal(again.y, out.y)),
            "alone_bitwise": bool(torch.equal(alone.y, out.y[:SAMPLE_ROWS]))}


def _compile(plan) -> str | None:
    """A worker's share of the prewarm: compile one TileLang plan into TileLang's disk cache."""
    try:
        from impls.tilelang import _candidates, compiler

        _candidates._register_builder()
        compiler.compile_plan(plan)
    except Exception as exc:  # noqa: BLE001 (the probe reports it when it runs the candidate)
        return f"{plan.describe()}: {type(exc).__name__}: {exc}"[:300]
    return None


# Rows of the prewarm's Triton calls: Triton specialises an int argument on its divisibility by 16,
# so M = 16 compiles what the probe's x (a power-of-two M) runs, and SAMPLE_ROWS what check's
# rows alone run.
WARM_ROWS = (16, SAMPLE_ROWS)


def _compile_triton(task: tuple) -> str | None:
    """A worker's share of the prewarm: one Triton candidate (op, label, N, dtype) called on a few
    rows, which leaves its compiled kernels in Triton's disk cache."""
    op, label, n, dt = task
    try:
        registry.load_all()
        kernel = {lab: make for _, lab, make in candidates(op)}[label]()
        for m in WARM_ROWS:
            d = make_inputs(Case(op, dt, (m, n)), "cuda")
            w, b = affine_of(label, d)
            spec = spec_of(op, d.x, "cuda", w, b)
            if kernel.unsupported(spec):
                return None
            kernel.prepare(spec)
            kernel(d.x, w, b, d.eps)
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 (the probe reports it when it runs the candidate)
        return f"{label} N={n}: {type(exc).__name__}: {exc}"[:300]
    return None


def prewarm(plans: list, jobs: int, triton_tasks: list = ()) -> None:
    """Compile the TileLang candidates' plans and the Triton candidates (``triton_tasks``) in
    parallel (spawned workers: CUDA cannot fork), so the probe's budget goes to timing; the probe
    then loads them from the disk caches."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    t0 = time.perf_counter()
    with ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as pool:
        futures = [pool.submit(_compile, p) for p in plans] + [pool.submit(_compile_triton, t) for t in triton_tasks]
        errors = [e for e in (f.result() for f in futures) if e]
    print(f"prewarm: {len(plans)} TileLang plans, {len(triton_tasks)} Triton candidates in "
          f"{time.perf_counter() - t0:.0f} s" + "".join(f"\n  {e}" for e in errors), flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.long_row_probe", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--ops", default="rms_norm,layer_norm")
    p.add_argument("--dtype", default="bfloat16", choices=tuple(DTYPES))
    p.add_argument("--ns", default="65536,131072,262144")
    p.add_argument("--tiers", type=int, default=3)
    p.add_argument("--only", default="", help="a regular expression: only the candidates whose label it matches")
    p.add_argument("--budget", type=float, default=110.0, help="seconds of the run (prewarm included) after which "
                   "no candidate starts, shared out by N")
    p.add_argument("--bench-rows", action="store_true", help="the benchmark's M instead of x of about 1 GiB")
    p.add_argument("--again", action="store_true", help="time each N's candidates a second time, in reverse "
                   "order, and report the mean of the two readings")
    p.add_argument("--jobs", type=int, default=0, help="compile the TileLang candidates first in this many "
                   "processes (0: none)")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    registry.load_all()
    dtype = DTYPES[args.dtype]
    tools = timing.GpuTools()
    ceiling = timing.copy_ceiling_gbps("cuda", tools)[0]
    ops, ns = args.ops.split(","), [int(v) for v in args.ns.split(",")]
    inputs = {}
    rows, lines = [], [f"{torch.cuda.get_device_name()}  copy {ceiling:.0f} GB/s  dtype {args.dtype}"]

    def save():
        doc = {"gpu": torch.cuda.get_device_name(), "copy_gbps": ceiling, "dtype": args.dtype, "results": rows,
               "seconds": round(time.perf_counter() - t0, 1)}
        (out_dir / "long_rows.json").write_text(json.dumps(doc, indent=1))
        (out_dir / "long_rows.txt").write_text("\n".join(lines) + "\n")

    def inputs_for(op, n):
        if (op, n) not in inputs:
            m = bandwidth_rows(n) if args.bench_rows else max(1, 2**30 // (n * dtype.itemsize))
            inputs[op, n] = make_inputs(Case(op, dtype_name(dtype), (m, n)), "cuda")
        return inputs[op, n]

    if args.jobs:
        plans, triton_tasks = set(), []
        for op in ops:
            for n in ns:
                d = inputs_for(op, n)
                for t, label, make in candidates(op):
                    if t > args.tiers or not re.search(args.only, label):
                        continue
                    if label.startswith("triton"):
                        triton_tasks.append((op, label, n, args.dtype))
                    elif label.startswith("tilelang"):
                        try:
                            spec = spec_of(op, d.x, "cuda", *affine_of(label, d))
                            k = make()
                            if not k.unsupported(spec):
                                plans.add(k.compile_key(spec))
                        except Exception:  # noqa: BLE001 (reported when the candidate runs)
                            pass
        prewarm(sorted(plans, key=repr), args.jobs, triton_tasks)

    # Each N's candidates of a tier run one after another (compared under the same clocks). The
    # budget left after the prewarm is shared out over these groups by their number of runs
    # (cumulative: what one group leaves, the next may use), so where it runs short each group
    # loses its last candidates, not the last groups (the longest rows) all of theirs.
    groups = [(tier, op, n, [c for c in candidates(op) if c[0] == tier and re.search(args.only, c[1])])
              for tier in range(1, args.tiers + 1) for op in ops for n in ns]
    total = sum(len(g[3]) for g in groups) or 1
    t_timing = time.perf_counter()
    left = max(args.budget - (t_timing - t0), 0.0)
    runs_before = 0
    for tier, op, n, chosen in groups:
        runs_before += len(chosen)
        deadline = left * runs_before / total
        if not chosen:
            continue
        d = inputs_for(op, n)
        x, eps = d.x, d.eps
        m = x.shape[0]
        timed = []  # (label, kernel, row, bytes moved) of the group's candidates that ran, for --again
        for _, label, make in chosen:
            r = {"op": op, "n": n, "m": m, "kernel": label}
            if time.perf_counter() - t_timing > deadline:
                r["skipped"] = "budget"
            else:
                try:
                    kernel = make()
                    w, b = affine_of(label, d)
                    spec = spec_of(op, x, "cuda", w, b)
                    why = kernel.unsupported(spec)
                    if why:
                        raise UnsupportedCase(why)
                    c0 = time.perf_counter()
                    kernel.prepare(spec)
                    o = kernel(x, w, b, eps)
                    torch.cuda.synchronize()
                    r["compile_s"] = round(time.perf_counter() - c0, 1)
                    ms = timing.gpu_time_ms(kernel.bench_callable(x, w, b, eps, o), tools)
                    nbytes = timing.bytes_moved(m, n, dtype, w is not None, b is not None,
                                                len({"mean", "rstd"} & set(kernel.outputs)))
                    r.update(ms=ms, gbps=nbytes / ms / 1e6, pct_of_copy=100 * nbytes / ms / 1e6 / ceiling)
                    r.update(check(op, kernel, x, w, b, eps, o))
                    timed.append((label, kernel, r, nbytes))
                except UnsupportedCase as exc:
                    r["skipped"] = str(exc)
                except Exception as exc:  # noqa: BLE001 (one candidate's failure is a result)
                    r["error"] = f"{type(exc).__name__}: {exc}"[:800]
                    r["traceback"] = traceback.format_exc()[-3000:]
                    torch.cuda.synchronize()
            rows.append(r)
            if "pct_of_copy" in r:
                line = (f"{op:10s} {m}x{n:<7d} {label:42s} {r['pct_of_copy']:6.1f}%  {r['ms']:.3f} ms  "
                        f"err {r['y_max_abs_err']:.2e} ok={r['ok']} repeat={r['repeat_bitwise']} "
                        f"alone={r['alone_bitwise']}  compile {r['compile_s']}s"
                        + ("" if r["ok"] else f"  bad rows {r['bad_rows']}"))
            else:
                line = f"{op:10s} {m}x{n:<7d} {label:42s} " + (r.get("skipped") or r.get("error", ""))[:300]
            print(line, flush=True)
            lines.append(line)
            save()
        if args.again:  # each candidate timed again in reverse order: a drift over the group cancels in the mean
            for label, kernel, r, nbytes in reversed(timed):
                w, b = affine_of(label, d)
                ms = timing.gpu_time_ms(kernel.bench_callable(x, w, b, eps, kernel(x, w, b, eps)), tools)
                again = 100 * nbytes / ms / 1e6 / ceiling
                r.update(pct_of_copy_again=again, pct_of_copy_mean=(r["pct_of_copy"] + again) / 2)
                line = (f"{op:10s} {m}x{n:<7d} {label:42s} {again:6.1f}% again, mean {r['pct_of_copy_mean']:.1f}% "
                        f"(first {r['pct_of_copy']:.1f}%)")
                print(line, flush=True)
                lines.append(line)
            save()
    lines.append(f"total {time.perf_counter() - t0:.0f} s")
    save()
    print(lines[-1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
