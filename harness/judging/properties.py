"""Properties a kernel's outputs must have beyond being within tolerance of the oracle, judged
bit for bit:

- **determinism**: two calls on identical inputs, into fresh outputs, give the same bits;
- **batch invariance**: a row's bits do not depend on how many other rows share the call, or
  where the row sits among them (LLM inference engines rely on it for reproducible sampling).

Both catch defects that stay within tolerance: a reduction order that changes from call to call
(atomics, a persistent grid) or with M (a dispatch by row count, a split chosen by M).
"""
from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field

import torch

from harness.judging import known_issues, shapes
from harness.judging.cases import Case
from harness.judging.inputs import make_dy, make_inputs
from impls import callpath
from impls.base import NormGrads, NormKernel, NormOutputs, UnsupportedCase, rows_view

# Batch sizes every kernel is checked at; each kernel's declared M thresholds add both sides.
BATCH_SIZES = (1, 2, 7, 64, 128, 129, 1024)
QUICK_BATCH_SIZES = (1, 2, 7, 64, 129)  # CPU: the interpreter runs every program in Python
SAMPLE_ROWS = 3  # rows of the case recomputed in each batch: first, middle, last
_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}  # 1: an fp8 y


@dataclass
class BitDiff:
    output: str
    differ: int  # elements whose bits differ
    numel: int
    max_ulps: int  # largest distance in units in the last place (ordered bit patterns)

    def summary(self) -> str:
        return f"{self.output}: {self.differ} of {self.numel} elements differ, by up to {self.max_ulps} ulp"


def bit_diffs(a: NormOutputs, b: NormOutputs) -> list[BitDiff]:
    """Outputs whose bits differ between two calls (NaN payloads included), with how much."""
    found = []
    for name, ta in a.fields().items():
        tb = getattr(b, name)
        ia = ta.contiguous().view(_INT[ta.element_size()]).long()
        ib = tb.contiguous().view(_INT[tb.element_size()]).long()
        differ = ia != ib
        if differ.any():
            found.append(BitDiff(name, int(differ.sum()), ta.numel(), int(_ordered(ia, ta).sub(_ordered(ib, tb)).abs().max())))
    return found


