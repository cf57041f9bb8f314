"""GPU memory: what a check needs, what the workers sharing a GPU may hold together, and an
out-of-memory told apart from a kernel's failure.

- **Estimate** (``check_estimate``): the device bytes a check needs at its peak, from its case
  (x, the outputs and statistics, the guards' canaried buffers and input snapshot, the float64
  oracle or its row chunks, the comparison's float64 temporaries, the outputs kept for the
  agreement matrix) and the kernel's own workspace (``NormKernel.workspace_bytes``). The formula
  is ``ESTIMATE_DOC`` below; tests/test_memory.py holds it against measured allocations.
- **Budget** (``harness.ledger.GpuLedger``): the workers of one GPU admit checks against one budget, by default
  the card's free memory when the run starts less a reserve (``--gpu-memory`` sets it). Each worker's
  entry counts what it holds between checks (its CUDA context and the caching allocator's
  reserved memory: cached oracle and kept outputs included) and, while a check runs, that
  check's estimate. A check that does not fit waits; one that fits nowhere beside others runs
  when no other check is running; a check retried after an out-of-memory runs alone.
- **Out of memory** (``is_oom``, ``requested_bytes``): an OOM is a resource event, recorded with
  the bytes asked for, the estimate and the budget, and retried once alone (harness.memory_watch).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

MIB, GIB = 2**20, 2**30
# A worker's CUDA context, library handles and loaded modules: memory outside the caching
# allocator that each process on a GPU holds.
CONTEXT_BYTES = 640 * MIB
# Left out of the default budget: compile caches, the allocator's rounding and fragmentation.
RESERVE_FRACTION, RESERVE_MIN = 0.05, 1 * GIB
# A GPU worker needs at least this much of the budget besides its context (the worker count).
WORKER_MIN_BYTES = 1 * GIB
FAKE_MEMORY_ENV = "NORMDIFF_FAKE_GPU_MEMORY"  # "FREE,TOTAL" bytes: the free memory the run start sees (tests)

OOM = "out of memory: "  # a skip reason's prefix: out of memory alone too (counted as *out of memory*)
TOO_BIG = "out of memory, not run: "  # a skip reason's prefix: the check cannot fit the budget

# -- sizes ------------------------------------------------------------------------------------
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6, "mib": 2**20,
          "g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12, "tib": 2**40}


def parse_size(text: str) -> int:
    """Bytes of ``24GiB``, ``40GB``, ``512MiB``, ``1.5TiB`` or a plain count."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = m and m.group(2).lower()
    if not m or unit not in _UNITS:
        raise ValueError(f"not a memory size: {text!r} (e.g. 24GiB, 40GB, 512MiB)")
    value = int(float(m.group(1)) * _UNITS[unit])
    if value <= 0:
        raise ValueError(f"a memory size must be positive: {text!r}")
    return value


def fmt(n: float | None) -> str:
    if n is None:
        return "-"
    if abs(n) >= GIB / 4:
        return f"{n / GIB:.2f} GiB"
    return f"{n / MIB:.0f} MiB" if abs(n) >= MIB else f"{n / 1024:.0f} KiB"


# -- the estimate -------------------------------------------------------------------------------
# Per element of the compared output, the float64 temporaries a comparison holds at once
# (harness.compare.compare: o, err, u, allowed, ratio, score and where()'s result; the
# rounding contract's and the agreement's as many again at most).
COMPARE_F64 = 10
# The float64 oracle while it is computed (harness/impls reference: x64, x - mean, its square, y).
ORACLE_F64 = 4
# A kernel that declares no workspace: a y of its own and two float32 copies of x (an eager
# composite upcasts, a compiled graph keeps float32 intermediates).
DEFAULT_WORKSPACE_F32 = 2
# The backward oracle: dx, x^, g and the allowances' per-element terms (harness.compare_backward).
BACKWARD_ORACLE_F64 = 5
BITS_BYTES_PER_ELEMENT = 25  # bit_diffs: two int64 views, a bool mask, and 8 B more where they differ
FIXED_BYTES = 1 * MIB  # scalars, row statistics and the allocator's rounding of many small tensors
PROJECT_WORKSPACE = 16 * MIB  # a project kernel's split partials and launch scratch, besides 64 B a row
SMALL_TEST_BYTES = 64 * MIB  # a check on fixed small inputs (bad input, output shapes, offline compile)
FUZZ_BYTES = 256 * MIB  # a drawn case (harness/test_fuzz: at most 2**16 elements each)

