"""Run one fused kernel on one fused case and judge it (impls.fused, harness.judging.fused_cases).

The forward check calls the kernel with the case's write convention, then checks that convention:
the outputs it names are written (poisoned, canaried buffers for the new ones; the oracle's
values in x's or residual's storage for the in-place ones), nothing else is (the canaries and
row padding around x and residual, the views it does not write, weight and bias), and each
output is within its allowance of the oracle (harness.judging.compare_fused), the oracle
following the kernel's declarations (the sum its statistics are taken on, residual_out's dtype).
"""
from __future__ import annotations

import contextlib

import torch

from harness.judging import compare_backward, compare_fused, guards
from harness.judging.fused_inputs import FusedInputs, make_fused_dy, make_fused_inputs
from harness.judging.guards import GAP, Guarded, GuardFinding, _guard, bits_of
from harness.judging.runner import INPUT_KINDS, CheckResult, device_for
from harness.judging.shapes import HUGE_ELEMENTS
from impls.base import NormGrads, NormOutputs, UnsupportedCase
from impls.fused import ADD_OPS, BASE_OP, FusedGrads, FusedOutputs
from impls.reference import offset_weight, reference, reference_fused, reference_fused_backward


def declared_sum(kernel, case) -> tuple[str, torch.dtype | None]:
    """What the oracle follows for this kernel: the sum its statistics are taken on, and
    residual_out's dtype."""
    if case.op not in ADD_OPS:
        return kernel.stats_on, None
    return kernel.stats_on, kernel.residual_out_dtype(case.torch_dtype, case.residual_torch_dtype)


class FusedOracleCache:
    """The last case's inputs and its oracle per declaration, shared by the kernels that run it."""

    def __init__(self):
        self._key, self._inputs, self._refs = None, None, {}

    def get(self, case, device: str, kernel) -> tuple[FusedInputs, object, torch.Tensor]:
        if self._key != (case.id, device):
            self.forget()
            self._key, self._inputs = (case.id, device), make_fused_inputs(case, device)
        inputs = self._inputs
        key = declared_sum(kernel, case)
        if key not in self._refs:
            stats_on, r_dtype = key
            self._refs[key] = reference_fused(case.op, inputs.x, inputs.residual, inputs.weight, inputs.bias,
                                              inputs.eps, case.weight_offset, stats_on, r_dtype)
        ref, src = self._refs[key]
        return inputs, ref, src

    def forget(self) -> None:
        self._key, self._inputs, self._refs = None, None, {}


def _unsupported(kernel, case, spec, device: str, backward: bool = False) -> str | None:
    reason = kernel.backward_unsupported(spec) if backward else kernel.unsupported(spec)
    if not reason and device == "cpu" and case.rows * case.n >= HUGE_ELEMENTS:
        reason = f"{case.rows * case.n} elements (beyond 2**31): GPU only"
    return reason


def kernel_scale(kernel, case) -> float | None:
    """The case's scale (y / scale) in the kernel's own convention."""
    if case.scale is None:
        return None
    return case.scale if kernel.scale_convention == "divide" else 1.0 / case.scale


def guarded_fused_outputs(kernel, case, x: torch.Tensor, second: bool = False) -> tuple[FusedOutputs, list[Guarded]]:
    """Poisoned, canaried buffers for the outputs the convention has the kernel write anew: y
    (unless in place), residual_out (new outputs of an add op), and the statistics it writes.
    ``second``: with the second poison (guards.resolve)."""
    shape, device = tuple(x.shape), x.device
    guards_ = []
    if case.write != "in_place":
        guards_.append(_guard("y", shape, case.out_torch_dtype or x.dtype, device, GAP, second))
    if case.op in ADD_OPS and case.write == "new":
        guards_.append(_guard("residual_out", shape, declared_sum(kernel, case)[1], device, GAP, second))
    for name in ("mean", "rstd"):
        if name in kernel.outputs:
            guards_.append(_guard(name, shape[:-1], torch.float32, device, 0, second))
    views = {g.name: g.view for g in guards_}
    return FusedOutputs(y=views.get("y", x), residual_out=views.get("residual_out"), mean=views.get("mean"),
                        rstd=views.get("rstd")), guards_


def written_views(case) -> tuple[str, ...]:
    return {"new": (), "in_place": ("x", "residual"), "out_y": ("residual",)}[case.write]


