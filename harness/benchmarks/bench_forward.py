"""One forward benchmark: its problem, one call judged against the oracle on a sample of rows,
the timed rounds with what they measured in ``benchmark.extra_info``, and on a GPU the host cost
of the call a user makes. The session's shared pieces come from ``ctx`` (harness.benchmarks.bench_context)."""
from __future__ import annotations

import math
import statistics
import time

import pytest
import torch

from harness.benchmarks import timing
from harness.running import run
from harness.benchmarks.bench_sweep import BenchShape
from harness.judging.cases import DTYPES
from harness.judging.guards import nan_count
from harness.judging.runner import device_for, judge
from impls.base import DEFAULT_EPS, NormKernel, NormOutputs, NormSpec, UnsupportedCase
from impls.reference import reference

# Correctness on a sample of rows: at most this many elements go through the float64 oracle.
CHECK_ELEMENTS = 2**22


def runnable_spec(k: NormKernel, s: BenchShape) -> tuple[NormSpec, str]:
    """The benchmark's problem (weight, and bias for LayerNorm) and its device; skips with the
    reason where the kernel cannot run it (its backward, in the backward regime) or a time would
    not mean anything here."""
    device = device_for(k)
    spec = NormSpec(op=s.op, dtype=DTYPES[s.dtype], rows=s.m, n=s.n, row_stride=s.n, device=device,
                    has_weight=True, has_bias=s.op == "layer_norm")
    reason = (k.backward_unsupported(spec) if s.regime == "backward" else k.unsupported(spec)) or k.bench_unavailable()
    if reason:
        pytest.skip(reason)
    return spec, device


def run_forward(item, benchmark, ctx) -> None:
    """The forward regime's benchmark of ``item`` (a BenchItem) in session ``ctx``."""
    k, s = item.kernel, item.shape
    spec, device = runnable_spec(k, s)
    dtype = DTYPES[s.dtype]
    layer = s.op == "layer_norm"
    ceiling_gbps, _ = ctx.ceiling(device)
    x, w, b = ctx.inputs(s, device)
    b = b if layer else None
    eps = DEFAULT_EPS[s.op]
    out = ctx.outputs(k, s, device)

    t0 = time.perf_counter()
    try:
        k.prepare(spec)
        for t in out.fields().values():
            t.fill_(float("nan"))
        k._forward(x, w, b, eps, out)
        if device == "cuda":
            torch.cuda.synchronize()
    except UnsupportedCase as exc:
        pytest.skip(str(exc))
    prepare_s = time.perf_counter() - t0
    problems, worst_ulp = verify(k, s, x, w, b, eps, out, device)
    if problems:
        pytest.fail(f"{k.name} on {s.group}: wrong result, not timed:\n" + "\n".join(problems), pytrace=False)

    fn = k.bench_callable(x, w, b, eps, out)
    settle_calls = timing.settle(fn) if device == "cuda" else 0
    timer, fallback = ctx.timer(fn, s.regime, device)
    rounds, warmup = ctx.rounds(s.regime, device)
    nbytes = timing.bytes_moved(s.m, s.n, dtype, True, layer, len({"mean", "rstd"} & set(k.outputs)))
    info = benchmark.extra_info
    info.update(
        op=s.op, dtype=s.dtype, m=s.m, n=s.n, regime=s.regime, repeat=s.repeat,
        backend=k.backend, variant=k.variant, kernel=k.name, project=k.project, outputs=list(k.outputs),
        entry_point=k.project and k.entry_point,
        bytes=nbytes, ceiling_gbps=ceiling_gbps, device=run.device_name(device),
        timing=fallback and f"CUDA events, {fallback}" or timer.how, timer=timer.kind,
        rounds=rounds, warmup_rounds=warmup, settle_calls=settle_calls, prepare_s=round(prepare_s, 3),
        prepare_cap=getattr(k, "autotune_cap", None),  # what bounds a plug-in's autotuning, where it declares it
        correct=True, max_ulp_err=worst_ulp,
    )
    benchmark.pedantic(timer.target, setup=timer.setup, rounds=rounds, warmup_rounds=warmup)

    median = statistics.median(timer.times[-rounds:])
    gbps = nbytes / median / 1e9
    info.update(median_us=median * 1e6, gbps=gbps, pct_of_copy=100 * gbps / ceiling_gbps)
    if isinstance(timer, timing.EventTimer):
        info.update(host_enqueue_us=timer.host_enqueue_us(), gpu_lead_us=timer.lead_us)
    # A PDL-on timing's twin (PDL off) carries the host-inclusive figures and the baseline: like
    # for like with the kernels that cannot launch with PDL.
    if device == "cuda" and s.repeat == 0 and not item.forced_on:
        info.update(user_cost(k, x, w, b, eps, ctx.gpu(), median * 1e6))
        if k.project and k.entry_point and "user_call" in info and host_target_shape(s):
            info.update(paired_host_cost(k, ctx.host_peers(s.op), x, w, b, eps, ctx.gpu()))
    key = (s.group, s.repeat)
    if k.name == ctx.config.getoption("bench_baseline") and not item.forced_on:
        ctx.baseline_s[key] = median
    if key in ctx.baseline_s:
        info["speedup_vs_baseline"] = ctx.baseline_s[key] / median


