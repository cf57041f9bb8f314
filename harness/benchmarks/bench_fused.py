"""The fused ops' benchmarks (impls.fused): add_rms_norm, add_layer_norm, and rms_norm / layer_norm
with an fp8 output or a weight offset, timed beside the plain norms in the same session, against
the same copy ceiling, from the same arena.

A fused shape (``FusedShape``) is a BenchShape with the call's choices: the write convention, the
fp8 output and its scale, the weight offset, the residual's dtype. Its rows are its own
(``family`` "fused" and a ``case`` in each row's ``extra_info``: the op and those choices), so the
report's tables and targets never mix them with the plain norms' rows.

What is timed, per (fused kernel, shape), in order:

1. a kernel that cannot run the call (``FusedNormKernel.unsupported`` of the fused spec: the
   write convention, the fp8 output, the offset, the residual dtype, the device) or whose time
   would mean nothing here (``bench_unavailable``) is skipped with that reason;
2. ``prepare(spec)``, then one call of ``_forward`` into NaN-poisoned outputs, screened against
   the float64 oracle (``impls.reference.reference_fused``) on rows spread over all M: nothing left
   unwritten and every output within a gross-error bound (``SCREEN_REL_L2``; the checks judge
   exactly). A wrong result fails the benchmark and is not timed;
3. ``_forward`` timed as the plain forward is (``harness.benchmarks.timing``: CUDA events, a
   CUDA-graph replay at decode shapes, the wall clock on the CPU; at decode a kernel that can
   launch with PDL twice, PDL on and off, as harness.bench says). A kernel whose ``_forward``
   copies a library's own results into the caller's buffers may define
   ``bench_fused_callable(x, residual, weight, bias, eps, params, out)``, the zero-argument call of
   its own work (the plain family's ``_call``); that is timed instead.

**Writes into its inputs** (``in_place``, ``out_y``): every timed call would otherwise start from
the previous call's outputs. y = norm(x + r) stays bounded (about the weight's size), but residual
grows by y (in place) or by x (out_y) each call: over the up to 20000 calls of a GPU settle step it
would reach hundreds in bfloat16 (where adding y then rounds away), tens of thousands in float32,
and pass float16's 65504 (inf, then NaN), and in any case the data would drift from what the other
kernels of the group see. So x and residual are restored from a pristine copy before every timed
(and warm-up) call, in the timer's setup, outside the timed span (on a GPU before the L2 flush, so
nothing the copy wrote is left in L2). Only the 20 calls of one CUDA-graph replay (decode) chain on
each other's outputs, a drift of a few units; the settle step restores every RESTORE_EVERY calls.

**Conventions compared on the same shape**: an add op's shape is timed once per write convention
(the headline: in place and new outputs), each a group of its own; a kernel that does not write a
convention is skipped there with its reason (an in-place-only kernel at the "new" rows, a
new-only kernel at the in-place rows), so every kernel is timed at each convention it declares
and each group compares kernels on identical work.

**Bytes** (``fused_bytes``): x read, y written (one byte an element for an fp8 y), the weight
(and bias) read, 4 bytes per row for each float32 statistic the kernel writes; the add ops also
read residual and write residual_out, in each one's dtype. In place moves the same bytes: y still
goes into x's storage and residual_out into residual's.
"""
from __future__ import annotations

import math
import statistics
import time

import pytest
import torch

from harness.benchmarks import timing
from harness.benchmarks.bench_forward import sample_rows
from harness.benchmarks.bench_sweep import BenchItem
from harness.judging.cases import Case
from harness.judging.guards import nan_count
from harness.judging.inputs import make_inputs
from harness.judging.runner import device_for
from harness.running import run
from impls.base import DEFAULT_EPS, UnsupportedCase
from impls.fused import BASE_OP, FusedNormKernel, FusedOutputs, FusedParams, FusedSpec, fp8_max
from impls.inputs import dtype_name
from impls.reference import reference_fused

