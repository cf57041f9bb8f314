"""The device bytes a check needs at its peak (``check_estimate``), from its case, its kernel and
the run's other kernels of the op: what the check allocates, and what the worker still holds
from the case's earlier checks (the oracle's cache and the outputs the agreement matrix keeps),
which its measured peak (torch.cuda.max_memory_allocated) includes. The formula is ESTIMATE_DOC;
tests/test_memory.py holds it against allocations measured on the CPU, tests/test_estimates.py
against the peaks of a GPU run (tests/data/peaks/).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

from harness.report.outcomes import fmt

from harness.judging.family import family

MIB = 2**20
# Per element judged at once, the float64 temporaries a comparison holds together
# (harness.judging.compare.compare: o, err, u, allowed, ratio, score and where()'s results).
COMPARE_F64 = 10
# Per element of the bit comparison (harness.judging.properties.bit_diffs): both outputs as int64 and
# their mask; where they differ, both ordered bit patterns, a where()'s mask and the distance.
BITS_BYTES_PER_ELEMENT = 42
# A worker's own allocations beyond any case: kernels' persistent buffers and cached plans,
# library workspaces (21 MiB at most in the H100 run of tests/data/peaks/).
WORKER_BYTES = 32 * MIB
PROJECT_WORKSPACE = 16 * MIB  # a project kernel's split partials and launch scratch, besides 64 B a row
SMALL_INPUT_BYTES = 16 * MIB  # a check on fixed small inputs (bad input, output shapes, offline compile)
SMALL_SHAPE = (4, 64)  # those inputs' shape (harness/test_bad_input.py), for the kernel's workspace
# The largest case harness/test_fuzz.py draws on the full profile: 4,000,000 elements in rows of
# up to 70,000 (at most 300 rows), 64 elements of padding a row, float32.
FUZZ_SHAPE, FUZZ_PAD = (300, 13334), 64
# What a check declares it needs (@pytest.mark.needs on each check function): "oracle" and
# "backward" (its catalogue case against the oracle), the property checks (PROPERTY_NEEDS), "drawn"
# and "drawn_backward" (the hypothesis-drawn cases), "small" (fixed small inputs). Its family
# (harness.judging.family) says what such a check of its kernels allocates.
NEEDS = ("oracle", "backward", "determinism", "batch", "backward_determinism", "backward_batch", "drawn",
         "drawn_backward", "small")
PROPERTY_NEEDS = ("determinism", "batch", "backward_determinism", "backward_batch")

ESTIMATE_DOC = """\
E = rows x N elements, S = rows x (N + pad) stored, B = the dtype's bytes, R = rows, C = the
elements judged at once (E, or a row chunk of ORACLE_CHUNK_ELEMENTS beyond ORACLE_WHOLE_ELEMENTS),
X = S*B + 2*N*B (x with its padding, weight and bias), O = R*(N+16)*B + 8*R (a canaried y or dx
and the statistics), T = the statistics dtypes of the kernels judged on the case, W = the
kernel's workspace: declared (workspace_bytes(spec)), else a project kernel's E*B + 16 MiB + 64*R
(the fresh y its host fast path plans on, split partials), any other's E*B + 8*E + 8*R (a y of
its own, float32 copies of x). Every check: + 32 MiB (what a worker holds beyond any case).
  oracle check   X (the snapshot), O, W, 10*8*C (the comparison's float64 temporaries);
                 chunked + X (x) + 8*C + 16*C/N (a chunk's oracle); whole + the case's cache:
  cache          X + 8*E + 16*R (the oracle) + 8*E + 16*R*T (the agreement's allowances) + per
                 peer O (+ 8*E where its rounding contract adds to y's allowance, and 8*E for
                 the kernel's own such addition)
  backward       + the saved forward E*B + 8*R, the snapshot of dy and the statistics S*B + 8*R;
                 cache X + S*B (dy) + 8*E each for dx, y, x^, dy and g (with a weight) + 16*N
                 + 16*R (rstd, cond) + (16*E + 32*N)*T (floors, allowances); per peer with a backward O + 16*N
  determinism    X + 3 calls' outputs E*B + 8*R (2 for a kernel outside the project) + max(W,
                 42*E: the bit comparison, both outputs as int64 and, where they differ, their
                 ordered patterns); backward: 2 calls' gradients (+ 2*N*B), + S*B (dy) + E*B + 8*R
                 (the saved forward)
  batch          as determinism with 2 full calls, + 4*8*N x the largest batch (its rows in
                 float64 at most) + 16*N, + S*B (x's copy; backward dy's too) where rows are padded
  held           a property check on a case the oracle checks also run (a catalogue case) may
                 follow them in its worker, their cache still held: + the cache with every
                 kernel of the op (the check's included) kept. This and the oracle check's
                 cache are the worst case, for what is decided before a run (--min-check-memory,
                 the peaks data); admission counts the cache as the worker holds it (as_held):
                 H = the bytes its caches hold when the check is admitted; a property check + H
                 (it adds nothing to them), an oracle check + min(the worst case, H + the
                 cache of a first kernel on the case), any other check + H
  drawn cases    the oracle check of the largest draw (FUZZ_SHAPE + FUZZ_PAD, float32), no peers
  fused          properties as the plain ones, with x's and residual's buffers three times and a
                 catalogue case's oracle cache held; drawn cases the fused oracle check of the
                 largest draw (as the plain draws, with a float32 residual)
  small checks   16 MiB + the kernel's workspace at 4 x 64
"""


@dataclass
class Estimate:
    total: int
    parts: dict[str, int] = field(default_factory=dict)

    def describe(self) -> str:
        return ", ".join(f"{k} {fmt(v)}" for k, v in self.parts.items() if v)


def _sizes(case):
    b, n, r = case.torch_dtype.itemsize, case.n, case.rows
    return b, n, r, r * n, r * (n + case.row_pad)


def _outputs(case) -> int:
    b, n, r, _, _ = _sizes(case)
    return r * (n + 16) * b + 8 * r


def _whole_and_chunk(case) -> tuple[bool, int]:
    from harness.judging.runner import ORACLE_CHUNK_ELEMENTS, ORACLE_WHOLE_ELEMENTS

    e = case.rows * case.n
    if e > ORACLE_WHOLE_ELEMENTS:
        return False, max(1, ORACLE_CHUNK_ELEMENTS // case.n) * case.n
    return True, e


def check_estimate(need: str, case, kernel, peers=(), device: str = "cuda") -> Estimate:
    """The device bytes a check of kernel on ``case`` that declares ``need`` (NEEDS) uses at its
    peak (ESTIMATE_DOC), as the kernel's family counts them; ``peers``: the run's other kernels of
    the op, whose outputs the agreement matrix may keep."""
    if need not in NEEDS:
        raise ValueError(f"a check declares the need {need!r}; known: {', '.join(NEEDS)}")
    parts = {"worker": WORKER_BYTES}
    if need == "small" or (case is None and not need.startswith("drawn")):
        from harness.judging.cases import Case

        small = Case(kernel.op, "float32", SMALL_SHAPE)
        parts.update(inputs=SMALL_INPUT_BYTES, workspace=workspace_bytes(kernel, small, device))
    else:
        parts.update(family(kernel.family).estimate(need, case, kernel, peers, device))
    return Estimate(sum(parts.values()), parts)


def plain_parts(need: str, case, kernel, peers, device: str) -> dict[str, int]:
    """The plain family's checks (harness.families.PlainFamily.estimate)."""
    if need in ("drawn", "drawn_backward"):
        from harness.judging.cases import Case

        backward = need == "drawn_backward"
        drawn = Case(kernel.op, "float32", FUZZ_SHAPE, row_pad=FUZZ_PAD, dy_dist="normal" if backward else None)
        return _oracle_check(backward, drawn, kernel, (), device)
    if need in PROPERTY_NEEDS:
        parts = _property_check(need, case, kernel, device)
        if held_after_oracle_checks(need, case):
            parts["held"] = held_bytes(need.startswith("backward"), case, (kernel, *peers), device)
        return parts
    return _oracle_check(need == "backward", case, kernel, peers, device)


def fused_parts(need: str, case, kernel, peers, device: str) -> dict[str, int]:
    """The fused family's checks (harness.families.FusedFamily.estimate)."""
    if need == "drawn":
        from harness.judging.fused_cases import FusedCase

        return _fused_check(False, FusedCase(kernel.op, "float32", FUZZ_SHAPE, row_pad=FUZZ_PAD), kernel, device)
    if need in PROPERTY_NEEDS:
        return _fused_property_check(need, case, kernel, device)
    return _fused_check(need == "backward", case, kernel, device)


def _oracle_check(backward: bool, case, kernel, peers, device: str) -> dict[str, int]:
    """test_against_oracle or test_backward: what the check allocates, and (whole oracles) what
    the case's cache holds with every peer's outputs kept."""
    b, n, r, e, s = _sizes(case)
    whole, chunk = _whole_and_chunk(case)
    x = s * b + 2 * n * b
    parts = {"snapshot": x, "outputs": _outputs(case), "workspace": workspace_bytes(kernel, case, device),
             "work": COMPARE_F64 * 8 * chunk + (0 if whole else 8 * chunk + 16 * chunk // n)}
    if backward:
        parts.update({"saved forward": e * b + 8 * r, "dy snapshot": s * b + 8 * r})
    if whole:
        parts["extra"] = 8 * e if _adds_to_y(kernel, case) and not backward else 0
        parts["held"] = held_bytes(backward, case, peers, device, judged=(kernel,))
    else:
        parts["inputs"] = x
    return parts


def _fused_check(backward: bool, case, kernel, device: str) -> dict[str, int]:
    """test_fused_against_oracle or test_fused_backward (harness.judging.fused_runner): x's and
    residual's buffers three times (the case's, the call's copy, its snapshot), the float64
    oracle (the sum, the row normalised, y, the plain reference's temporaries), the outputs, the
    comparison; backward: dy, residual_out's gradient, the gradients, their snapshots and oracle."""
    b, n, r, e, s = _sizes(case)
    rb = case.residual_torch_dtype.itemsize if getattr(case, "residual_torch_dtype", None) else 0
    buffers = s * (b + rb) + 1024
    parts = {"inputs": 3 * buffers + 4 * n * b, "oracle": 5 * 8 * e + 32 * r,
             "outputs": r * (n + 16) * (b + max(rb, 4)) + 8 * r,
             "workspace": workspace_bytes(kernel, case, device) + 2 * 4 * e,
             "work": COMPARE_F64 * 8 * e}
    if backward:
        parts["backward"] = 3 * e * (b + rb) + 2 * (buffers + e * (b + rb)) + 10 * 8 * e
    return parts


def _fused_property_check(need: str, case, kernel, device: str) -> dict[str, int]:
    """harness/test_fused_properties.py (harness.judging.fused_properties): x's and residual's
    buffers, the case's and a fresh copy per call; two calls' outputs (backward: the saved forward
    and two calls' gradients, dy and residual_out's gradient); the bit comparison; batch
    invariance's batches, as the plain check's; a catalogue case may follow its oracle checks in
    its worker, their cache (the inputs, the float64 oracle) still held."""
    b, n, r, e, s = _sizes(case)
    rb = case.residual_torch_dtype.itemsize if case.residual_torch_dtype else 0
    buffers = s * (b + rb) + 1024
    made = e * ((1 if case.out_dtype else b) + max(rb, 4)) + 8 * r  # y, residual_out, the statistics
    backward = need.startswith("backward")
    parts = {"inputs": 3 * buffers + 4 * n * b, "outputs": (3 if backward else 2) * made,
             "compare": max(workspace_bytes(kernel, case, device), BITS_BYTES_PER_ELEMENT * e)}
    if backward:
        parts["backward"] = 3 * e * (b + rb) + 4 * n * b
    if need.endswith("batch"):
        from harness.judging.properties import BATCH_SIZES

        parts["batches"] = 4 * max(BATCH_SIZES + tuple(kernel.m_thresholds(case.spec(device)))) * n * 8 + 2 * 8 * n
        parts["copy"] = s * (b + rb) * (2 if backward else 1) if case.row_pad else 0
    else:
        parts["held"] = buffers + 3 * 8 * e
    return parts


def _property_check(need: str, case, kernel, device: str) -> dict[str, int]:
    """Determinism and batch invariance (harness.judging.properties): fresh inputs, the calls' outputs,
    then the bit comparison."""
    b, n, r, e, s = _sizes(case)
    backward = need.startswith("backward")
    calls = 3 if getattr(kernel, "project", False) and not backward else 2
    made = e * b + 8 * r + (2 * n * b if backward else 0)  # a call's outputs (or gradients)
    parts = {"inputs": s * b + 2 * n * b, "outputs": calls * made,
             "compare": max(workspace_bytes(kernel, case, device), BITS_BYTES_PER_ELEMENT * e)}
    if backward:
        parts.update({"dy": s * b, "saved forward": e * b + 8 * r})
    if need.endswith("batch"):
        from harness.judging.properties import BATCH_SIZES

        parts["batches"] = 4 * max(BATCH_SIZES + tuple(kernel.m_thresholds(case.spec(device)))) * n * 8 + 2 * 8 * n
        parts["copy"] = s * b * (2 if backward else 1) if case.row_pad else 0
    return parts


def held_after_oracle_checks(need: str, case) -> bool:
    """Whether a property check's case is one the oracle checks (test_against_oracle,
    test_backward) also run: its worker may run it right after them, their cache still held."""
    backward = need.startswith("backward")
    return case.id in _oracle_case_ids(backward)


@functools.lru_cache(maxsize=None)
def _oracle_case_ids(backward: bool) -> frozenset:
    from harness.judging.cases import backward_catalogue, catalogue

    make = backward_catalogue if backward else catalogue
    return frozenset(c.id for profile in ("quick", "full") for c in make(profile))


def held_bytes(backward: bool, case, kept_from, device: str = "cuda", judged=()) -> int:
    """What the case's cache holds once the kernels ``kept_from`` ran its oracle check: inputs,
    the oracle, the allowances per statistics dtype (of those kernels and ``judged``), and each
    kernel's kept outputs (_kept_by). A chunked oracle holds nothing beyond the inputs, which
    the check counts."""
    b, n, r, e, s = _sizes(case)
    whole, _ = _whole_and_chunk(case)
    if not whole:
        return 0
    kernels = [*kept_from, *judged]
    stats = len({k.stat_dtype(case.torch_dtype, device) for k in kernels}) or 1
    held = s * b + 2 * n * b + 8 * e + 16 * r  # inputs; the oracle's y, mean and rstd
    if backward:  # dy; the oracle's dx, dw, db, x^, dy, g, rstd, cond; dx's floor and allowance, dw's, db's
        held += s * b + 8 * e * (3 + case.has_weight) + 16 * n + 16 * r + stats * (2 * 8 * e + 32 * n)
    else:  # the agreement's allowances: y's, and the statistics' per statistics dtype
        held += 8 * e + stats * 16 * r
    return held + sum(_kept_by(k, case, _outputs(case), backward) for k in kept_from)


def as_held(est: Estimate, need: str, case, kernel, cached: int, device: str = "cuda") -> Estimate:
    """``est`` with its cache counted as the worker holds it when the check is admitted: ``cached``,
    the bytes its caches hold then (memory_watch.cache_bytes), in place of the worst case (the
    cache with every kernel of the op kept, whether or not this worker ran them). A property check
    adds nothing to the caches; an oracle check adds at most what a first kernel's check of the
    case leaves there (the inputs, the oracle, one statistics dtype's allowances: its own kept
    outputs are its "outputs" part); every other check adds nothing either (ESTIMATE_DOC, held)."""
    parts = dict(est.parts)
    worst = parts.pop("held", 0)
    if need.startswith("drawn") or case is None:  # a drawn case's own oracle; what is held comes beside it
        parts["held"] = worst + cached
    elif "held" in est.parts and need not in PROPERTY_NEEDS:
        first = held_bytes(need == "backward", case, (), device, judged=(kernel,))
        parts["held"] = min(worst, cached + first)
    else:
        parts["held"] = cached
    return Estimate(sum(parts.values()), parts)


def _adds_to_y(kernel, case) -> bool:
    """Whether the kernel's rounding contract adds a float64 term to y's allowance on the case
    (harness.judging.compare.rounding_allowance)."""
    return getattr(kernel, "rounding", "once") != "once" and case.dtype != "float32" and case.has_weight


def _kept_by(peer, case, outputs: int, backward: bool) -> int:
    """What the agreement matrix keeps of a kernel that ran the case: its outputs, and y's
    float64 extra allowance where its rounding contract has one; backward: dx, dw and db."""
    if backward:
        return outputs + 8 * case.n * 2 if getattr(peer, "has_backward", True) else 0
    return outputs + (8 * case.rows * case.n if _adds_to_y(peer, case) else 0)


def workspace_bytes(kernel, case, device: str = "cuda") -> int:
    """The kernel's workspace for the case: what it declares (an optional ``workspace_bytes(spec)``
    method, for a kernel with large scratch buffers), else by kind. A project kernel writes into
    the outputs it is given, keeps per-row partials, and its host fast path plans a signature's
    first call on a fresh y; any other (eager, apex, an outside backend) allocates its own y and
    statistics and may upcast x to float32."""
    declared = getattr(kernel, "workspace_bytes", None)
    if declared is not None:
        got = declared(case.spec(device))
        if got is not None:
            return int(got)
    b, _, r, e, _ = _sizes(case)
    if getattr(kernel, "project", False):
        return e * b + PROJECT_WORKSPACE + 64 * r
    return e * b + 2 * 4 * e + 8 * r
