"""Long rows on the GPU: the candidate kernels at N = 65536, 131072, 262144, each as % of a copy
timed in the same process (harness.benchmarks.timing, as harness.measure times), with a float64 check of
sampled rows, a repeat compared bit for bit and the first rows run alone (batch invariance).

    python -m tools.long_row_probe --out "$OUT" [--ops rms_norm,layer_norm] [--dtype bfloat16]

Candidates run in tiers (the new kernels first, then the baselines and alternative launch
settings), each N's one after another. With --jobs, the TileLang plans and Triton candidates are
compiled first in parallel; with --again each N's candidates are timed once more in reverse
order (the mean of the two readings cancels a drift over the group). No candidate starts after
--budget seconds, which are shared out over the tiers' N by their number of candidates, so a
short budget drops the last candidates of each N rather than whole N. M: x of about 1 GiB
(--bench-rows: the benchmark's M, harness.judging.shapes.bandwidth_rows, 2^31 elements and more at
N >= 131072). Writes long_rows.json and long_rows.txt under --out. The candidates, their labels
and tiers: tools/long_row_candidates.py.
"""
from __future__ import annotations

import argparse
import json
import re
import time
import traceback
from pathlib import Path

import torch

from harness.benchmarks import timing
from harness.judging.cases import DTYPES, Case
from harness.judging.inputs import make_inputs
from harness.judging.shapes import bandwidth_rows
from impls import registry
from impls.base import UnsupportedCase, dtype_name, spec_of
from tools.long_row_candidates import affine_of, candidates

SAMPLE_ROWS = 8  # rows checked against float64 (the first ones; the last row too)


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
        from impls.tilelang import compiler
        from impls.tilelang.candidates import register_programs

        register_programs()  # a worker process: the candidates' programs among the builders
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


def parse_args(argv=None) -> argparse.Namespace:
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
    return p.parse_args(argv)


def prewarm_tasks(args, ops: list, ns: list, inputs_for) -> tuple[list, list]:
    """The TileLang plans (compile keys) and Triton tasks (op, label, N, dtype) of the chosen
    candidates, for prewarm."""
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
    return sorted(plans, key=repr), triton_tasks


def run_candidate(op: str, label: str, make, d, tools, ceiling: float) -> tuple[dict, object, int]:
    """One candidate on the case's rows: compiled, checked (check) and timed as % of the copy;
    its row of the results, the kernel and the bytes it moved (None, 0 where it did not run)."""
    x, eps = d.x, d.eps
    m, n = x.shape
    r = {"op": op, "n": n, "m": m, "kernel": label}
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
        nbytes = timing.bytes_moved(m, n, x.dtype, w is not None, b is not None,
                                    len({"mean", "rstd"} & set(kernel.outputs)))
        r.update(ms=ms, gbps=nbytes / ms / 1e6, pct_of_copy=100 * nbytes / ms / 1e6 / ceiling)
        r.update(check(op, kernel, x, w, b, eps, o))
        return r, kernel, nbytes
    except UnsupportedCase as exc:
        r["skipped"] = str(exc)
    except Exception as exc:  # noqa: BLE001 (one candidate's failure is a result)
        r["error"] = f"{type(exc).__name__}: {exc}"[:800]
        r["traceback"] = traceback.format_exc()[-3000:]
        torch.cuda.synchronize()
    return r, None, 0


def result_line(r: dict) -> str:
    head = f"{r['op']:10s} {r['m']}x{r['n']:<7d} {r['kernel']:42s} "
    if "pct_of_copy" not in r:
        return head + (r.get("skipped") or r.get("error", ""))[:300]
    return (head + f"{r['pct_of_copy']:6.1f}%  {r['ms']:.3f} ms  err {r['y_max_abs_err']:.2e} ok={r['ok']} "
            f"repeat={r['repeat_bitwise']} alone={r['alone_bitwise']}  compile {r['compile_s']}s"
            + ("" if r["ok"] else f"  bad rows {r['bad_rows']}"))


def time_again(timed: list, d, tools, ceiling: float, lines: list) -> None:
    """Each candidate of a group timed again in reverse order: a drift over the group cancels in
    the mean of the two readings."""
    for label, kernel, r, nbytes in reversed(timed):
        w, b = affine_of(label, d)
        ms = timing.gpu_time_ms(kernel.bench_callable(d.x, w, b, d.eps, kernel(d.x, w, b, d.eps)), tools)
        again = 100 * nbytes / ms / 1e6 / ceiling
        r.update(pct_of_copy_again=again, pct_of_copy_mean=(r["pct_of_copy"] + again) / 2)
        line = (f"{r['op']:10s} {r['m']}x{r['n']:<7d} {label:42s} {again:6.1f}% again, mean "
                f"{r['pct_of_copy_mean']:.1f}% (first {r['pct_of_copy']:.1f}%)")
        print(line, flush=True)
        lines.append(line)


def main(argv=None) -> int:
    args = parse_args(argv)
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
        plans, triton_tasks = prewarm_tasks(args, ops, ns, inputs_for)
        prewarm(plans, args.jobs, triton_tasks)

    # Each N's candidates of a tier run one after another (compared under the same clocks). The
    # budget left after the prewarm is shared out over these groups by their number of runs
    # (cumulative: what one group leaves, the next may use), so where it runs short each group
    # loses its last candidates, not the last groups (the longest rows) all of theirs.
    groups = [(op, n, [c for c in candidates(op) if c[0] == tier and re.search(args.only, c[1])])
              for tier in range(1, args.tiers + 1) for op in ops for n in ns]
    total = sum(len(g[2]) for g in groups) or 1
    t_timing = time.perf_counter()
    left = max(args.budget - (t_timing - t0), 0.0)
    runs_before = 0
    for op, n, chosen in groups:
        runs_before += len(chosen)
        deadline = left * runs_before / total
        d = inputs_for(op, n) if chosen else None
        timed = []  # (label, kernel, row, bytes moved) of the group's candidates that ran, for --again
        for _, label, make in chosen:
            if time.perf_counter() - t_timing > deadline:
                r = {"op": op, "n": n, "m": d.x.shape[0], "kernel": label, "skipped": "budget"}
            else:
                r, kernel, nbytes = run_candidate(op, label, make, d, tools, ceiling)
                if kernel is not None:
                    timed.append((label, kernel, r, nbytes))
            rows.append(r)
            lines.append(result_line(r))
            print(lines[-1], flush=True)
            save()
        if args.again and chosen:
            time_again(timed, d, tools, ceiling, lines)
            save()
    lines.append(f"total {time.perf_counter() - t0:.0f} s")
    save()
    print(lines[-1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