# The shapes, the selection and the bytes (harness.benchmarks.fused_shapes), part of this module's interface.
from harness.benchmarks.fused_shapes import (  # noqa: F401
    BASELINE, FP8_SCALE, FULL_BANDWIDTH_N,
    FULL_OPTION_N, HEADLINE_DECODE_M, HEADLINE_FP8, HEADLINE_N, HEADLINE_WRITES, MARK,
    QUICK_DECODE_SHAPE, QUICK_SHAPE, SCREEN_REL_L2, STATS_REL_L2, WRITE_WORDS, FusedShape,
    baseline_of, fused_bytes, items, phase, sweep, torch_dtype)

def fused_spec(k: FusedNormKernel, s: FusedShape) -> tuple[FusedSpec, str]:
    """The benchmark's problem (weight, and bias for LayerNorm) and its device; skips with the
    reason where the kernel cannot run it or a time would not mean anything here."""
    device = device_for(k)
    spec = FusedSpec(op=s.op, dtype=s.x_dtype, rows=s.m, n=s.n, row_stride=s.n, device=device, has_weight=True,
                     has_bias=BASE_OP[s.op] == "layer_norm", residual_dtype=s.r_dtype,
                     weight_offset=float(s.weight_offset), out_dtype=s.out_dtype and s.y_dtype, write=s.write)
    reason = k.unsupported(spec) or k.bench_unavailable()
    if reason:
        pytest.skip(reason)
    return spec, device


def draw_residual(s: FusedShape, device: str) -> torch.Tensor:
    """The residual: normal, from a generator seeded by the shape (the same for every kernel)."""
    g = torch.Generator(device=device).manual_seed(s.m * 131 + s.n + 7)
    return torch.randn((s.m, s.n), generator=g, device=device, dtype=torch.float32).to(s.r_dtype)


def buffers(ctx, s: FusedShape, device: str) -> dict[str, torch.Tensor]:
    """The shape's parts in the session's arena, its inputs drawn once per shape (x, weight and bias
    as the checks draw them) and x and residual restored from their pristine copies."""
    views = ctx.arena(device).views(s)
    key = ("fused", s.group, device)
    if ctx._inputs_key != key:  # noqa: SLF001 (the arena's last writer: a plain shape draws again after this)
        ctx._inputs_key = ctx._inputs = None  # noqa: SLF001
        drawn = make_inputs(Case(BASE_OP[s.op], s.dtype, (s.m, s.n)), device)
        views["x0" if s.add else "x"].copy_(drawn.x)
        views["w"].copy_(drawn.weight)
        views["b"].copy_(drawn.bias if drawn.bias is not None else torch.zeros_like(views["b"]))
        if s.add:
            views["r0"].copy_(draw_residual(s, device))
        del drawn
        ctx._inputs_key = key  # noqa: SLF001
    if s.add:
        views["x"].copy_(views["x0"])
        views["r"].copy_(views["r0"])
    return views


def outputs(k: FusedNormKernel, s: FusedShape, views: dict) -> FusedOutputs:
    """The call's outputs as its write convention places them: y in x under in_place, residual_out
    in residual unless new; residual_out in the kernel's dtype (``residual_out_dtype``)."""
    r_out = None
    if s.add:
        if s.write != "new":
            r_out = views["r"]
        else:
            dt = k.residual_out_dtype(s.x_dtype, s.r_dtype)
            r_out = views["r_out"].view(torch.uint8).view(-1)[:s.m * s.n * dt.itemsize].view(dt).view(s.m, s.n)
    stat = lambda name: views[name] if name in k.outputs else None  # noqa: E731
    return FusedOutputs(y=views["x"] if s.write == "in_place" else views["y"], residual_out=r_out,
                        mean=stat("mean"), rstd=stat("rstd"))


def rel_l2(got: torch.Tensor, want: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(got.double() - want) / max(float(torch.linalg.vector_norm(want)), 1e-300))


