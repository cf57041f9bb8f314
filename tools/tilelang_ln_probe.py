"""Probe of the TileLang LayerNorm candidates against layer_norm_fwd on a GPU: correctness
once, then cold-L2 bandwidth as % of the device copy, per (dtype, N, kernel).

    python tools/tilelang_ln_probe.py --json ln-probe.json            # GPU: check and time
    python tools/tilelang_ln_probe.py --compile-only [--ptxas]        # anywhere: compile (sm_90)

Kernels: layer_norm_fwd and impls.tilelang._programs.LN_CANDIDATES (ln_a, ln_b, ln_c), each
compiled through impls.tilelang._compile.compile_plan with the plan make_plan gives its name.
Shapes: dtype in (bfloat16, float16, float32), N in NS, M = max(16384, ceil(2**26 / N)),
contiguous rows, weight and bias present.

1. Compile phase: every (kernel, dtype, N) specialisation in parallel worker processes
   (spawn; the target is passed in, so the workers never touch CUDA). TileLang's disk cache
   (TILELANG_CACHE_DIR, default ~/.tilelang/cache) keeps the results; the timing process then
   loads them. ``--ptxas`` adds registers / shared memory / spills per kernel (needs nvcc).
2. Check phase (GPU): y, mean and rstd on a sample of rows against
   torch.nn.functional.layer_norm in float64, on normal rows, on large-mean rows
   (1e4 + noise, as harness.cases' "large_mean") and on constant rows; y within 2 ulps of its
   dtype (64 for float32) plus harness/compare.py's conditioning floor, mean and rstd within
   1e-4 relative (+ 32 float32 ulps x (1 + |mean| rstd)). A kernel that fails prints FAIL and
   is not timed. A row whose first element is a sqrt(N)-sigma spike is
   reported (spike0 column), never failed: it bounds ln_c's shift-by-x[row,0] error.
3. Time phase (GPU): harness.timing.gpu_time_ms (cold L2, events, median of 50) and % of
   harness.timing.copy_ceiling_gbps of the same run; bytes = harness.timing.bytes_moved(m, n,
   dtype, True, True, 2).

On the H200 (16 cores) the whole run takes about 1.5-2 minutes with an empty TileLang cache
(about 108 specialisations, ~3 s each, on 16 processes), well under a minute with a warm one.
"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
NS = (1024, 2048, 4000, 4096, 5120, 8192, 12288, 16384, 32768)
KERNELS = ("layer_norm_fwd", "ln_a", "ln_b", "ln_c")
EPS = 1e-5
SAMPLE_ROWS = 256  # rows of the big x checked against float64
CHECK_ROWS = 512  # rows of each special batch (large mean, constant, spike at column 0)


def rows_for(n: int) -> int:
    return max(16384, math.ceil(2**26 / n))


def plan_for(kernel: str, dtype: torch.dtype, n: int):
    from impls.tilelang._plan import choose_vec, make_plan

    # As TileLangKernel.prepare for contiguous x and y (row strides n, 16-byte aligned).
    return make_plan(kernel, dtype, n, True, True, choose_vec(dtype, n, (n, n)))


# -- compile phase (worker processes) ----------------------------------------------------------
def _compile_one(kernel: str, dtype_name: str, n: int, target: dict, ptxas: bool) -> dict:
    from impls.tilelang import _compile

    plan = plan_for(kernel, DTYPES[dtype_name], n)
    out = {"kernel": kernel, "dtype": dtype_name, "n": n, "plan": plan.describe(), "threads": plan.threads,
           "threads_per_row": plan.threads_per_row, "rows_per_block": plan.rows_per_block}
    t0 = time.perf_counter()
    try:
        compiled = _compile.compile_plan(plan, target)
        src = compiled.source()
        lb = src.split("__launch_bounds__(", 1)[1].split(")", 1)[0] if "__launch_bounds__(" in src else ""
        out.update(ok=True, launch_bounds=lb, barriers=_barriers(src))
        if ptxas:
            out["ptxas"] = _compile.ptxas_report(compiled).to_dict()
    except Exception as exc:  # noqa: BLE001 (reported per specialisation)
        out.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:600])
    out["compile_s"] = round(time.perf_counter() - t0, 2)
    return out


def _barriers(src: str) -> dict:
    """AllReduce calls, their shared-memory levels (offsets >= 32 of the reducing width) and
    explicit __syncthreads in the generated CUDA."""
    import re

    levels = 0
    calls = re.findall(r"tl::AllReduce<[^,]+, (\d+), (\d+),", src)
    for threads, scale in calls:
        width = int(threads)
        while width > int(scale):
            if width // 2 >= 32:
                levels += 1
            width //= 2
    return {"allreduce": len(calls), "smem_levels": levels, "syncthreads": src.count("__syncthreads()")}


def compile_all(specs, target: dict, jobs: int, ptxas: bool) -> list[dict]:
    results = []
    if jobs <= 1:
        return [_compile_one(k, d, n, target, ptxas) for k, d, n in specs]
    # spawn: a CUDA-initialised parent cannot fork safely; the workers only compile.
    with ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as pool:
        futures = [pool.submit(_compile_one, k, d, n, target, ptxas) for k, d, n in specs]
        for fut in as_completed(futures):
            results.append(fut.result())
    order = {spec: i for i, spec in enumerate(specs)}
    return sorted(results, key=lambda r: order[(r["kernel"], r["dtype"], r["n"])])


def blocks_per_sm(registers: int, threads: int) -> int:
    """Resident blocks per SM on sm_90 by registers (allocated per warp in units of 256) and
    threads (2048); shared memory (a few KB here) does not bind."""
    per_warp = -(-registers * 32 // 256) * 256
    warps = -(-threads // 32)
    return max(0, min(65536 // (per_warp * warps), 2048 // threads, 32))


def print_resources(results: list[dict]) -> None:
    print(f"{'dtype':9s} {'N':>6s} {'kernel':15s} {'thr':>4s} {'tpr':>4s} {'R':>2s} {'bounds':>8s} "
          f"{'regs':>4s} {'smem':>5s} {'spill':>9s} {'blk/SM':>6s} {'KB x/SM':>7s} {'smemlvl':>7s}")
    for r in results:
        if not r.get("ok"):
            print(f"{r['dtype']:9s} {r['n']:6d} {r['kernel']:15s} COMPILE FAIL {r.get('error', '')[:200]}")
            continue
        p = r.get("ptxas")
        regs = p["registers"] if p else None
        blocks = blocks_per_sm(regs, r["threads"]) if regs else None
        kb = blocks * r["rows_per_block"] * r["n"] * DTYPES[r["dtype"]].itemsize / 1024 if blocks else None
        smem = (p["smem_static"] + (p["smem_dynamic"] or 0)) if p else None
        spill = f"{p['spill_stores']}/{p['spill_loads']}" if p else "-"
        b = r["barriers"]
        print(f"{r['dtype']:9s} {r['n']:6d} {r['kernel']:15s} {r['threads']:4d} {r['threads_per_row']:4d} "
              f"{r['rows_per_block']:2d} {r['launch_bounds']:>8s} {regs if regs else '-':>4} "
              f"{smem if smem is not None else '-':>5} {spill:>9s} {blocks if blocks else '-':>6} "
              f"{f'{kb:.0f}' if kb else '-':>7} {b['smem_levels']:>3d}x{b['allreduce']}", flush=True)


# -- check and time phase (one process, GPU) -----------------------------------------------------
def _flat(t: torch.Tensor) -> torch.Tensor:
    m, n = t.shape
    return t.as_strided(((m - 1) * t.stride(0) + n,), (1,))


def make_call(compiled, x, w, b, y, mean, rstd):
    """The launch impls.tilelang._kernel.TileLangKernel._run makes for layer_norm_fwd."""
    vec = compiled.plan.vec
    m = x.shape[0]
    sxv = x.stride(0) // vec if m > 1 else 0
    syv = y.stride(0) // vec if m > 1 else 0
    args = (_flat(x), w, b, _flat(y), mean, rstd, sxv, syv, float(EPS))
    kernel = compiled.kernel
    return lambda: kernel(*args)


def _reference(x: torch.Tensor, w, b):
    xd = x.double()
    ref = torch.nn.functional.layer_norm(xd, (x.shape[1],), w.double(), b.double(), EPS)
    mean = xd.mean(dim=1)
    var = xd.var(dim=1, unbiased=False)
    return ref, mean, torch.rsqrt(var + EPS)


MANTISSA = {torch.float32: 23, torch.float16: 10, torch.bfloat16: 7}
# y: ulps of x's dtype plus a floor times the row's conditioning (harness/compare.py's policy:
# an error d in a float32 mean moves y by d * rstd, so the floor scales with 1 + |mean| * rstd).
Y_ULPS = {torch.float32: 64, torch.float16: 2, torch.bfloat16: 2}
Y_FLOOR = {torch.float32: 2e-6, torch.float16: 1e-4, torch.bfloat16: 1e-3}
STAT_REL = 1e-4  # mean (relative to |mean| + std) and rstd (relative), plus 32 float32 ulps * cond
U32 = 2.0**-24


def _ulp(ref: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    mag = ref.abs().clamp(min=torch.finfo(dtype).tiny)
    return torch.exp2(torch.floor(torch.log2(mag)) - MANTISSA[dtype])


def _worst(err: torch.Tensor, allowed: torch.Tensor) -> float:
    ratio = (err / allowed).nan_to_num(nan=float("inf"))  # NaN where the reference is finite: fail
    return float(ratio.max())


def compare(x, y, mean, rstd, w, b) -> dict:
    """Worst |error| / allowed of y, mean and rstd against float64 (> 1 fails)."""
    ref, rmean, rrstd = _reference(x, w, b)
    cond = 1.0 + rmean.abs() * rrstd
    scale = float(w.double().abs().max()) * cond.unsqueeze(1)
    y_allowed = Y_ULPS[x.dtype] * _ulp(ref, x.dtype) + Y_FLOOR[x.dtype] * scale
    mean_allowed = STAT_REL * (rmean.abs() + 1.0 / rrstd) + 32 * U32 * rmean.abs() * cond
    rstd_allowed = (STAT_REL + 32 * U32 * cond) * rrstd
    return {"y": _worst((y.double() - ref).abs(), y_allowed),
            "mean": _worst((mean.double() - rmean).abs(), mean_allowed),
            "rstd": _worst((rstd.double() - rrstd).abs(), rstd_allowed)}


def passes(err: dict) -> bool:
    return max(err.values()) <= 1.0


def special_batches(n: int, dtype: torch.dtype, gen: torch.Generator) -> dict[str, torch.Tensor]:
    finfo = torch.finfo(dtype)
    shape = (CHECK_ROWS, n)
    normal = torch.randn(shape, generator=gen, dtype=torch.float64, device="cuda")
    large = 1e4 + normal * max(1.0, 1e4 * finfo.eps)  # harness.cases "large_mean"
    const = torch.randn((CHECK_ROWS, 1), generator=gen, dtype=torch.float64, device="cuda").expand(shape) * 2
    spike = normal.clone()
    spike[:, 0] = math.sqrt(n) * 4.0
    return {"large_mean": large.to(dtype), "constant": const.contiguous().to(dtype), "spike0": spike.to(dtype)}


def run_kernel_on(compiled, x, w, b):
    y = torch.empty_like(x)
    mean = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
    rstd = torch.empty_like(mean)
    make_call(compiled, x, w, b, y, mean, rstd)()
    torch.cuda.synchronize()
    return y, mean, rstd


def time_all(args, specs, compiled_ok: set) -> list[dict]:
    from harness import timing
    from impls.tilelang import _compile

    tools = timing.GpuTools()
    ceiling, how = timing.copy_ceiling_gbps("cuda", tools)
    print(f"{time.strftime('%Y-%m-%d %H:%M')} {torch.cuda.get_device_name()} copy ceiling {ceiling:.0f} GB/s ({how})",
          flush=True)
    results = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    shapes = sorted({(d, n) for _, d, n in specs}, key=lambda s: (list(DTYPES).index(s[0]), s[1]))
    for dtype_name, n in shapes:
        dtype = DTYPES[dtype_name]
        m = rows_for(n)
        x = torch.randn((m, n), generator=gen, device="cuda", dtype=torch.float32).to(dtype)
        w = (1.0 + 0.5 * torch.randn(n, generator=gen, device="cuda")).to(dtype)
        b = (0.5 * torch.randn(n, generator=gen, device="cuda")).to(dtype)
        y = torch.empty_like(x)
        mean = torch.empty(m, dtype=torch.float32, device="cuda")
        rstd = torch.empty_like(mean)
        sample = torch.unique(torch.cat([torch.linspace(0, m - 1, SAMPLE_ROWS, device="cuda").long(),
                                         torch.tensor([m - 1], device="cuda")]))
        batches = special_batches(n, dtype, gen)
        nbytes = timing.bytes_moved(m, n, dtype, True, True, 2)
        for kernel in args.kernels:
            rec = {"dtype": dtype_name, "n": n, "m": m, "kernel": kernel}
            if (kernel, dtype_name, n) not in compiled_ok:
                rec["status"] = "COMPILE FAIL"
                print(f"{dtype_name:9s} N={n:6d} M={m:6d} {kernel:15s} COMPILE FAIL", flush=True)
                results.append(rec)
                continue
            compiled = _compile.compile_plan(plan_for(kernel, dtype, n))
            rec["plan"] = compiled.plan.describe()
            fn = make_call(compiled, x, w, b, y, mean, rstd)
            fn()
            torch.cuda.synchronize()
            errs = {"normal": compare(x[sample], y[sample], mean[sample], rstd[sample], w, b)}
            for name, xb in batches.items():
                errs[name] = compare(xb, *run_kernel_on(compiled, xb, w, b), w, b)
            rec["errors"] = errs
            failed = [k for k, e in errs.items() if k != "spike0" and not passes(e)]
            spike = errs["spike0"]
            note = f"spike0 worst/allowed y {spike['y']:.2f} mean {spike['mean']:.2f} rstd {spike['rstd']:.2f}"
            if failed:
                rec["status"] = "FAIL"
                detail = "; ".join(f"{k}: worst/allowed y {errs[k]['y']:.2f} mean {errs[k]['mean']:.2f} "
                                   f"rstd {errs[k]['rstd']:.2f}" for k in failed)
                print(f"{dtype_name:9s} N={n:6d} M={m:6d} {kernel:15s} FAIL ({detail}) not timed", flush=True)
                results.append(rec)
                continue
            ms = timing.gpu_time_ms(fn, tools, rounds=args.rounds)
            gbps = nbytes / (ms * 1e-3) / 1e9
            rec.update(status="ok", ms=ms, gbps=gbps, pct_copy=100 * gbps / ceiling)
            worst = max(max(e.values()) for k, e in errs.items() if k != "spike0")
            print(f"{dtype_name:9s} N={n:6d} M={m:6d} {kernel:15s} {ms * 1e3:8.1f} us {gbps:7.0f} GB/s "
                  f"{rec['pct_copy']:5.1f}% of copy  (check ok, worst {worst:.2f} of allowed; {note})", flush=True)
            results.append(rec)
        del x, y, mean, rstd, batches
        torch.cuda.empty_cache()
    return results, ceiling


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", help="write the results here")
    p.add_argument("--dtypes", default=",".join(DTYPES))
    p.add_argument("--ns", default=",".join(map(str, NS)))
    p.add_argument("--kernels", default=",".join(KERNELS))
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--compile-only", action="store_true", help="compile (sm_90 without a GPU) and stop")
    p.add_argument("--ptxas", action="store_true", help="print registers, shared memory and spills (nvcc)")
    args = p.parse_args(argv)
    args.kernels = tuple(args.kernels.split(","))
    from impls.tilelang._compile import default_target
    from impls.tilelang._plan import LN_VARIANTS

    unknown = [k for k in args.kernels if k not in LN_VARIANTS]
    if unknown:
        p.error(f"unknown kernels {unknown}; known: {LN_VARIANTS}")
    specs = [(k, d, int(n)) for d in args.dtypes.split(",") for n in args.ns.split(",") for k in args.kernels]
    on_gpu = torch.cuda.is_available()
    target = default_target()
    t0 = time.perf_counter()
    print(f"compiling {len(specs)} specialisations for {target['arch']} on {args.jobs} processes", flush=True)
    built = compile_all(specs, target, args.jobs, args.ptxas)
    failed = [r for r in built if not r["ok"]]
    print(f"compiled in {time.perf_counter() - t0:.0f} s; {len(failed)} failed", flush=True)
    for r in failed:
        print(f"  COMPILE FAIL {r['kernel']} {r['dtype']} N={r['n']}: {r['error'][:300]}")
    if args.ptxas or args.compile_only:
        print_resources(built)
    out = {"target": target, "compile": built}
    if not args.compile_only:
        if not on_gpu:
            print("no CUDA device: compile phase only (use --compile-only here)", file=sys.stderr)
            return 2
        ok = {(r["kernel"], r["dtype"], r["n"]) for r in built if r["ok"]}
        results, ceiling = time_all(args, specs, ok)
        out.update(device=torch.cuda.get_device_name(), copy_gbps=ceiling, results=results)
        print_summary(results, args.kernels)
    print(f"total {time.perf_counter() - t0:.0f} s", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 1 if failed else 0


def print_summary(results: list[dict], kernels) -> None:
    print("\n% of copy (FAIL: wrong, not timed)")
    print(f"{'dtype':9s} {'N':>6s} " + " ".join(f"{k:>15s}" for k in kernels))
    rows: dict = {}
    for r in results:
        v = f"{r['pct_copy']:.1f}" if r.get("status") == "ok" else r.get("status", "?")
        rows.setdefault((r["dtype"], r["n"]), {})[r["kernel"]] = v
    for (d, n), vals in rows.items():
        print(f"{d:9s} {n:6d} " + " ".join(f"{vals.get(k, '-'):>15s}" for k in kernels))


if __name__ == "__main__":
    raise SystemExit(main())