def buffer_findings(inputs: FusedInputs, before: dict[str, torch.Tensor], case) -> list[GuardFinding]:
    """Writes to x's and residual's buffers that the convention does not name: a view it does not
    write ("input modified"), or the canaries and padding around them ("out-of-bounds write")."""
    findings, allowed = [], set(written_views(case))
    for name, buffer in inputs.buffers.items():
        changed = bits_of(buffer) != bits_of(before[name])
        if not bool(changed.any()):
            continue
        outside = changed.clone()
        for view_name, place in inputs.places.items():
            if place.buffer != name:
                continue
            inside = torch.zeros_like(changed)
            inside.as_strided(place.shape, place.stride, place.offset).fill_(True)
            hit = changed & inside
            outside &= ~inside
            if view_name not in allowed and bool(hit.any()):
                first = int(torch.nonzero(hit.as_strided(place.shape, place.stride, place.offset))[0][0])
                findings.append(GuardFinding(view_name, "input modified", int(hit.sum()), [first]))
        if bool(outside.any()):
            first = int(torch.nonzero(outside)[0][0]) - guards.HEAD
            findings.append(GuardFinding(name, "out-of-bounds write", int(outside.sum()), [first]))
    return findings


def check_fused(kernel, case, oracle: FusedOracleCache | None = None, keep_outputs: bool = False,
                watch=None) -> CheckResult:
    """Run ``kernel`` on ``case`` with the case's convention and judge it (see the module)."""
    result = CheckResult(case=case, kernel=kernel.name)
    device = device_for(kernel)
    spec = case.spec(device)
    reason = _unsupported(kernel, case, spec, device)
    if reason:
        result.skipped = reason
        return result
    oracle = oracle or FusedOracleCache()
    pristine, ref, src = oracle.get(case, device, kernel)
    # A call that writes its inputs gets its own copy; a call that may not write them gets the case's,
    # dropped below if it was written anyway (the next kernel then draws fresh inputs).
    inputs = pristine if case.write == "new" else pristine.fresh()
    x, residual = inputs.x, inputs.residual
    out, guarded = guarded_fused_outputs(kernel, case, x)
    before = {k: b.clone() for k, b in inputs.buffers.items()}
    params_before = guards.snapshot_inputs(inputs.parameters())
    passed = {"x": x, "residual": residual, **inputs.parameters()}
    state = guards.input_state(passed)

    def call(args: FusedInputs, x_, residual_, out_: FusedOutputs) -> None:
        with watch.call(kernel, case, spec) if watch is not None else contextlib.nullcontext():
            kernel(x_, residual_, args.weight, args.bias, args.eps, weight_offset=case.weight_offset,
                   out_dtype=case.out_torch_dtype, scale=kernel_scale(kernel, case), write=case.write, out=out_)
            if device == "cuda":
                torch.cuda.synchronize()

    def call_again() -> list[Guarded]:  # on the inputs as drawn, into outputs with the second poison
        again = pristine if case.write == "new" else pristine.fresh()
        out2, guarded2 = guarded_fused_outputs(kernel, case, again.x, second=True)
        call(again, again.x, again.residual, out2)
        return guarded2

    try:
        call(inputs, x, residual, out)
    except UnsupportedCase as exc:  # valid input this kernel cannot run (a layout it refuses): its reason
        result.skipped = str(exc)
        return result
    inputs_found = (guards.inputs_altered(state, passed) + buffer_findings(inputs, before, case)
                    + guards.inputs_modified(params_before, inputs.parameters()))
    del before, params_before
    result.findings = guards.resolve(guarded, guards.inspect(guarded), call_again) + inputs_found
    kinds = {f.kind for f in result.findings}
    if "input altered" in kinds or (kinds & {"input modified", "out-of-bounds write"} and inputs is pristine):
        oracle.forget()
    got = FusedOutputs(y=x if case.write == "in_place" else out.y,
                       residual_out=residual if case.write != "new" else out.residual_out,
                       mean=out.mean, rstd=out.rstd)
    result.stat_dtype = kernel.stat_dtype(case.torch_dtype, device)
    result.errors = compare_fused.compare_fused(kernel, case, got, ref, src, inputs.weight, result.stat_dtype)
    if keep_outputs:
        result.outputs = got
    return result