def screen(k: FusedNormKernel, s: FusedShape, views: dict, out: FusedOutputs, eps: float,
           rows: torch.Tensor) -> tuple[list[str], dict[str, float]]:
    """Problems with one call's outputs (empty when correct) and each output's relative L2 error
    on ``rows``: NaN anywhere (inputs are finite; outputs other than x and residual were poisoned
    with NaN), or an error over its SCREEN_REL_L2 (STATS_REL_L2 for the statistics)."""
    problems, errors = [], {}
    for name, t in out.fields().items():
        bad = nan_count(t)
        if bad:
            problems.append(f"{name}: {bad} of {t.numel()} elements unwritten or NaN")
    x = views["x0" if s.add else "x"][rows]
    r = views["r0"][rows] if s.add else None
    r_out_dtype = out.residual_out.dtype if out.residual_out is not None else None
    ref, _ = reference_fused(s.op, x, r, views["w"], views["b"] if BASE_OP[s.op] == "layer_norm" else None, eps,
                             weight_offset=s.weight_offset, stats_on=k.stats_on, residual_out_dtype=r_out_dtype)
    y = out.y[rows].double()
    want_y = ref.y
    if s.out_dtype:
        y = y * s.scale  # dequantised (the kernel was given the scale in its own convention)
        top = fp8_max(s.y_dtype) * s.scale  # saturated where y / scale passes the format's maximum
        want_y = want_y.clamp(-top, top)
    checks = [("y", y, want_y, SCREEN_REL_L2[s.y_dtype])]
    if out.residual_out is not None:
        checks.append(("residual_out", out.residual_out[rows], ref.residual_out, SCREEN_REL_L2[r_out_dtype]))
    for name in ("mean", "rstd"):
        if getattr(out, name) is not None and getattr(ref, name) is not None:
            checks.append((name, getattr(out, name)[rows], getattr(ref, name), STATS_REL_L2))
    for name, got, want, limit in checks:
        errors[name] = err = rel_l2(got, want)
        if not math.isfinite(err) or err > limit:
            problems.append(f"{name}: relative L2 error {err:.3g} > {limit:g} against the float64 oracle")
    return problems, errors


def bench_callable(k: FusedNormKernel, x, r, w, b, eps: float, params: FusedParams, out: FusedOutputs):
    """The call timed: the kernel's ``bench_fused_callable`` where it defines one, else ``_forward``."""
    own = getattr(k, "bench_fused_callable", None)
    if callable(own):
        return own(x, r, w, b, eps, params, out)
    return lambda: k._forward(x, r, w, b, eps, params, out)  # noqa: SLF001


RESTORE_EVERY = 256  # settle calls chained on each other's outputs between two restores


def restoring(fn, restore, every: int = RESTORE_EVERY):
    """``fn`` for the settle step of a call that writes its inputs: the inputs restored every
    ``every`` calls, so the chain never runs long enough for the residual to leave float16's range
    (it grows by at most a few units a call)."""
    calls = 0

    def call() -> None:
        nonlocal calls
        calls += 1
        if calls % every == 0:
            restore()
        fn()
    return call


