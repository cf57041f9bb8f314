"""Times TileLang backward plans against the copy ceiling of the same process, on a GPU.

    python -m tools.tilelang_bwd_probe --json bwd.json [--ops rms_norm,layer_norm] [--shapes 65536x1024,...]

For each op and shape (bfloat16, weight, and bias for LayerNorm) it runs the kernel's forward for
its saved statistics, then each plan of CANDIDATES (``impls.tilelang.backward.backward_plan``
overrides; "rule" is the plan the kernel runs), the whole backward as a user calls it (kernel,
partial sums, rounding into dw/db), checked against the float64 oracle (max |error| over max
|reference| of dx, dw, db) and timed as the benchmarks time (``harness.benchmarks.timing.gpu_time_ms``, cold
L2). Bytes are the backward's fewest (``timing.bytes_moved_backward``). Compilation runs first in
``--jobs`` worker processes sharing TileLang's disk cache.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import torch

from impls.base import NormGrads, NormSpec
from impls.tilelang import compiler
from impls.tilelang.backward import backward_plan, run_backward_plan
from impls.tilelang.plan import choose_vec

SHAPES = ((65536, 1024), (32768, 2048), (16384, 4096), (16384, 8192))
VARIANT = {"rms_norm": "fragment", "layer_norm": "layer_norm_fwd"}
# name -> backward_plan overrides; "v1-like" is the first plan's shape: 2 vectors per thread, 32
# rows per block, no prefetch, no launch bound (the first program itself was timed against these:
# docs/perf-notes.md, item 36).
CANDIDATES = {
    "rule": {},
    "v1-like": dict(vectors=2, block_m=32, prefetch=False, min_blocks=1),
    "fixed32": dict(block_m=32),
    "noprefetch-48": dict(prefetch=False, regs=48),
    "prefetch-48": dict(regs=48),
    "prefetch-56": dict(regs=56),
    "2vec-nobound": dict(vectors=2, min_blocks=1),  # 512 threads at 8192; ptxas takes ~116 registers
}


def plan_of(op: str, n: int, name: str):
    kw = dict(CANDIDATES[name])
    regs = kw.pop("regs", None)
    dt = torch.bfloat16
    plan = backward_plan(op, dt, n, True, choose_vec(dt, n), has_bias=op == "layer_norm", **kw)
    if regs:  # a launch bound aiming ptxas at this many registers
        mb = max(1, min(2048 // plan.threads, 65536 // (plan.threads * regs)))
        plan = backward_plan(op, dt, n, True, choose_vec(dt, n), has_bias=op == "layer_norm", min_blocks=mb, **kw)
    return plan


def all_plans(ops, shapes):
    return [(op, m, n, name, plan_of(op, n, name)) for op in ops for m, n in shapes for name in CANDIDATES]


def compiled_of(name: str, plan):
    return compiler.compile_plan(plan)


def runner(name: str, plan, x, w, dy, saved, out):
    return lambda: run_backward_plan(plan, x, w, dy, saved, out)


def oracle(op, x, w, b, dy, eps):
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    b64 = b.double().requires_grad_() if b is not None else None
    if op == "layer_norm":
        y = torch.nn.functional.layer_norm(x64, (x.shape[1],), w64, b64, eps)
    else:
        y = x64 * torch.rsqrt(x64.pow(2).mean(1, keepdim=True) + eps) * w64
    y.backward(dy.double())
    return x64.grad, w64.grad, (b64.grad if b64 is not None else None)


def rel_err(got, ref):
    return ((got.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def compile_part(part: str, ops: list, shapes: list, unique: list) -> None:
    """A worker's share ("i/k") of the compilation: the forward each shape runs first and the
    plans, into TileLang's disk cache and the ptxas reports' cache for the timing process."""
    from impls import registry

    i, k = map(int, part.split("/"))
    registry.load_builtins()
    forward = [(op, m, n) for op in ops for m, n in shapes]
    for item in (forward + unique)[i::k]:
        try:
            if len(item) == 3:
                op, m, n = item
                registry.get(op, "tilelang", VARIANT[op]).prepare(NormSpec(
                    op=op, dtype=torch.bfloat16, rows=m, n=n, row_stride=n, device="cuda",
                    has_weight=True, has_bias=op == "layer_norm"))
            else:
                compiler.ptxas_report(compiled_of(*item))
        except compiler.TileLangCompileError as exc:
            print(f"compile failed: {exc}", flush=True)


def compile_all(args, unique: list) -> None:
    """The compilation first, in ``--jobs`` worker processes (compile_part)."""
    t0 = time.time()
    base = [sys.executable, "-m", "tools.tilelang_bwd_probe", "--ops", args.ops, "--shapes", args.shapes]
    jobs = max(1, min(args.jobs, len(unique)))
    workers = [subprocess.Popen(base + ["--compile-part", f"{i}/{jobs}"]) for i in range(jobs)]
    failed = sum(w.wait() != 0 for w in workers)
    print(f"compiled {len(unique)} plans in {time.time() - t0:.0f} s on {jobs} processes"
          + (f", {failed} workers failed" if failed else ""), flush=True)


def probe_shape(op: str, m: int, n: int, plans: list, tools, ceiling: float, rounds: int) -> list[dict]:
    """Every plan of one shape: run once into gradients poisoned with NaN, checked against the
    float64 oracle, then timed; the results."""
    from harness.benchmarks import timing
    from impls import registry

    kernel, eps, dt = registry.get(op, "tilelang", VARIANT[op]), 1e-6, torch.bfloat16
    torch.manual_seed(0)
    x = torch.randn(m, n, device="cuda", dtype=dt)
    dy = torch.randn(m, n, device="cuda", dtype=dt)
    w = torch.randn(n, device="cuda", dtype=dt)
    b = torch.randn(n, device="cuda", dtype=dt) if op == "layer_norm" else None
    saved = kernel(x, w, b, eps)
    rdx, rdw, rdb = oracle(op, x, w, b, dy, eps)
    out = NormGrads(dx=torch.empty_like(x), dw=torch.empty_like(w), db=None if b is None else torch.empty_like(b))
    nbytes = timing.bytes_moved_backward(m, n, dt, True, b is not None, 2 if op == "layer_norm" else 1)
    results = []
    for o, mm, nn, name, plan in plans:
        if (o, mm, nn) != (op, m, n):
            continue
        for t in out.fields().values():  # poisoned: a gradient left unwritten fails the check
            t.fill_(float("nan"))
        try:
            fn = runner(name, plan, x, w, dy, saved, out)
            fn()
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 (a candidate that fails is reported, not fatal)
            print(f"{op} {m}x{n} {name}: FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            continue
        errs = dict(dx=rel_err(out.dx, rdx), dw=rel_err(out.dw, rdw))
        if b is not None:
            errs["db"] = rel_err(out.db, rdb)
        ok = all(e < 2e-2 for e in errs.values())  # nan compares False: not ok
        us = timing.gpu_time_ms(fn, tools, rounds=rounds, warmup=2) * 1e3
        pct = 100 * nbytes / us / 1e3 / ceiling
        r = dict(op=op, m=m, n=n, candidate=name, plan=plan.describe(), threads=plan.threads,
                 min_blocks=plan.min_blocks, block_m=getattr(plan, "block_m", 32),
                 prefetch=getattr(plan, "prefetch", False), us=us, pct=pct, errors=errs, correct=ok)
        try:
            rep = compiler.ptxas_report(compiled_of(name, plan))
            r.update(registers=rep.registers, spill_stores=rep.spill_stores)
        except Exception:  # noqa: BLE001 (ptxas report only informative)
            pass
        results.append(r)
        print(f"{op:<10} {m:>6}x{n:<5} {name:<14} thr={plan.threads:<4} mb={plan.min_blocks!s:<4} "
              f"regs={r.get('registers')!s:<4} {us:8.1f} us {pct:5.1f}% of copy  "
              + " ".join(f"{k}={v:.1e}" for k, v in errs.items()) + ("" if ok else "  WRONG"), flush=True)
    torch.cuda.empty_cache()
    return results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", default="rms_norm,layer_norm")
    p.add_argument("--shapes", default=",".join(f"{m}x{n}" for m, n in SHAPES))
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--json")
    p.add_argument("--compile-part", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    ops = args.ops.split(",")
    shapes = [tuple(map(int, s.split("x"))) for s in args.shapes.split(",")]
    plans = all_plans(ops, shapes)
    unique = list(dict.fromkeys((name, pl) for *_, name, pl in plans))
    if args.compile_part:
        compile_part(args.compile_part, ops, shapes, unique)
        return 0
    compile_all(args, unique)

    from tools import _session

    tools, ceiling = _session.start()
    results = []
    for op in ops:
        for m, n in shapes:
            results += probe_shape(op, m, n, plans, tools, ceiling, args.rounds)
            if args.json:  # after each shape: a run cut short still leaves its results
                _session.write_json(args.json, ceiling, results, tilelang=compiler.version())
    if args.json:
        _session.write_json(args.json, ceiling, results, tilelang=compiler.version())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