def user_cost(k: NormKernel, x, w, b, eps, gpu: timing.GpuTools, device_us: float) -> dict:
    """The host-inclusive columns: host µs and wall µs per call of the call a user makes
    (``NormKernel.user_call``), named; or why they could not be measured."""
    try:
        name, call = k.user_call(x, w, b, eps)
        host, wall = timing.user_call_cost(call, gpu, device_us)
    except Exception as exc:  # noqa: BLE001 (reported in the row, the device time stands)
        torch.cuda.synchronize()
        return {"user_call_error": f"{type(exc).__name__}: {exc}"[:300]}
    return {"user_call": name, "host_call_us": host, "wall_call_us": wall}


def host_target_shape(s: BenchShape) -> bool:
    """Whether the host target judges this shape (``harness.report.host``): only there are the
    entry point and its peers timed paired. Elsewhere the pairs would be 15 rounds of 200 calls of
    three kernels, over a minute of GPU time a benchmark at the long rows, for a figure no target
    reads; the row's own host µs is still measured."""
    from harness.report.host import judges_host

    return judges_host(s.regime, s.n)


def paired_host_cost(k: NormKernel, peers: list[NormKernel], x, w, b, eps, gpu: timing.GpuTools) -> dict:
    """Host µs per call of an entry point and of each reference peer's call on the same inputs,
    timed in interleaved rounds (``timing.paired_host_us``): the figures the host targets compare.
    A peer that cannot take the call is left out, named with why."""
    calls, left_out = {k.name: k.user_call(x, w, b, eps)[1]}, {}
    for p in peers:
        try:
            call = p.user_call(x, w, b, eps)[1]
            call()
        except Exception as exc:  # noqa: BLE001 (the peer's own row says more)
            torch.cuda.synchronize()
            left_out[p.name] = f"{type(exc).__name__}: {exc}"[:200]
            continue
        calls[p.name] = call
    if len(calls) == 1:
        return {"host_paired_left_out": left_out} if left_out else {}
    samples: dict = {}
    medians = timing.paired_host_us(calls, gpu, samples=samples)
    return {"host_paired_us": medians,
            "host_paired_rounds_us": {name: [round(v, 2) for v in vs] for name, vs in samples.items()},
            **({"host_paired_left_out": left_out} if left_out else {})}


def verify(k: NormKernel, s: BenchShape, x, w, b, eps, out: NormOutputs, device: str) -> tuple[list[str], float]:
    """Problems with the outputs of one call (empty when correct), and the worst ulp error seen."""
    problems = []
    for name, t in out.fields().items():
        unwritten = nan_count(t)
        if unwritten:  # inputs are finite; NaN is the poison left unwritten (or a NaN computed)
            problems.append(f"{name}: {unwritten} of {t.numel()} elements unwritten or NaN")
    rows = sample_rows(s.m, s.n, device)
    sub = NormOutputs(**{name: t[rows] for name, t in out.fields().items()})
    errors, _ = judge(k, s.op, x[rows], w, b, sub, reference(s.op, x[rows], w, b, eps), device)
    problems += [e.summary() for e in errors if not e.ok]
    worst = max((e.max_ulp for e in errors if math.isfinite(e.max_ulp)), default=0.0)
    return problems, worst


def sample_rows(m: int, n: int, device: str) -> torch.Tensor:
    """Rows spread evenly over all M (first and last included), at most CHECK_ELEMENTS elements."""
    k = max(2, min(m, CHECK_ELEMENTS // n))
    return torch.linspace(0, m - 1, k, device=device).round().long().unique()