def _ordered(bits: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Bit patterns mapped so that adjacent floats are adjacent integers (for a ulp distance)."""
    top = 1 << (8 * like.element_size() - 1)
    return torch.where(bits < 0, -(bits + top), bits) if like.element_size() < 8 else bits


@contextlib.contextmanager
def judging(kernel: NormKernel, case: Case, device: str):
    """Around a property check's calls of ``kernel`` on ``case``: ``UnsupportedCase`` from a call
    is a skip with the kernel's reason (the case is valid input it cannot run), and an error on a
    case where the kernel declares a known issue (``NormKernel.known_issue``: a peer that cannot
    compile the case, say) is that issue, an expected failure: the property cannot be judged
    there. A declared issue whose calls run leaves the property judged as on any case (an issue
    about values says nothing about bits), and out-of-memory is left to the harness."""
    import pytest

    try:
        yield
    except UnsupportedCase as exc:
        pytest.skip(f"{kernel.name} cannot run {case.id}: {exc}")
    except Exception as exc:
        issue = None if isinstance(exc, torch.OutOfMemoryError) else known_issues.known_issue(kernel, case, device)
        if not issue:
            raise
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        pytest.xfail(f"known issue: {issue} [{type(exc).__name__}: {first}]")


# -- a property check, whole: its calls (``measure``) under ``judging``, then the verdict ------------
def check_determinism(record, kernel, case, device: str, measure, declared: str | None, what: str = "") -> None:
    """``measure(kernel, case, device)``'s bit differences judged (judge_determinism)."""
    with judging(kernel, case, device):
        diffs = measure(kernel, case, device)
    judge_determinism(record, diffs, declared, what)


def check_batch(record, kernel, case, device: str, measure, quick: bool, claim: bool | None, twin: str,
                what: str = "") -> None:
    """``measure(kernel, case, device, quick=...)``'s batches judged (judge_batch)."""
    with judging(kernel, case, device):
        result = measure(kernel, case, device, quick=quick)
    judge_batch(record, result, claim, kernel.name, twin, what)


# -- the verdicts, one for every family and pass ----------------------------------------------------
def judge_determinism(record, diffs: list[BitDiff], declared: str | None, what: str = "") -> None:
    """A determinism check's record (``record(**fields)``) and verdict: the same bits pass; a
    difference is a failure of the kind *nondeterministic*, or, where the kernel declares itself
    nondeterministic (``declared``: why), that known issue. ``what`` names the pass (" backward")."""
    import pytest

    record(deterministic=not diffs, bit_diffs=[d.__dict__ for d in diffs],
           **({"failure_kind": "nondeterministic"} if diffs and not declared else {}))
    found = "; ".join(d.summary() for d in diffs)
    if diffs and declared:
        pytest.xfail(f"declared nondeterministic ({declared}): {found}")
    assert not diffs, f"nondeterministic{what}: two calls on identical inputs differ: {found}"


def judge_batch(record, result: BatchResult, claim: bool | None, name: str, twin: str, what: str = "") -> None:
    """A batch-invariance check's record and verdict: not judged where the full call repeated
    already differs (``twin``, the determinism check, reports it); a change fails (*batch-variant*)
    where the kernel claims invariance (``claim``), and is measured and reported otherwise.
    ``what`` names what was compared ("dx " for a backward)."""
    import pytest

    if result.nondeterministic:
        pytest.skip(f"two calls on the full batch differ ({twin} reports it): batch invariance cannot be judged")
    record(batch_invariant=result.invariant, batch_sizes=result.sizes,
           batch_changes={str(m): v for m, v in result.changes.items()}, batch_claim=claim,
           **({"failure_kind": "batch-variant"} if not result.invariant and claim else {}))
    if claim:
        assert result.invariant, f"{what}batch-variant, though {name} claims batch invariance: {result.summary()}"


# -- determinism ----------------------------------------------------------------------------------
def determinism(kernel: NormKernel, case: Case, device: str) -> list[BitDiff]:
    """Calls on the case's inputs into fresh outputs; what differs from the first. The first is
    validated (its outputs given), the second takes the host fast path the first left behind
    (impls.fastpath), the third the native path the second recorded where the kernel has one
    (impls.native): each path is held to the validated call's bits as well."""
    inp = make_inputs(case, device)
    first = kernel(inp.x, inp.weight, inp.bias, inp.eps, out=kernel.allocate(inp.x))
    later = [kernel(inp.x, inp.weight, inp.bias, inp.eps)]
    if callpath.state(kernel)["native"]:
        later.append(kernel(inp.x, inp.weight, inp.bias, inp.eps))
    if device == "cuda":
        torch.cuda.synchronize()
    return [d for other in later for d in bit_diffs(first, other)]


def backward_determinism(kernel: NormKernel, case: Case, device: str) -> list[BitDiff]:
    """One forward, then two backward calls on its saved statistics and the case's dy, each into
    gradients the kernel allocates; what differs (dw and db reductions across programs are where
    nondeterminism usually enters: atomics, a split that changes per call)."""
    inp = make_inputs(case, device)
    dy, _ = make_dy(case, device)
    saved = kernel(inp.x, inp.weight, inp.bias, inp.eps)
    first = kernel.backward(inp.x, inp.weight, inp.bias, dy, saved, inp.eps)
    second = kernel.backward(inp.x, inp.weight, inp.bias, dy, saved, inp.eps)
    if device == "cuda":
        torch.cuda.synchronize()
    return bit_diffs(first, second)


# -- batch invariance -----------------------------------------------------------------------------
@dataclass
class BatchResult:
    sizes: list[int]
    changes: dict[int, list[str]] = field(default_factory=dict)  # batch size -> what differed
    nondeterministic: bool = False  # the full call gave other bits when repeated: not judged

    @property
    def invariant(self) -> bool:
        return not self.changes

    def summary(self) -> str:
        if self.invariant:
            return f"the same bits in batches of {', '.join(map(str, self.sizes))} rows"
        return "; ".join(f"M={m}: {', '.join(v)}" for m, v in sorted(self.changes.items()))


def batch_sizes(kernel: NormKernel, case: Case, device: str, quick: bool,
                base: tuple[int, ...] | None = None) -> list[int]:
    sizes = set(base or (QUICK_BATCH_SIZES if quick else BATCH_SIZES))
    for t in kernel.m_thresholds(case.spec(device)):
        sizes |= {t, t + 1}
    return sorted(s for s in sizes if s >= 1)


def batch_invariance(kernel: NormKernel, case: Case, device: str, quick: bool) -> BatchResult:
    """Sample rows of the case recomputed inside batches of other sizes, each row at a position
    that moves with the size (the other rows: the case's own rows around it, repeated where the
    case has fewer), compared bit for bit with the same rows in the case's full call."""
    inp = make_inputs(case, device)
    x = rows_view(inp.x, "x", allow_copy=True)

    def call(idx):  # the forward of rows idx (None: of every row)
        return kernel(x if idx is None else x[idx].contiguous(), inp.weight, inp.bias, inp.eps)

    return compare_batches(x.shape[0], batch_sizes(kernel, case, device, quick), call)


def backward_batch_invariance(kernel: NormKernel, case: Case, device: str, quick: bool) -> BatchResult:
    """batch_invariance of the backward's dx (dw and db are sums over the batch): one forward of
    the case for its saved statistics, then the backward of sample rows inside batches of other
    sizes (their x, dy and saved statistics gathered), dx compared bit for bit with the same rows
    of the backward of the whole case."""
    inp = make_inputs(case, device)
    x = rows_view(inp.x, "x", allow_copy=True)
    dy = rows_view(make_dy(case, device)[0], "dy", allow_copy=True)
    saved = kernel(x, inp.weight, inp.bias, inp.eps)

    def call(idx):  # dx of rows idx (None: of every row)
        if idx is None:
            return NormGrads(kernel.backward(x, inp.weight, inp.bias, dy, saved, inp.eps).dx)
        rows = NormOutputs(**{k: t[idx] for k, t in saved.fields().items()})
        return NormGrads(kernel.backward(x[idx].contiguous(), inp.weight, inp.bias, dy[idx].contiguous(), rows,
                                         inp.eps).dx)

    return compare_batches(x.shape[0], batch_sizes(kernel, case, device, quick), call)


def compare_batches(m: int, sizes: list[int], call) -> BatchResult:
    """The batches of batch_invariance: ``call(idx)`` computes rows idx (None: all m) and returns
    NormOutputs or NormGrads."""
    result = BatchResult(sizes)
    full = call(None)
    if bit_diffs(full, call(None)):  # a change would mean nothing
        result.nondeterministic = True
        return result
    rows = sorted({0, m // 2, m - 1})[:SAMPLE_ROWS]
    device = next(iter(full.fields().values())).device
    for size in result.sizes:
        # As many sample rows per batch as fit, each at a position that moves with the size.
        for group in (rows[i:i + size] for i in range(0, len(rows), size)):
            idx = (torch.arange(size, device=device) - size // 2 + group[0]) % m  # the rows around the first
            where = {}
            for row in group:
                pos = (row * 7 + size) % size
                while pos in where.values():
                    pos = (pos + 1) % size
                where[row] = pos
                idx[pos] = row
            part = call(idx)
            pos, src = list(where.values()), list(where)
            got = type(part)(**{k: t[pos] for k, t in part.fields().items()})
            want = type(full)(**{k: t[src] for k, t in full.fields().items()})
            for d in bit_diffs(got, want):
                result.changes.setdefault(size, [])
                if d.output not in result.changes[size]:
                    result.changes[size].append(d.output)
    return result


def batch_cases(profile: str) -> list[Case]:
    """The cases of the batch-invariance check: M x N of plain normal rows, both ops."""
    full = profile == "full"
    dtypes = ("float32", "float16", "bfloat16") if full else ("float32", "bfloat16")
    m = shapes.BATCH_M if full else shapes.BATCH_M_QUICK
    return [Case(op=op, dtype=dt, shape=(m, n), tags=("batch invariance",))
            for op in ("rms_norm", "layer_norm") for dt in dtypes
            for n in (shapes.BATCH_N if full else shapes.BATCH_N_QUICK)]


def backward_batch_cases(profile: str) -> list[Case]:
    """The batch-invariance cases with a standard normal dy: the backward's (the quick profile's
    in float32 only, where a changed order of a row's sums shows in dx's bits most often: an
    interpreted backward of the case and its batches took 7 s a kernel)."""
    return [dataclasses.replace(c, dy_dist="normal") for c in batch_cases(profile)
            if profile == "full" or c.dtype == "float32"]


def determinism_cases(cases: list[Case], profile: str) -> list[Case]:
    """The catalogue cases the determinism check runs: all of them in the full profile but those
    beyond 2**31 elements; in the quick one (the CPU, where an interpreted call is slow) a fixed
    sample of the smaller ones."""
    if profile == "full":  # not beyond 2**31 elements: two calls' outputs compared bit by bit take tens of GB
        return [c for c in cases if c.rows * c.n < shapes.HUGE_ELEMENTS]
    return [c for c in cases if c.seed % shapes.DETERMINISM_EVERY_QUICK == 0
            and c.rows * c.n <= shapes.DETERMINISM_MAX_ELEMENTS_QUICK]


__all__ = ["BitDiff", "BatchResult", "bit_diffs", "judging", "judge_determinism", "judge_batch", "compare_batches", "determinism", "backward_determinism", "batch_invariance", "backward_batch_invariance",
           "batch_cases", "backward_batch_cases", "determinism_cases"]
