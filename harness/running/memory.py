"""GPU memory: what a check needs, what the workers sharing a GPU may hold together, and an
out-of-memory told apart from a kernel's failure.

- **Estimate** (``check_estimate``): the device bytes a check needs at its peak, from its case
  (x, the outputs and statistics, the guards' canaried buffers and input snapshot, the float64
  oracle or its row chunks, the comparison's float64 temporaries, the outputs kept for the
  agreement matrix, what the worker still holds of the case's earlier checks) and the kernel's
  own workspace (``NormKernel.workspace_bytes``): harness.running.estimate, whose ``ESTIMATE_DOC`` is the
  formula; tests/test_memory.py and tests/test_estimates.py hold it against measured allocations.
- **Budget** (``harness.running.ledger.GpuLedger``): the workers of one GPU admit checks against one budget, by default
  the card's free memory when the run starts less a reserve (``--gpu-memory`` sets it). Each worker's
  entry counts what it holds between checks (its CUDA context and the caching allocator's
  reserved memory: cached oracle and kept outputs included) and, while a check runs, that
  check's estimate. A check that does not fit waits; one that fits nowhere beside others runs
  when no other check is running; a check retried after an out-of-memory runs alone.
- **Out of memory** (``is_oom``, ``requested_bytes``): an OOM is a resource event, recorded with
  the bytes asked for, the estimate and the budget, and retried once alone (harness.running.memory_watch).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from harness.report.outcomes import OOM, TOO_BIG, fmt  # noqa: F401 (the memory layer's words, the report's too)
from harness.running import devmem
from harness.running.devmem import CONTEXT_BYTES

MIB, GIB = 2**20, 2**30
# Left out of the default budget: compile caches, the allocator's rounding and fragmentation.
RESERVE_FRACTION, RESERVE_MIN = 0.05, 1 * GIB
# A GPU worker needs at least this much of the budget besides its context (the worker count).
WORKER_MIN_BYTES = 1 * GIB
FAKE_MEMORY_ENV = "NORMDIFF_FAKE_GPU_MEMORY"  # "FREE,TOTAL" bytes: the free memory the run start sees (tests)


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
