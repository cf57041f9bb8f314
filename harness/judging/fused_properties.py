"""Determinism and batch invariance of the fused family (impls.fused), bit for bit, with the plain
family's comparisons (harness.judging.properties): the same bit differences, the same batches
and sample rows, the same verdicts, on fused calls.

Each check runs in every write convention the kernel declares that the case accepts
(``property_pairs``). A call that writes its inputs (in place, out_y) gets a fresh copy of the
case's inputs, laid out as the case's (strides, adjacent views), so no call sees another's writes;
the rows of a smaller batch are gathered into buffers of their own.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from harness.judging import shapes
from harness.judging.cases import BF16, F32, FULL, QUICK, catalogue
from harness.judging.fused_cases import FUSED_BACKWARD_ROWS, FUSED_ROWS, FusedCase, FusedRows, accepted_writes
from harness.judging.fused_inputs import FusedInputs, make_fused_dy, make_fused_inputs
from harness.judging.fused_runner import guarded_fused_outputs, kernel_scale
from harness.judging.properties import BatchResult, BitDiff, batch_sizes, bit_diffs, compare_batches
from impls.base import rows_view
from impls.fused import FusedGrads, FusedOutputs

# The quick profile (the CPU, where Triton's interpreter runs each row's program in Python, and
# an interpreted backward costs about as much at 1 row as at 32, more with N): a few rows, batches
# of 1, 2, 7 and one past the case's rows; each kernel's declared M thresholds are added on both
# sides, as in the plain check.
BATCH_QUICK, BACKWARD_BATCH_QUICK = (16, 1000), (8, 129)
# Determinism on the quick profile: per op this many catalogue cases (by seed, of at most so many
# elements where the op has such), each in every declared convention.
DETERMINISM_QUICK, BACKWARD_DETERMINISM_QUICK = (2, 2**15), (1, 2**8)
_ALL = ("float32", "float16", "bfloat16")
_BATCH = "batch invariance"


def _batch_rows(backward: bool) -> tuple[FusedRows, ...]:
    """The batch-invariance cases: M x N normal rows of every fused op; on the full profile also a
    float32 residual under 16-bit x, Gemma's offset on both RMS ops and fp8 y on every fp8 op."""
    q, f = (BACKWARD_BATCH_QUICK if backward else BATCH_QUICK,), tuple((shapes.BATCH_M, n) for n in (1000, 4096, 8192))
    q_dtypes = F32 if backward else BF16  # the plain backward's quick choice: float32 dx shows a changed order most
    rows = [FusedRows(QUICK, _BATCH, q, q_dtypes), FusedRows(FULL, _BATCH, f, _ALL),
            FusedRows(QUICK, _BATCH, q, q_dtypes, ops=("rms_norm",), weight_offset=1.0),
            FusedRows(FULL, _BATCH, f, _ALL, ops=("rms_norm", "add_rms_norm"), weight_offset=1.0),
            FusedRows(FULL, _BATCH, f, ("bfloat16", "float16"), residual_dtype="float32")]
    if not backward:  # no backward through an fp8 y
        rows += [FusedRows(QUICK, _BATCH, q, q_dtypes, ops=("layer_norm",), out_dtype="e4m3", scale=1.0),
                 FusedRows(FULL, _BATCH, f, _ALL, ops=("rms_norm", "add_rms_norm", "layer_norm"), out_dtype="e4m3",
                           scale=1.0)]
    return tuple(replace(r, dy_dist="normal") for r in rows) if backward else tuple(rows)


def batch_cases(profile: str, backward: bool = False) -> list[FusedCase]:
    return catalogue(profile, _batch_rows(backward))


def determinism_cases(cases: list[FusedCase], profile: str, quick: tuple[int, int]) -> list[FusedCase]:
    """The catalogue cases the determinism checks run: on the full profile all of them but those
    beyond 2**31 elements; on the quick one ``quick`` = (how many, of at most how many elements)
    per op, by seed, larger ones only where an op has too few small ones."""
    if profile == "full":
        return [c for c in cases if c.rows * c.n < shapes.HUGE_ELEMENTS]
    per_op, most = quick
    ordered = sorted(cases, key=lambda c: (c.rows * c.n > most, c.seed, c.id))
    return [c for op in dict.fromkeys(c.op for c in cases) for c in [c for c in ordered if c.op == op][:per_op]]


def backward_writes(kernel, case: FusedCase) -> list[str]:
    """The conventions a backward check runs the case's forward in: the backward has none of its
    own, and reads of the forward's outputs only residual_out and the statistics; in place and
    out_y both leave residual_out in residual's storage, so "new" and the first of those two the
    kernel declares cover every place the backward's input can lie."""
    mine = [w for w in accepted_writes(case) if w in kernel.writes]
    return [w for w in mine if w == "new"] + [w for w in mine if w != "new"][:1]