ESTIMATE_DOC = """\
E = rows x N elements, S = rows x (N + pad) stored, B = the dtype's bytes, R = rows, C = the
elements judged at once (E, or a row chunk of ORACLE_CHUNK_ELEMENTS beyond ORACLE_WHOLE_ELEMENTS);
peers = the run's other kernels of the op (the agreement matrix keeps their outputs; whole oracles only).
  inputs     S*B (x) + 2*N*B (weight, bias); backward: + S*B (dy) + S*B (the guard's snapshot of dy)
  snapshot   S*B + 2*N*B (guards.snapshot_inputs)
  outputs    R*(N+16)*B + 8*R (canaried y or dx, mean, rstd) + the kernel's workspace
             (declared, else a project kernel 16 MiB + 64*R; any other E*B + 2*4*E + 8*R: a y of
             its own, float32 copies of x)
  oracle     8*E + 16*R kept (whole oracles); backward: 5*8*E (dx, x^, g, the allowances' terms)
  fixed      1 MiB (scalars, row statistics, the allocator's rounding)
  work       max(ORACLE_F64, COMPARE_F64) * 8*C (float64 temporaries of making or judging)
  kept       per peer R*(N+16)*B + 8*R (+ 8*E for a rounding contract's extra in 16-bit with a
             weight; backward: dx, dw, db), + 8*E (the agreement's allowance)
determinism and batch invariance: inputs + 3 x outputs + workspace + S*B (a batch's copy of x)
  + 25*E (the bit comparison: two int64 views, a mask, a distance); backward: + outputs (the saved
  forward) + 8*S (dy drawn in float64); drawn cases FUZZ_BYTES; small checks SMALL_TEST_BYTES.
"""


@dataclass
class Estimate:
    total: int
    parts: dict[str, int] = field(default_factory=dict)

    def describe(self) -> str:
        return ", ".join(f"{k} {fmt(v)}" for k, v in self.parts.items() if v)


