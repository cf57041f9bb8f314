"""Offline sweep of the Triton launch settings on a GPU: the evidence behind
``impls.triton.settings.launch_config`` (see docs/perf-notes.md).

    python -m tools.triton_sweep --json sweep.json            # bf16 at every N, fp32 at some
    python -m tools.triton_sweep --ms 1,8,64 --ns 4096,8192 --json decode.json   # decode settings

For each op, dtype, N and variant it times every launch setting of ``settings()`` (rows per
program, warps, and for looped the chunk width) on M = max(16384, 2**26 / N) rows, cold L2,
timed as the benchmarks time (``harness.benchmarks.timing.gpu_time_ms``), and prints GB/s and % of the
copy ceiling of the same run, the heuristic's own choice marked. Compilation runs first in
``--jobs`` worker processes that share Triton's cache, so the timing process only loads.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import torch

from harness.benchmarks import timing
from harness.judging.shapes import BANDWIDTH_N, BENCH_LONG_N, bandwidth_rows
from harness.judging.cases import DTYPES
from impls import registry
from tools import _session
from impls.gpu_limits import next_pow2
from impls.triton.settings import ROWWISE_MAX_N, SPLIT_MAX, LaunchConfig

NS = BANDWIDTH_N + BENCH_LONG_N  # the benchmark's bandwidth shapes
FP32_NS = (1024, 4096, 5120, 12288, 16384, 65536)
LOOPED_MIN_N = 4000  # below it one tile holds the row; the looped kernel only adds a second read


def decode_settings(n: int):
    """Decode (few rows): one row per program (the 1-D kernel, as the decode rule runs), 4-32
    float32 values per thread, the weight loaded with x or after the reduction."""
    block_n = next_pow2(n)
    for per_thread in (4, 8, 16, 32):
        warps = block_n // (32 * per_thread)
        if 1 <= warps <= 32:
            for w_first in (False, True):
                yield LaunchConfig(block_n=block_n, rows=1, num_warps=warps, w_first=w_first, one_row=True)


def settings(variant: str, n: int):
    """Launch settings to try. rowwise: the whole row (padded to a power of two) in one tile, 1-4
    rows per program (one row: both the tile and the 1-D kernel), 8-32 float32 values per thread
    (64 for N >= 32768). looped: chunks of 1024-8192 columns, 1-2
    rows per program, 4, 8 or 16 values per thread (4: what Inductor's looped reductions use).
    split: 1024-16384 columns per program (at most SPLIT_MAX programs a row), 8, 16 or 32 values
    per thread."""
    if variant == "split":
        for block_n in (1024, 2048, 4096, 8192, 16384):
            if block_n > next_pow2(n):
                break
            if -(-n // block_n) > SPLIT_MAX:
                continue
            for per_thread in (8, 16, 32):
                warps = block_n // (32 * per_thread)
                if 1 <= warps <= 32:
                    yield LaunchConfig(block_n=block_n, rows=1, num_warps=warps)
        return
    if variant == "rowwise":
        block_n = next_pow2(n)
        for rows in (1, 2, 4):
            if rows > 1 and rows * block_n > 8192:
                break
            for per_thread in (8, 16, 32, 64):
                warps = rows * block_n // (32 * per_thread)
                if 1 <= warps <= 32 and (per_thread < 64 or block_n >= 32768):
                    for one_row in (False, True) if rows == 1 else (False,):
                        yield LaunchConfig(block_n=block_n, rows=rows, num_warps=warps, one_row=one_row)
        return
    for block_n in (1024, 2048, 4096, 8192):
        if block_n > next_pow2(n):
            break
        for rows in (1, 2):
            for per_thread in (4, 8, 16):
                warps = rows * block_n // (32 * per_thread)
                if 1 <= warps <= 32:
                    yield LaunchConfig(block_n=block_n, rows=rows, num_warps=warps)


def plan(dtypes, ops, ns, variants=("rowwise", "looped"), decode=False, fp32_ns=FP32_NS):
    """(op, dtype, n, variant, cfg) in run order; float32 only at ``fp32_ns``."""
    out = []
    for dtype in dtypes:
        for op in ops:
            for n in ns:
                if decode:
                    out += [(op, dtype, n, "rowwise", cfg) for cfg in decode_settings(n)]
                    continue
                if dtype == "float32" and n not in fp32_ns:
                    continue
                for variant in variants:
                    if (variant == "rowwise" and n > ROWWISE_MAX_N) or (variant != "rowwise" and n < LOOPED_MIN_N):
                        continue
                    out += [(op, dtype, n, variant, cfg) for cfg in settings(variant, n)]
    return out


def compile_part(entries) -> None:
    """Launch each setting once on a few rows: Triton compiles it into its on-disk cache."""
    for op, dtype, n, variant, cfg in entries:
        kernel = registry.get(op, "triton", variant)
        x = torch.randn(cfg.rows, n, device="cuda", dtype=DTYPES[dtype])
        w = torch.ones(n, device="cuda", dtype=x.dtype)
        b = torch.zeros(n, device="cuda", dtype=x.dtype) if op == "layer_norm" else None
        try:
            kernel._forward(x, w, b, 1e-6, kernel.allocate(x), cfg)
        except Exception as exc:  # the timing loop reports it against the setting
            print(f"compile failed: {op} {dtype} {n} {variant} {cfg}: {type(exc).__name__}", flush=True)
    torch.cuda.synchronize()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtypes", default="bfloat16,float32")
    p.add_argument("--ops", default="rms_norm,layer_norm")
    p.add_argument("--ns", default=",".join(map(str, NS)))
    p.add_argument("--variants", default="rowwise,looped")
    p.add_argument("--fp32-ns", default=",".join(map(str, FP32_NS)), help="the N at which float32 is swept")
    p.add_argument("--ms", default="", help="row counts to time by graph replay (decode); default: bandwidth rows")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--json")
    p.add_argument("--compile-part", help=argparse.SUPPRESS)  # "i/k": worker i of k
    args = p.parse_args(argv)
    registry.load_all()
    entries = plan(args.dtypes.split(","), args.ops.split(","), [int(v) for v in args.ns.split(",")],
                   args.variants.split(","), decode=bool(args.ms), fp32_ns=[int(v) for v in args.fp32_ns.split(",")])
    if args.compile_part:
        i, k = map(int, args.compile_part.split("/"))
        compile_part(entries[i::k])
        return 0

    t0 = time.time()
    base = [sys.executable, "-m", "tools.triton_sweep", "--dtypes", args.dtypes, "--ops", args.ops, "--ns", args.ns,
            "--variants", args.variants, "--fp32-ns", args.fp32_ns] + (["--ms", args.ms] if args.ms else [])
    workers = [subprocess.Popen(base + ["--compile-part", f"{i}/{args.jobs}"]) for i in range(args.jobs)]
    failed = sum(w.wait() != 0 for w in workers)
    print(f"compiled {len(entries)} settings in {time.time() - t0:.0f} s on {args.jobs} processes"
          + (f", {failed} workers failed" if failed else ""), flush=True)

    tools, ceiling = _session.start()
    results, held = [], None
    row_counts = [int(v) for v in args.ms.split(",")] if args.ms else [None]
    for (op, dtype, n, variant, cfg), m_given in [(e, m) for e in entries for m in row_counts]:
        kernel = registry.get(op, "triton", variant)
        dt = DTYPES[dtype]
        m = m_given or bandwidth_rows(n)
        if held is None or held[0] != (op, dtype, n, m):
            held = None
            torch.cuda.empty_cache()
            x = torch.randn(m, n, device="cuda", dtype=dt)
            w = torch.randn(n, device="cuda", dtype=dt)
            b = torch.randn(n, device="cuda", dtype=dt) if op == "layer_norm" else None
            held = ((op, dtype, n, m), x, w, b, kernel.allocate(x))
        _, x, w, b, out = held
        nbytes = timing.bytes_moved(m, n, dt, True, b is not None, len(kernel.outputs) - 1)
        fn = lambda: kernel._forward(x, w, b, 1e-6, out, cfg)  # noqa: E731
        r = dict(op=op, dtype=dtype, n=n, m=m, variant=variant, block_n=cfg.block_n, rows=cfg.rows,
                 warps=cfg.num_warps, w_first=cfg.w_first, one_row=cfg.one_row)
        label = (f"{op:<10} {dtype:<8} {m:>6}x{n:<6} {variant:<7} block={cfg.block_n:<5} rows={cfg.rows} "
                 f"warps={cfg.num_warps:<2}{' w_first' if cfg.w_first else ''}{' 1-D' if cfg.one_row else ''}")
        try:
            if m_given:  # as the decode benchmarks time: graph replay, L2 warm
                ms = statistics.median(timing.GraphTimer(fn, tools, clock=timing.KernelClock()).run(20, 3)) * 1e3
            else:
                ms = timing.gpu_time_ms(fn, tools, rounds=15, warmup=2)
        except Exception as exc:  # a setting Triton cannot compile is a result, not the end of the sweep
            lines = str(exc).strip().splitlines()
            r["error"] = f"{type(exc).__name__}: {lines[-1][:200] if lines else ''}"
            results.append(r)
            print(f"{label} failed: {r['error']}", flush=True)
            continue
        gbps = nbytes / ms / 1e6
        r.update(us=ms * 1e3, gbps=gbps, pct=100 * gbps / ceiling, heuristic=cfg == kernel.config(n, dt, m))
        results.append(r)
        print(f"{label} {r['us']:8.2f} us {gbps:6.0f} GB/s {r['pct']:5.1f}%" + (" <- heuristic" if r["heuristic"] else ""),
              flush=True)
        if args.json and len(results) % 50 == 0:  # a run cut short still leaves its results
            _session.write_json(args.json, ceiling, results)
    if args.json:
        _session.write_json(args.json, ceiling, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