def property_pairs(profile: str, kernels, wanted=lambda c: True) -> dict[str, list[tuple]]:
    """(case, kernel) per fixture of harness/test_fused_properties.py: each case in every write
    convention the kernel declares and the case accepts (backward_writes for the backward's
    checks); a case's kernels together."""
    forward = [c for c in catalogue(profile, FUSED_ROWS) if wanted(c)]
    backward = [c for c in catalogue(profile, FUSED_BACKWARD_ROWS) if wanted(c)]
    sets = {"fused_determinism_case": determinism_cases(forward, profile, DETERMINISM_QUICK),
            "fused_batch_case": batch_cases(profile),
            "fused_backward_determinism_case": determinism_cases(backward, profile, BACKWARD_DETERMINISM_QUICK),
            "fused_backward_batch_case": batch_cases(profile, backward=True)}
    pairs = {}
    for fixture, cases in sets.items():
        pick = backward_writes if "backward" in fixture else lambda k, c: [w for w in accepted_writes(c) if w in k.writes]
        pairs[fixture] = [(replace(c, write=w), k) for c in cases for k in kernels if k.op == c.op for w in pick(k, c)]
    return pairs


# -- the calls ------------------------------------------------------------------------------------
def _forward(kernel, case, inputs: FusedInputs, x=None, residual=None, out=None) -> FusedOutputs:
    """The kernel on the case's inputs (or on rows ``x`` and ``residual`` of them), with the case's
    parameters and write convention."""
    return kernel(inputs.x if x is None else x, inputs.residual if residual is None else residual, inputs.weight,
                  inputs.bias, inputs.eps, weight_offset=case.weight_offset, out_dtype=case.out_torch_dtype,
                  scale=kernel_scale(kernel, case), write=case.write, out=out)


def _backward(kernel, case, inputs: FusedInputs, x, residual, dy, d_res, saved: FusedOutputs) -> FusedGrads:
    return kernel.backward(x, residual, inputs.weight, inputs.bias, dy, saved, inputs.eps, d_residual_out=d_res,
                           weight_offset=case.weight_offset)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _rows(t: torch.Tensor | None, label: str) -> torch.Tensor | None:
    return None if t is None else rows_view(t, label, allow_copy=True)


# -- determinism ----------------------------------------------------------------------------------
def determinism(kernel, case: FusedCase, device: str) -> list[BitDiff]:
    """Two calls, each on a fresh copy of the case's inputs: the first into outputs given (poisoned,
    as the oracle check's), the second into outputs the kernel allocates; what differs."""
    pristine = make_fused_inputs(case, device)
    given = pristine.fresh()
    first = _forward(kernel, case, given, out=guarded_fused_outputs(kernel, case, given.x)[0])
    second = _forward(kernel, case, pristine.fresh())
    _sync(device)
    return bit_diffs(first, second)


def backward_determinism(kernel, case: FusedCase, device: str) -> list[BitDiff]:
    """One forward in the case's convention (on a copy: in place it leaves y in x's storage), then
    two backward calls on its residual_out and statistics with the inputs as they were; dx,
    dresidual, dw and db compared."""
    pristine = make_fused_inputs(case, device)
    dy, d_res = make_fused_dy(case, device)
    saved = _forward(kernel, case, pristine.fresh())
    first, second = (_backward(kernel, case, pristine, pristine.x, pristine.residual, dy, d_res, saved)
                     for _ in range(2))
    _sync(device)
    return bit_diffs(first, second)


# -- batch invariance -----------------------------------------------------------------------------
def batch_invariance(kernel, case: FusedCase, device: str, quick: bool) -> BatchResult:
    """Sample rows recomputed inside batches of other sizes (harness.judging.properties
    .compare_batches): the whole case on a fresh copy of its inputs, a batch on its rows of x and
    residual gathered; y, residual_out and the statistics compared bit for bit."""
    pristine = make_fused_inputs(case, device)
    x, residual = _rows(pristine.x, "x"), _rows(pristine.residual, "residual")

    def call(idx):
        if idx is None:
            return _forward(kernel, case, pristine.fresh())
        return _forward(kernel, case, pristine, x[idx].contiguous(), None if residual is None else residual[idx].contiguous())

    return compare_batches(x.shape[0], _sizes(kernel, case, device, quick), call)


def backward_batch_invariance(kernel, case: FusedCase, device: str, quick: bool) -> BatchResult:
    """dx and dresidual of sample rows in batches of other sizes (dw and db are sums over the
    batch): one forward of the whole case in its convention, then the backward of the gathered
    rows of x, residual, dy, residual_out's gradient and the saved outputs."""
    pristine = make_fused_inputs(case, device)
    x, residual = _rows(pristine.x, "x"), _rows(pristine.residual, "residual")
    dy, d_res = (_rows(t, label) for t, label in zip(make_fused_dy(case, device), ("dy", "d_residual_out")))
    saved = _forward(kernel, case, pristine.fresh())
    pick = lambda t, idx: None if t is None else t[idx].contiguous()  # noqa: E731

    def call(idx):
        if idx is None:
            got = _backward(kernel, case, pristine, x, residual, dy, d_res, saved)
        else:
            rows = FusedOutputs(**{k: t[idx] for k, t in saved.fields().items()})
            got = _backward(kernel, case, pristine, pick(x, idx), pick(residual, idx), pick(dy, idx),
                            pick(d_res, idx), rows)
        return FusedGrads(dx=got.dx, dresidual=got.dresidual)

    return compare_batches(x.shape[0], _sizes(kernel, case, device, quick), call)


def _sizes(kernel, case, device: str, quick: bool) -> list[int]:
    return batch_sizes(kernel, case, device, quick, base=(1, 2, 7, case.rows + 1) if quick else None)


__all__ = ["batch_cases", "determinism_cases", "property_pairs", "determinism", "backward_determinism",
           "batch_invariance", "backward_batch_invariance"]
