"""The benchmarks' backward regime: one timed backward pass per (kernel, shape), for every kernel
with a backward (``NormKernel.has_backward``), timed as the forward's bandwidth regime is.

Each benchmark runs the kernel's own forward once (its saved mean and rstd are what its backward
consumes), then one backward into NaN-poisoned dx, dw and db, checked against the float64 oracle
(``impls.reference.reference_backward``: dx on rows spread over M, dw and db over all rows) before
anything is timed, then times ``_backward`` on the prepared buffers. Bytes are the fewest the pass
must move (``timing.bytes_moved_backward``): x and dy read, dx written, the weight read, dw and db
written once, the saved statistics read.
"""
from __future__ import annotations

import math
import statistics
import time

import pytest
import torch

from harness.benchmarks import timing
from harness.running import run
from harness.benchmarks.bench_forward import runnable_spec, sample_rows
from harness.judging.cases import DTYPES
from harness.judging.guards import nan_count
from impls.base import DEFAULT_EPS, NormGrads, NormKernel, UnsupportedCase
from impls.reference import reference_backward

# Relative L2 error a backward's outputs may have against the float64 oracle before the benchmark
# refuses to time it (a gross-error screen: the checks judge the backward exactly).
SCREEN_REL_L2 = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 5e-2}


def draw_dy(x: torch.Tensor) -> torch.Tensor:
    """dy for a benchmark: normal, from a generator seeded by the shape (the same for every kernel)."""
    g = torch.Generator(device=x.device).manual_seed(x.shape[0] * 131 + x.shape[1])
    return torch.randn(x.shape, generator=g, device=x.device, dtype=torch.float32).to(x.dtype)


def screen(k: NormKernel, x, w, b, dy, grads: NormGrads, eps: float, sample) -> list[str]:
    """Gross errors of one backward: NaN left in an output (poison unwritten), or a relative L2
    error over SCREEN_REL_L2 (dx on the sample rows; dw, db over all rows)."""
    problems = []
    for name, t in grads.fields().items():
        bad = nan_count(t)
        if bad:
            problems.append(f"{name}: {bad} of {t.numel()} elements unwritten or NaN")
    want = reference_backward(k.op, x, dy, w, b, eps)
    rows = reference_backward(k.op, x[sample], dy[sample], w, b, eps)
    limit = SCREEN_REL_L2[x.dtype]
    for name, got, ref in (("dx", grads.dx[sample], rows.dx), ("dw", grads.dw, want.dw), ("db", grads.db, want.db)):
        if got is None or ref is None:
            continue
        err = float(torch.linalg.vector_norm(got.double() - ref) / max(float(torch.linalg.vector_norm(ref)), 1e-300))
        if not math.isfinite(err) or err > limit:
            problems.append(f"{name}: relative L2 error {err:.3g} > {limit:g}")
    return problems


def run_backward(item, benchmark, ctx) -> None:
    k, s = item.kernel, item.shape
    spec, device = runnable_spec(k, s)
    dtype = DTYPES[s.dtype]
    layer = s.op == "layer_norm"
    ceiling_gbps, _ = ctx.ceiling(device)
    x, w, b = ctx.inputs(s, device)
    b = b if layer else None
    eps = DEFAULT_EPS[s.op]
    saved = ctx.outputs(k, s, device)
    dy = draw_dy(x)
    grads = NormGrads(dx=torch.empty_like(x), dw=torch.empty_like(w), db=None if b is None else torch.empty_like(b))
    t0 = time.perf_counter()
    try:
        k.prepare(spec)
        k._forward(x, w, b, eps, saved)
        for t in grads.fields().values():
            t.fill_(float("nan"))
        k._backward(x, w, b, dy, saved, eps, grads)  # compiles, outside the timing
        if device == "cuda":
            torch.cuda.synchronize()
    except UnsupportedCase as exc:
        pytest.skip(str(exc))
    prepare_s = time.perf_counter() - t0
    problems = screen(k, x, w, b, dy, grads, eps, sample_rows(s.m, s.n, device))
    if problems:
        pytest.fail(f"{k.name} backward on {s.group}: wrong result, not timed:\n" + "\n".join(problems), pytrace=False)

    fn = lambda: k._backward(x, w, b, dy, saved, eps, grads)  # noqa: E731
    settle_calls = timing.settle(fn) if device == "cuda" else 0
    timer, fallback = ctx.timer(fn, "bandwidth", device)
    rounds, warmup = ctx.rounds("bandwidth", device)
    stats = len({"mean", "rstd"} & set(k.outputs))
    nbytes = timing.bytes_moved_backward(s.m, s.n, dtype, True, layer, stats)
    info = benchmark.extra_info
    info.update(
        op=s.op, dtype=s.dtype, m=s.m, n=s.n, regime=s.regime, repeat=s.repeat, direction="backward",
        backend=k.backend, variant=k.variant, kernel=k.name, project=k.project, outputs=["dx", "dw"] + (["db"] * layer),
        entry_point=k.project and k.entry_point, bytes=nbytes, ceiling_gbps=ceiling_gbps,
        device=run.device_name(device), timing=fallback and f"CUDA events, {fallback}" or timer.how, timer=timer.kind,
        rounds=rounds, warmup_rounds=warmup, settle_calls=settle_calls, prepare_s=round(prepare_s, 3), correct=True,
    )
    benchmark.pedantic(timer.target, setup=timer.setup, rounds=rounds, warmup_rounds=warmup)
    median = statistics.median(timer.times[-rounds:])
    gbps = nbytes / median / 1e9
    info.update(median_us=median * 1e6, gbps=gbps, pct_of_copy=100 * gbps / ceiling_gbps)
    key = (s.group, s.repeat)
    if k.name == ctx.config.getoption("bench_baseline"):
        ctx.baseline_s[key] = median
    if key in ctx.baseline_s:
        info["speedup_vs_baseline"] = ctx.baseline_s[key] / median


__all__ = ["draw_dy", "run_backward", "screen"]