def _whole_and_chunk(case) -> tuple[bool, int]:
    from harness.runner import ORACLE_CHUNK_ELEMENTS, ORACLE_WHOLE_ELEMENTS

    e = case.rows * case.n
    if e > ORACLE_WHOLE_ELEMENTS:
        return False, max(1, ORACLE_CHUNK_ELEMENTS // case.n) * case.n
    return True, e


def check_estimate(test: str, case, kernel, peers=(), device: str = "cuda") -> Estimate:
    """The device bytes check ``test`` of ``kernel`` on ``case`` needs at its peak (ESTIMATE_DOC);
    ``peers``: the run's other kernels of the op, whose outputs the agreement matrix may keep."""
    if case is None or test in ("test_rejects_bad_input", "test_empty_batch_returns_empty_outputs",
                                "test_output_shapes_follow_input", "test_compiles_offline"):
        return Estimate(SMALL_TEST_BYTES, {"fixed": SMALL_TEST_BYTES})
    if test in ("test_fuzz", "test_fuzz_backward"):
        return Estimate(FUZZ_BYTES, {"fixed": FUZZ_BYTES})
    b, n, r = case.torch_dtype.itemsize, case.n, case.rows
    e, s = r * n, r * (n + case.row_pad)
    backward = test.startswith("test_backward")
    inputs = s * b + 2 * n * b + (2 * s * b if backward else 0)
    snapshot = s * b + 2 * n * b
    outputs = r * (n + 16) * b + 8 * r
    workspace = workspace_bytes(kernel, case, device)
    parts = {"inputs": inputs, "fixed": FIXED_BYTES}
    if test in ("test_deterministic", "test_backward_deterministic", "test_batch_invariant",
                "test_backward_batch_invariant"):
        # three calls' outputs, a batch's copy of x, and the bit comparison (harness.properties.bit_diffs:
        # both outputs as int64, their mask, the ordered distance where they differ)
        parts.update(outputs=3 * outputs, workspace=workspace, copy=s * b, bits=BITS_BYTES_PER_ELEMENT * e)
        if backward:
            parts.update({"saved forward": outputs, "dy draw": 8 * s})
        return Estimate(sum(parts.values()), parts)
    whole, chunk = _whole_and_chunk(case)
    oracle = (BACKWARD_ORACLE_F64 * 8 * e if backward else 8 * e + 16 * r) if whole else 0
    work = max(ORACLE_F64, COMPARE_F64) * 8 * chunk + (0 if whole else 8 * chunk + 16 * chunk // n)
    kept = sum(_kept_by(p, case, outputs, backward) for p in peers) + 8 * e if whole else 0
    parts.update(snapshot=snapshot, outputs=outputs, workspace=workspace, oracle=oracle, work=work, kept=kept)
    if backward:
        parts["saved forward"] = outputs
    return Estimate(sum(parts.values()), parts)


def _kept_by(peer, case, outputs: int, backward: bool) -> int:
    """What the agreement matrix keeps of another kernel that ran the case: its outputs, and
    y's float64 extra allowance where its rounding contract has one."""
    e = case.rows * case.n
    if backward:
        return outputs + 8 * case.n * 2 if getattr(peer, "has_backward", True) else 0
    extra = (getattr(peer, "rounding", "once") != "once" and case.dtype != "float32" and case.has_weight)
    return outputs + (8 * e if extra else 0)


def workspace_bytes(kernel, case, device: str = "cuda") -> int:
    """The kernel's workspace for the case: what it declares (an optional ``workspace_bytes(spec)``
    method, for a kernel with large scratch buffers), else by kind. A project kernel writes into
    the outputs it is given and keeps only per-row partials; any other (eager, apex, a compiled
    graph, an outside backend) allocates its own y and statistics and may upcast x to float32."""
    declared = getattr(kernel, "workspace_bytes", None)
    if declared is not None:
        got = declared(case.spec(device))
        if got is not None:
            return int(got)
    e, r = case.rows * case.n, case.rows
    if getattr(kernel, "project", False):
        return PROJECT_WORKSPACE + 64 * r
    return e * case.torch_dtype.itemsize + DEFAULT_WORKSPACE_F32 * 4 * e + 8 * r


# -- out of memory ------------------------------------------------------------------------------
def is_oom(exc: BaseException | None) -> bool:
    """Whether an exception (or one it was raised from) is a device out-of-memory."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(exc, torch.OutOfMemoryError):
            return True
        if is_oom_text(str(exc)):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def is_oom_text(text: str | None) -> bool:
    return bool(text) and "out of memory" in text.lower()


_ASKED = re.compile(r"[Tt]ried to allocate ([0-9.]+) ?([KMGT]i?B|bytes)")


def requested_bytes(message: str) -> int | None:
    """The bytes an allocation asked for, from torch's out-of-memory message."""
    m = _ASKED.search(message or "")
    if not m:
        return None
    unit = {"bytes": "b"}.get(m.group(2), m.group(2)).lower()
    unit = unit if unit.endswith("ib") or unit == "b" else unit[0] + "ib"  # torch prints GiB as "GiB"
    return int(float(m.group(1)) * _UNITS[unit])


def sticky_oom_event(attempt: str, message: str, worker: str) -> dict:
    """The record of an out-of-memory that broke a worker's CUDA context (read from its note)."""
    return {"attempt": attempt, "message": message[:400], "asked": requested_bytes(message), "worker": worker}


# -- the card -------------------------------------------------------------------------------------
def measure_gpus(tokens: list[str]) -> dict[str, tuple[int, int]]:
    """GPU token -> (free, total) bytes, measured in one short-lived process (the controller holds
    no CUDA context of its own). ``NORMDIFF_FAKE_GPU_MEMORY=FREE,TOTAL`` stands in for every GPU."""
    fake = os.environ.get(FAKE_MEMORY_ENV)
    if fake:
        free, total = (parse_size(v) for v in fake.split(","))
        return {t: (free, total) for t in tokens}
    from harness import devmem

    card = devmem.simulated()
    if card is not None:
        return {t: card.mem_get_info() for t in tokens}
    code = ("import torch\nfor i in range(torch.cuda.device_count()):\n"
            "    f, t = torch.cuda.mem_get_info(i); print(f, t)")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(tokens)}
    try:
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180)
        rows = [tuple(int(v) for v in line.split()) for line in done.stdout.splitlines() if line.strip()]
    except (subprocess.SubprocessError, ValueError, OSError):
        return {}
    return {t: row for t, row in zip(tokens, rows)}


def default_budget(free: int, asked: int | None) -> int:
    """The budget of one GPU: ``--gpu-memory`` (``asked``) or the free memory, less the reserve."""
    base = asked if asked else free
    return max(0, base - max(RESERVE_MIN, int(RESERVE_FRACTION * base)))


def gpu_budgets(asked: str | None, gpus: list[str]) -> dict[str, int]:
    """GPU token -> the bytes its workers may hold together (default_budget; ``asked``: --gpu-memory)."""
    import pytest

    try:
        size = parse_size(asked) if asked else None
    except ValueError as exc:
        raise pytest.UsageError(f"--gpu-memory: {exc}") from exc
    out = {}
    for token, (free, total) in (measure_gpus(gpus) if gpus else {}).items():
        if size and size > total:
            raise pytest.UsageError(f"--gpu-memory {asked} is more than GPU {token}'s {fmt(total)}")
        out[token] = default_budget(free, size)
    return out


def workers_for(budget: int, wanted: int) -> int:
    """How many workers one GPU takes: ``wanted`` (its share of the cores), fewer where the budget
    cannot give each its context and WORKER_MIN_BYTES."""
    return max(1, min(wanted, budget // (CONTEXT_BYTES + WORKER_MIN_BYTES)))
