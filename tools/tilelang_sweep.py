"""Offline sweep of the TileLang plans on a GPU: the evidence behind ``impls.tilelang.plan``
(see docs/perf-notes.md).

    python -m tools.tilelang_sweep --json sweep.json                 # bandwidth shapes
    python -m tools.tilelang_sweep --ms 1,64 --ns 4096,8192 --json decode.json

For each variant (fragment, layer_norm_fwd), dtype and N it times every plan of ``candidates()``
(threads per row, and the launch bound ``min_blocks``) on M = max(16384, 2**26 / N) rows with
cold L2 as the benchmarks time them (``harness.benchmarks.timing.gpu_time_ms``), or, given ``--ms``, at
those few rows by CUDA-graph replay as the decode benchmarks do. Each plan's y is checked
against a float64 reference before it is timed. Compilation runs first in ``--jobs`` worker
processes that share TileLang's disk cache, so the timing process only loads.
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
from harness.judging.shapes import bandwidth_rows
from harness.judging.cases import DTYPES
from impls import registry
from tools import _session
from impls.tilelang import compiler
from impls.tilelang.plan import choose_vec, make_plan, vectors_per_thread

OPS = {"fragment": "rms_norm", "layer_norm_fwd": "layer_norm"}
NS = (4000, 5120, 12288, 16384, 32768)
THREADS = (32, 64, 128, 256, 512, 1024)
MAX_VECTORS = 16  # per thread; more spills at any launch bound
REG_BUDGETS = (40, 64, 80)  # registers per thread a launch bound may aim ptxas at


def candidates(variant: str, dtype: str, n: int, rule_bound_only: bool = False):
    """Plans to try: each thread count that gives a thread 1..MAX_VECTORS vectors, each with
    the rule's launch bound (None) and the bound of each register budget. (No bound at all let
    ptxas take 46-80 registers and measured worst: reports/h200/tilelang-ln-probe.log.)"""
    vec = choose_vec(DTYPES[dtype], n)
    seen = set()
    for tpr in THREADS:
        base = make_plan(variant, dtype, n, True, variant == "layer_norm_fwd", vec, threads_per_row=tpr)
        if not 1 <= vectors_per_thread(base) <= MAX_VECTORS:
            continue
        bounds = [None] + ([] if rule_bound_only else
                           [max(1, min(2048 // base.threads, 65536 // (base.threads * r))) for r in REG_BUDGETS])
        for mb in bounds:
            plan = make_plan(variant, dtype, n, base.has_weight, base.has_bias, vec, threads_per_row=tpr, min_blocks=mb)
            if plan not in seen:
                seen.add(plan)
                yield plan


def entries(variants, dtypes, ns, rule_bound_only=False):
    return [p for v in variants for d in dtypes for n in ns for p in candidates(v, d, n, rule_bound_only)]


def reference(op: str, x, w, b, eps: float) -> torch.Tensor:
    x64 = x.double()
    if op == "layer_norm":
        return torch.nn.functional.layer_norm(x64, (x.shape[1],), w.double(), b.double(), eps)
    return x64 * torch.rsqrt(x64.pow(2).mean(1, keepdim=True) + eps) * w.double()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", default="layer_norm_fwd,fragment")
    p.add_argument("--dtypes", default="bfloat16,float16,float32")
    p.add_argument("--ns", default=",".join(map(str, NS)))
    p.add_argument("--ms", default="", help="row counts to time by graph replay (decode); default: bandwidth rows")
    p.add_argument("--rule-bound-only", action="store_true", help="no launch-bound candidates (decode)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--json")
    p.add_argument("--compile-part", help=argparse.SUPPRESS)  # "i/k": worker i of k
    args = p.parse_args(argv)
    plans = entries(args.variants.split(","), args.dtypes.split(","), [int(v) for v in args.ns.split(",")],
                    args.rule_bound_only)
    if args.compile_part:
        i, k = map(int, args.compile_part.split("/"))
        for plan in plans[i::k]:
            try:
                compiler.compile_plan(plan)
            except compiler.TileLangCompileError as exc:
                print(f"compile failed: {exc}", flush=True)
        return 0

    t0 = time.time()
    base = [sys.executable, "-m", "tools.tilelang_sweep", "--variants", args.variants, "--dtypes", args.dtypes, "--ns", args.ns]
    base += ["--rule-bound-only"] if args.rule_bound_only else []
    workers = [subprocess.Popen(base + ["--compile-part", f"{i}/{args.jobs}"]) for i in range(args.jobs)]
    failed = sum(w.wait() != 0 for w in workers)
    print(f"compiled {len(plans)} plans in {time.time() - t0:.0f} s on {args.jobs} processes"
          + (f", {failed} workers failed" if failed else ""), flush=True)

    tools, ceiling = _session.start()
    ms = [int(v) for v in args.ms.split(",")] if args.ms else [None]
    results, held = [], None
    for plan in plans:
        op = OPS[plan.variant]
        kernel = registry.get(op, "tilelang", plan.variant)
        dt = DTYPES[plan.dtype]
        for m_given in ms:
            m = m_given or bandwidth_rows(plan.n)
            if held is None or held[0] != (op, plan.dtype, plan.n, m):
                held = None
                x = torch.randn(m, plan.n, device="cuda", dtype=dt)
                w = torch.randn(plan.n, device="cuda", dtype=dt)
                b = torch.randn(plan.n, device="cuda", dtype=dt) if op == "layer_norm" else None
                ref = reference(op, x[:64], w, b, 1e-6)
                held = ((op, plan.dtype, plan.n, m), x, w, b, kernel.allocate(x), ref)
            _, x, w, b, out, ref = held
            try:
                compiler.compile_plan(plan)
            except compiler.TileLangCompileError as exc:
                print(f"{plan.describe()}: {exc}", flush=True)
                continue
            fn = lambda: kernel._run(plan, x, w, b, 1e-6, out, with_bias=op == "layer_norm")  # noqa: E731
            fn()
            torch.cuda.synchronize()
            err = (out.y[:64].double() - ref).abs().max().item()
            ok = err <= 8 * torch.finfo(dt).eps * max(1.0, ref.abs().max().item())
            nbytes = timing.bytes_moved(m, plan.n, dt, True, b is not None, len(kernel.outputs) - 1)
            if m_given:
                us = statistics.median(timing.GraphTimer(fn, tools, clock=timing.KernelClock()).run(20, 3)) * 1e6
            else:
                us = timing.gpu_time_ms(fn, tools, rounds=15, warmup=2) * 1e3
            gbps = nbytes / us / 1e3
            r = dict(variant=plan.variant, dtype=plan.dtype, n=plan.n, m=m, threads_per_row=plan.threads_per_row,
                     rows_per_block=plan.rows_per_block, vectors=vectors_per_thread(plan), min_blocks=plan.min_blocks,
                     us=us, gbps=gbps, pct=100 * gbps / ceiling, max_abs_err=err, correct=ok,
                     rule=plan == kernel.plan_for(dt, plan.n, True, b is not None, plan.vec, m_given))
            results.append(r)
            print(f"{plan.variant:<14} {plan.dtype:<8} {m:>6}x{plan.n:<6} tpr={plan.threads_per_row:<4} "
                  f"rows={plan.rows_per_block} vpt={r['vectors']:<2} min_blocks={plan.min_blocks!s:<4} "
                  f"{us:8.2f} us {gbps:6.0f} GB/s {r['pct']:5.1f}%" + ("" if ok else f"  WRONG (max err {err:.3g})")
                  + (" <- rule" if r["rule"] else ""), flush=True)
            if args.json and len(results) % 50 == 0:  # a run cut short still leaves its results
                _session.write_json(args.json, ceiling, results, tilelang=compiler.version())
    if args.json:
        _session.write_json(args.json, ceiling, results, tilelang=compiler.version())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