def run_fused(item: BenchItem, benchmark, ctx) -> None:
    """The benchmark of ``item`` (a fused kernel on a FusedShape) in session ``ctx``."""
    k, s = item.kernel, item.shape
    spec, device = fused_spec(k, s)
    ceiling_gbps, _ = ctx.ceiling(device)
    views = buffers(ctx, s, device)
    x, r, w = views["x"], views.get("r") if s.add else None, views["w"]
    b = views["b"] if BASE_OP[s.op] == "layer_norm" else None
    eps = DEFAULT_EPS[s.op]
    params = s.params(k.scale_convention)
    out = outputs(k, s, views)
    writes_inputs = s.write != "new"

    def restore() -> None:
        if writes_inputs:
            x.copy_(views["x0"])
            r.copy_(views["r0"])

    t0 = time.perf_counter()
    try:
        k.prepare(spec)
        for name, t in out.fields().items():
            if not (writes_inputs and (t is x or t is r)):
                t.fill_(float("nan"))
        k._forward(x, r, w, b, eps, params, out)  # noqa: SLF001
        if device == "cuda":
            torch.cuda.synchronize()
    except UnsupportedCase as exc:
        pytest.skip(str(exc))
    prepare_s = time.perf_counter() - t0
    problems, errors = screen(k, s, views, out, eps, sample_rows(s.m, s.n, device))
    if problems:
        pytest.fail(f"{k.name} on {s.group}: wrong result, not timed:\n" + "\n".join(problems), pytrace=False)

    fn = bench_callable(k, x, r, w, b, eps, params, out)
    settle_calls = timing.settle(restoring(fn, restore) if writes_inputs else fn) if device == "cuda" else 0
    restore()
    timer, fallback = ctx.timer(fn, s.regime, device)
    rounds, warmup = ctx.rounds(s.regime, device)

    def setup() -> None:  # outside the timed span: the inputs every timed call starts from
        restore()
        timer.setup()

    stats = len({"mean", "rstd"} & set(k.outputs))
    nbytes = fused_bytes(s.op, s.m, s.n, s.x_dtype, s.y_dtype, s.r_dtype,
                         out.residual_out.dtype if out.residual_out is not None else None,
                         True, b is not None, stats)
    baseline = baseline_of(ctx.config)
    info = benchmark.extra_info
    info.update(
        op=s.op, dtype=s.dtype, m=s.m, n=s.n, regime=s.regime, repeat=s.repeat, family="fused", case=s.case,
        case_title=s.title, write=s.write, out_dtype=s.out_dtype, scale=s.scale, weight_offset=s.weight_offset,
        residual_dtype=s.r_dtype and dtype_name(s.r_dtype),
        residual_out_dtype=None if out.residual_out is None else dtype_name(out.residual_out.dtype),
        scale_convention=k.scale_convention, stats_on=k.stats_on,
        backend=k.backend, variant=k.variant, kernel=k.name, project=k.project, outputs=list(out.fields()),
        entry_point=False, baseline=baseline,
        bytes=nbytes, ceiling_gbps=ceiling_gbps, device=run.device_name(device),
        timing=fallback and f"CUDA events, {fallback}" or timer.how, timer=timer.kind,
        inputs=("x and residual restored from a pristine copy before each timed call, outside the timed span"
                if writes_inputs else "x and residual unchanged by the calls" if s.add else "x unchanged by the calls"),
        rounds=rounds, warmup_rounds=warmup, settle_calls=settle_calls, prepare_s=round(prepare_s, 3),
        correct=True, screen_rel_l2={name: float(f"{e:.3g}") for name, e in errors.items()},
    )
    benchmark.pedantic(timer.target, setup=setup, rounds=rounds, warmup_rounds=warmup)
    restore()

    median = statistics.median(timer.times[-rounds:])
    gbps = nbytes / median / 1e9
    info.update(median_us=median * 1e6, gbps=gbps, pct_of_copy=100 * gbps / ceiling_gbps)
    if isinstance(timer, timing.EventTimer):
        info.update(host_enqueue_us=timer.host_enqueue_us(), gpu_lead_us=timer.lead_us)
    key = (s.group, s.repeat)
    if k.name == baseline and not item.forced_on:  # PDL off where timed both ways: like for like
        ctx.baseline_s[key] = median
    if key in ctx.baseline_s:
        info["speedup_vs_baseline"] = ctx.baseline_s[key] / median


def is_fused_shape(shape) -> bool:
    return isinstance(shape, FusedShape)


__all__ = ["BASELINE", "FP8_SCALE", "FusedShape", "MARK", "fused_bytes", "items", "phase", "run_fused",
           "sweep"]