def check_fused_backward(kernel, case, oracle: FusedOracleCache | None = None, watch=None) -> CheckResult:
    """The kernel's forward (for its own residual_out and statistics), then its backward with dy
    and residual_out's gradient into poisoned, canaried gradients; guards; each gradient against
    the float64 oracle with the plain backward's allowances (harness.judging.compare_backward)."""
    result = CheckResult(case=case, kernel=kernel.name)
    device = device_for(kernel)
    spec = case.spec(device)
    reason = _unsupported(kernel, case, spec, device, backward=True)
    if reason:
        result.skipped = reason
        return result
    oracle = oracle or FusedOracleCache()
    pristine, _, _ = oracle.get(case, device, kernel)
    # The forward runs in the case's convention on a copy of the inputs (in place it leaves y in x's
    # storage and residual_out in residual's); the backward then gets the inputs as they were.
    inputs, called = pristine.fresh(), pristine.fresh()
    x, residual, weight, bias = inputs.x, inputs.residual, inputs.weight, inputs.bias
    dy, d_res = make_fused_dy(case, device)
    passed = {"x": x, "residual": residual, "weight": weight, "bias": bias, "dy": dy, "d_residual_out": d_res}
    state = guards.input_state(passed)  # before the forward: neither call may change them
    watched = (lambda: watch.call(kernel, case, spec)) if watch is not None else contextlib.nullcontext
    try:
        with watched():
            saved = kernel(called.x, called.residual, weight, bias, inputs.eps, weight_offset=case.weight_offset,
                           write=case.write)
    except UnsupportedCase as exc:
        result.skipped = str(exc)
        return result
    named = [("dx", x.shape, x.dtype, GAP)]
    if residual is not None:
        named.append(("dresidual", residual.shape, residual.dtype, GAP))
    named += [(n, t.shape, t.dtype, 0) for n, t in (("dw", weight), ("db", bias)) if t is not None]
    guarded = [_guard(n, tuple(shape), dtype, x.device, gap) for n, shape, dtype, gap in named]
    views = {g.name: g.view for g in guarded}
    grads = FusedGrads(dx=views["dx"], dresidual=views.get("dresidual"), dw=views.get("dw"), db=views.get("db"))
    given = {**{f"buffer {k}": b for k, b in inputs.buffers.items()}, **inputs.parameters(), "dy": dy,
             **({"d_residual_out": d_res} if d_res is not None else {}), **saved.fields()}
    before = guards.snapshot_inputs(given)
    try:
        with watched():
            kernel.backward(x, residual, weight, bias, dy, saved, inputs.eps, d_residual_out=d_res,
                            weight_offset=case.weight_offset, out=grads)
            if device == "cuda":
                torch.cuda.synchronize()
    except UnsupportedCase as exc:  # valid input its backward refuses from inside the call: its reason
        result.skipped = str(exc)
        return result
    result.findings = (guards.inspect(guarded) + guards.inputs_modified(before, given)
                       + guards.inputs_altered(state, passed))
    if any(f.kind in INPUT_KINDS for f in result.findings):
        oracle.forget()  # weight and bias are the case's own
    # The oracle normalises what a correct kernel saved: the sum rounded to residual_out's dtype.
    base = BASE_OP[case.op]
    src = (x.double() + residual.double()).to(saved.residual_out.dtype) if residual is not None else x
    ref = reference_fused_backward(case.op, src, dy, d_res, weight, bias, inputs.eps, case.weight_offset)
    w_eff = offset_weight(weight, case.weight_offset)
    back_ref = compare_backward.BackwardReference(base, src, dy, w_eff, bias, NormGrads(dx=ref.dx, dw=ref.dw, db=ref.db),
                                                  reference(base, src, None, None, inputs.eps))
    result.stat_dtype = kernel.stat_dtype(case.torch_dtype, device)
    plain = NormGrads(dx=grads.dx, dw=grads.dw, db=grads.db)
    result.errors = compare_backward.compare_grads(plain, back_ref, case.torch_dtype, result.stat_dtype)
    if grads.dresidual is not None:
        ulps, floor = compare_backward.floors_of(back_ref, result.stat_dtype)["dx"]
        want = compare_backward.in_range(ref.dresidual, residual.dtype)
        result.errors.append(compare_fused.compare("dresidual", grads.dresidual, want, residual.dtype, floor, ulps))
    return result


__all__ = ["FusedOracleCache", "check_fused", "check_fused_backward", "NormOutputs"]
