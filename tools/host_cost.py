"""Where a call's host time goes (GPU): host µs per call of each kernel's user call on the native
path (impls.native), on the Python fast path and validated every time, a native call by its parts
(native_breakdown), a cProfile of the
project's entry points, and TileLang's execution backends.

    python -m tools.host_cost --backend-file examples/liger_backend.py --json OUT/host_cost.json

Host µs per call is timed as the benchmark's host column (harness.benchmarks.timing.host_call_us: back-to-back
calls, the GPU held busy). The profile runs ``--profile-calls`` calls of each entry point under
cProfile and prints the functions with the most time of their own (docs/perf-notes.md quotes it).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time

import torch

from harness.benchmarks import timing
from impls import callpath, fastpath, native, registry
from tools import _session

# The benchmark's decode shapes and its N = 1024, 2048 and 4096 bandwidth shapes.
SHAPES = ((1, 4096), (8, 4096), (64, 4096), (65536, 1024), (32768, 1024), (32768, 2048), (16384, 4096))
KERNELS = ("triton.auto", "triton.invariant", "tilelang.fragment", "tilelang.naive_row_per_block", "tilelang.splitk",
           "tilelang.layer_norm_fwd", "torch.eager", "liger.fused", "apex.fused", "torch_compile.inductor")


def _inputs(op, m, n, dtype):
    x = torch.randn(m, n, device="cuda", dtype=dtype)
    w = torch.randn(n, device="cuda", dtype=dtype)
    b = torch.randn(n, device="cuda", dtype=dtype) if op == "layer_norm" else None
    return x, w, b


def host_us(call, tools) -> float:
    return statistics.median(timing.host_call_us(call, tools) for _ in range(5))


def stalls(call, tools, calls: int = 300) -> dict:
    """Each call of a host measurement timed alone (the GPU held busy as host_call_us holds it),
    and the caching allocator's device allocations and frees over them: a mean far above the
    median means some calls wait (a synchronising free, a launch queue that fills)."""
    call()
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()
    tools.sleep(200_000)
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    after = torch.cuda.memory_stats()
    times.sort()
    delta = {key: after.get(key, 0) - before.get(key, 0)
             for key in ("num_device_alloc", "num_device_free", "num_alloc_retries", "num_sync_all_streams")}
    return {"median_us": round(times[len(times) // 2], 2), "mean_us": round(statistics.fmean(times), 2),
            "max_us": round(times[-1], 1), "calls_over_100us": sum(t > 100 for t in times), **delta}


def profile(call, calls: int, top: int) -> str:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        call()
    prof.disable()
    torch.cuda.synchronize()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def tilelang_backends(tools, dtype) -> list[dict]:
    """Host µs of one compiled TileLang kernel called directly, per execution backend."""
    from impls.tilelang import _programs, compiler
    from impls.tilelang.plan import choose_vec, make_plan

    rows = []
    m, n = 1, 4096
    plan = make_plan("fragment", dtype, n, True, False, choose_vec(dtype, n), m=m)
    x, w, _ = _inputs("rms_norm", m, n, dtype)
    y, rstd = torch.empty_like(x), torch.empty(m, device="cuda")
    for backend in ("tvm_ffi", "cython", "nvrtc", "ctypes"):
        try:
            kernel = compiler.compile_program(_programs.BUILDERS["fragment"](plan), plan, execution_backend=backend)
            args = (x.view(-1), w, y.view(-1), rstd, 0, 0, 1e-6)
            kernel(*args)
            torch.cuda.synchronize()
            rows.append({"execution_backend": backend, "host_us": host_us(lambda: kernel(*args), tools)})
            direct = compiler.direct_call(kernel)
            if direct is not kernel:  # what the fast path calls: the executable, no adapter Python
                rows.append({"execution_backend": f"{backend}, executable called directly",
                             "host_us": host_us(lambda: direct(*args), tools)})
        except Exception as exc:  # noqa: BLE001 (an adapter this install lacks: say which and why)
            rows.append({"execution_backend": backend, "error": f"{type(exc).__name__}: {exc}"[:200]})
        print(rows[-1], flush=True)
    return rows


def native_breakdown(tools, dtype) -> list[dict]:
    """Where a native call's host µs go, by parts timed alone the same way (host_call_us), at the
    decode and the N = 1024 shape: the entry point; its kernel's native table called directly
    (no Python entry frame); the table on a signature it has not recorded (the pybind11 call, the
    key and the lookup); the outputs' allocations alone; torch's current-stream query; eager."""
    import impls.triton as api
    from impls.base import DEFAULT_EPS

    rows = []
    for op in ("rms_norm", "layer_norm"):
        for m, n in ((1, 4096), (65536, 1024)):
            x, w, b = _inputs(op, m, n, dtype)
            eps = DEFAULT_EPS[op]
            entry = (lambda: api.rms_norm(x, w, eps)) if op == "rms_norm" else (lambda: api.layer_norm(x, w, b, eps))
            for _ in range(3):
                entry()
            torch.cuda.synchronize()
            k = api.dispatch._ENTRY[(op, False)]
            table = callpath.native_table(k)
            if table is None:
                rows.append({"op": op, "m": m, "n": n, "error": f"no native table: {native.refusals().get(k.name, native.status())}"})
                print(rows[-1], flush=True)
                continue
            other = torch.randn(m, n + 8, device="cuda", dtype=dtype)  # a signature the table lacks
            stats = sum(name in k.outputs for name in ("mean", "rstd"))
            lead = x.shape[:-1]

            def allocs():
                torch.empty_like(x)
                for _ in range(stats):
                    torch.empty(lead, dtype=torch.float32, device="cuda")

            eager = registry.get(op, "torch", "eager").user_call(x, w, b, eps)[1]
            parts = {"entry point": entry, "native table called directly": lambda: table(x, w, b, eps),
                     "table, unrecorded signature (returns None)": lambda: table(other, w, b, eps),
                     f"allocations alone (y{' + %d statistics' % stats if stats else ''})": allocs,
                     "torch._C._cuda_getCurrentRawStream": lambda: torch._C._cuda_getCurrentRawStream(0),
                     "eager torch": eager}
            figures = timing.paired_host_us(parts, tools)
            rows.append({"op": op, "m": m, "n": n, "kernel": k.name, **figures})
            print(rows[-1], flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend-file", action="append", default=[])
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--profile-calls", type=int, default=2000)
    ap.add_argument("--top", type=int, default=14)
    ap.add_argument("--json", default="host_cost.json")
    args = ap.parse_args()
    registry.load_all(args.backend_file)
    tools, ceiling = _session.start()
    print("native path:", "ready" if native.wait(300) is not None else native.status(), flush=True)
    dtype = getattr(torch, args.dtype)
    results, profiles = [], {}
    for op in ("rms_norm", "layer_norm"):
        for m, n in SHAPES:
            x, w, b = _inputs(op, m, n, dtype)
            for name in KERNELS:
                backend, variant = name.split(".")
                try:
                    k = registry.get(op, backend, variant)
                except KeyError:
                    continue
                if k.unavailable() or k.unsupported(k_spec(k, x, w, b)):
                    continue
                what, call = k.user_call(x, w, b, 1e-5)
                for _ in range(3):  # validated, Python fast path (records), native
                    call()
                torch.cuda.synchronize()
                row = {"op": op, "m": m, "n": n, "kernel": name, "call": what, "host_us": host_us(call, tools),
                       "stalls": stalls(call, tools)}
                if k.project:
                    replayed = callpath.state(k)["native"]
                    row["path"] = "native" if replayed else f"python: {native.refusals().get(k.name, native.status())}"
                    row.update(python_paths(k, call, tools, replayed))
                    call()
                    if m == 1 or row["stalls"]["calls_over_100us"]:
                        profiles[f"{op} {m}x{n} {name}"] = profile(call, args.profile_calls, args.top)
                results.append(row)
                print(row, flush=True)
    tl_rows = tilelang_backends(tools, dtype)
    breakdown = native_breakdown(tools, dtype)
    for title, text in profiles.items():
        print(f"\n=== cProfile, {args.profile_calls} calls: {title}\n{text}", flush=True)
    _session.write_json(args.json, ceiling, results, tilelang_execution_backends=tl_rows, native_breakdown=breakdown,
                        profiles=profiles)


def python_paths(k, call, tools, replayed: bool) -> dict:
    """Host µs of ``call`` on the Python fast path (where it was native) and validated every
    time; the kernel's call path is then made afresh and warmed back to where it was."""
    row = {}
    try:
        if replayed:
            native.ENABLED = False  # plans without recording: the Python fast path
            callpath.forget(k)
            call(), call()
            row["host_us_python"] = host_us(call, tools)
        fastpath.ENABLED = False  # and validated every time
        callpath.forget(k)
        row["host_us_validated"] = host_us(call, tools)
    finally:
        native.ENABLED = fastpath.ENABLED = True
        callpath.forget(k)
        for _ in range(3):  # validated, Python fast path (records), native
            call()
    return row


def k_spec(k, x, w, b):
    from impls.base import spec_of

    return spec_of(k.op, x, "cuda", w, b)


if __name__ == "__main__":
    main()
