"""Run one kernel on one case and judge it: guards first, then each output against the oracle.

Kept free of pytest so the framework's own tests (and a user at a prompt) can call it directly.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from harness.judging import compare, compare_backward, guards
from harness.judging.cases import Case
from harness.judging.inputs import make_dy, make_inputs
from harness.judging.shapes import HUGE_ELEMENTS
from impls.base import NormGrads, NormKernel, NormOutputs
from impls.reference import reference, reference_backward


# Findings after which the case's inputs are not as drawn: the next kernel gets fresh ones.
INPUT_KINDS = ("input modified", "input altered")


@dataclass
class CheckResult:
    case: Case
    kernel: str
    skipped: str | None = None  # why the kernel cannot run this case
    errors: list[compare.ErrorStats] = field(default_factory=list)
    findings: list[guards.GuardFinding] = field(default_factory=list)
    outputs: NormOutputs | None = None  # kept for the agreement matrix
    y_extra: torch.Tensor | None = None  # what the kernel's rounding contract adds to y's allowance
    stat_dtype: torch.dtype | None = None  # the precision of its mean and rstd (their allowance)
    grads: NormGrads | None = None  # a backward check's gradients, kept for the agreement matrix

    @property
    def ok(self) -> bool:
        return self.skipped is None and not self.findings and all(e.ok for e in self.errors)

    def failure_message(self) -> str:
        lines = [f"{self.kernel} on {self.case.id}:"]
        lines += [f"  guard: {f.summary()}" for f in self.findings]
        lines += [f"  {e.summary()}" for e in self.errors if not e.ok]
        return "\n".join(lines)


def device_for(kernel: NormKernel) -> str:
    """The device a kernel's inputs go to: the GPU when the kernel runs there and one is
    present, else the first device it names."""
    if "cuda" in kernel.devices and torch.cuda.is_available():
        return "cuda"
    return "cpu" if "cpu" in kernel.devices else kernel.devices[0]


# A case beyond this many elements is judged in row chunks of ORACLE_CHUNK_ELEMENTS, each with its
# own float64 oracle: the oracle of a whole 2**31-element case would take 16 GiB for y alone, and
# the comparison's float64 temporaries several times that.
ORACLE_WHOLE_ELEMENTS = 2**28
ORACLE_CHUNK_ELEMENTS = 2**25


@dataclass
class ChunkedReference:
    """The oracle of a case judged in row chunks: computed where it is judged, a chunk of rows
    (along x's first dimension) at a time."""

    op: str
    x: torch.Tensor
    weight: torch.Tensor | None
    bias: torch.Tensor | None
    eps: float

    def chunks(self):
        """(rows, the oracle's outputs for x[rows]) for consecutive slices of rows."""
        step = max(1, ORACLE_CHUNK_ELEMENTS // max(1, self.x[0].numel()))
        for r0 in range(0, self.x.shape[0], step):
            rows = slice(r0, r0 + step)
            yield rows, reference(self.op, self.x[rows], self.weight, self.bias, self.eps)


def oracle_for(case: Case, inputs) -> NormOutputs | ChunkedReference:
    """The oracle's outputs for a case, or for a case beyond ORACLE_WHOLE_ELEMENTS the means to
    compute them in chunks."""
    if inputs.x.numel() > ORACLE_WHOLE_ELEMENTS:
        return ChunkedReference(case.op, inputs.x, inputs.weight, inputs.bias, inputs.eps)
    return reference(case.op, inputs.x, inputs.weight, inputs.bias, inputs.eps)


class OracleCache:
    """The inputs and the oracle's answer for the last case, shared by every kernel that runs it
    (the harness runs all kernels of a case one after another); the answer is a ChunkedReference
    for cases too large for a whole float64 copy."""

    def __init__(self):
        self._key = None
        self._value = None

    def get(self, case: Case, device: str):
        key = (case.id, device)
        if key != self._key:
            self._value = None  # free the previous case's tensors first
            inputs = make_inputs(case, device)
            self._key, self._value = key, (inputs, oracle_for(case, inputs))
        return self._value

    def forget(self) -> None:
        self._key = self._value = None


def check(kernel: NormKernel, case: Case, oracle: OracleCache | None = None, keep_outputs: bool = False,
          watch=None) -> CheckResult:
    """Run ``kernel`` on ``case`` inside guards and compare with the oracle. ``watch`` (the
    harness's isolation.CallWatch) limits the call and its synchronize in time and notes what runs."""
    result = CheckResult(case=case, kernel=kernel.name)
    device = device_for(kernel)
    spec = case.spec(device)
    reason = kernel.unsupported(spec)
    if not reason and device == "cpu" and case.rows * case.n >= HUGE_ELEMENTS:
        reason = f"{case.rows * case.n} elements (beyond 2**31): GPU only (on the CPU: tens of GB and hours)"
    if reason:
        result.skipped = reason
        return result
    oracle = oracle or OracleCache()
    inputs, ref = oracle.get(case, device)
    out, guarded = guards.guarded_outputs(kernel, inputs.x)
    before = guards.snapshot_inputs(inputs.tensors())
    passed = {"x": inputs.x, "weight": inputs.weight, "bias": inputs.bias}
    state = guards.input_state(passed)
    # Judged on what lands in the given buffers, whatever the call returns.
    with watch.call(kernel, case, spec) if watch is not None else contextlib.nullcontext():
        kernel(inputs.x, inputs.weight, inputs.bias, inputs.eps, out=out)
        if device == "cuda":
            torch.cuda.synchronize()
    altered = guards.inputs_altered(state, passed)
    result.findings = guards.inspect(guarded) + guards.inputs_modified(before, inputs.tensors()) + altered
    if any(f.kind in INPUT_KINDS for f in result.findings):
        oracle.forget()  # the next kernel gets fresh inputs
    result.errors, extra = judge(kernel, case.op, inputs.x, inputs.weight, inputs.bias, out, ref, device)
    if keep_outputs and not isinstance(ref, ChunkedReference):  # the agreement matrix: a whole oracle's cases only
        result.outputs, result.y_extra = out, extra
        result.stat_dtype = kernel.stat_dtype(case.torch_dtype, device)
    return result


def judge(kernel: NormKernel, op: str, x, weight, bias, out: NormOutputs, ref: NormOutputs, device: str):
    """Each output of ``kernel`` against the oracle's ``ref`` for the same rows of x, with the
    allowance its rounding contract and statistics dtype imply (the checks and the benchmarks'
    verification both judge here). Returns the errors and y's extra allowance (None for a
    ChunkedReference, judged chunk by chunk and its errors merged)."""
    if isinstance(ref, ChunkedReference):
        parts = []
        for rows, chunk in ref.chunks():
            sub = NormOutputs(out.y[rows], None if out.mean is None else out.mean[rows],
                              None if out.rstd is None else out.rstd[rows])
            errors, _ = judge(kernel, op, x[rows], weight, bias, sub, chunk, device)
            parts.append((rows.start, errors))
        return [compare.merge([(r0, errors[i]) for r0, errors in parts]) for i in range(len(parts[0][1]))], None
    extra = compare.rounding_allowance(kernel.rounding, op, x, ref, weight, bias, x.dtype)
    errors = compare.compare_outputs(op, out, ref, x.dtype, kernel.stat_dtype(x.dtype, device), weight, extra)
    return errors, extra


# -- the backward ---------------------------------------------------------------------------------
class BackwardOracleCache:
    """A backward case's inputs, dy and the oracle's gradients (with what their allowances need),
    for the last case, shared by every kernel that runs it."""

    def __init__(self):
        self._key = self._value = None

    def get(self, case: Case, device: str):
        key = (case.id, device)
        if key != self._key:
            self._value = None
            inputs = make_inputs(case, device)
            dy, dy_storage = make_dy(case, device)
            grads = reference_backward(case.op, inputs.x, dy, inputs.weight, inputs.bias, inputs.eps)
            fwd = reference(case.op, inputs.x, None, None, inputs.eps)
            ref = compare_backward.BackwardReference(case.op, inputs.x, dy, inputs.weight, inputs.bias, grads, fwd)
            self._key, self._value = key, (inputs, dy, dy_storage, ref)
        return self._value

    def forget(self) -> None:
        self._key = self._value = None


def check_backward(kernel: NormKernel, case: Case, oracle: BackwardOracleCache | None = None,
                   keep_outputs: bool = False, watch=None) -> CheckResult:
    """The kernel's forward (for its own saved mean and rstd), then its backward into poisoned,
    canaried dx, dw and db; guards, then each gradient against the oracle (harness.judging.compare_backward).
    A kernel without a backward is skipped with that reason."""
    result = CheckResult(case=case, kernel=kernel.name)
    device = device_for(kernel)
    spec = case.spec(device)
    reason = kernel.backward_unsupported(spec)
    if reason:
        result.skipped = reason
        return result
    oracle = oracle or BackwardOracleCache()
    inputs, dy, dy_storage, ref = oracle.get(case, device)
    watched = (lambda: watch.call(kernel, case, spec)) if watch is not None else contextlib.nullcontext
    passed = {"x": inputs.x, "weight": inputs.weight, "bias": inputs.bias, "dy": dy}
    state = guards.input_state(passed)  # before the forward: neither call may change them
    with watched():
        saved = kernel(inputs.x, inputs.weight, inputs.bias, inputs.eps)
    grads, guarded = guards.guarded_grads(inputs.x, inputs.weight, inputs.bias)
    # The backward may write only its gradients: x, dy, the parameters and the saved statistics are inputs.
    given = {**inputs.tensors(), "dy": dy_storage, **{k: v for k, v in saved.fields().items() if k != "y"}}
    before = guards.snapshot_inputs(given)
    with watched():
        kernel.backward(inputs.x, inputs.weight, inputs.bias, dy, saved, inputs.eps, out=grads)
        if device == "cuda":
            torch.cuda.synchronize()
    altered = guards.inputs_altered(state, passed)
    result.findings = guards.inspect(guarded) + guards.inputs_modified(before, given) + altered
    if any(f.kind in INPUT_KINDS for f in result.findings):
        oracle.forget()
    result.stat_dtype = kernel.stat_dtype(case.torch_dtype, device)
    result.errors = compare_backward.compare_grads(grads, ref, case.torch_dtype, result.stat_dtype)
    if keep_outputs:
        result.grads = grads
    return result
