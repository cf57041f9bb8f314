"""The words a check's record and the reports share: outcomes and the skip reasons' prefixes the
report counts apart, and how a size in bytes is written. The running layer writes them, the report
reads them (so the report imports nothing of the layers that run checks)."""
from __future__ import annotations

MIB, GIB = 2**20, 2**30

HARNESS_ERROR = "harness error"  # an outcome: the harness failed around a check (harness.running.attribution)
OOM = "out of memory: "  # a skip reason's prefix: out of memory alone too (counted as *out of memory*)
TOO_BIG = "out of memory, not run: "  # a skip reason's prefix: the check cannot fit the budget


def fmt(n: float | None) -> str:
    """A size in bytes, as the reports and messages write it."""
    if n is None:
        return "-"
    if abs(n) >= GIB / 4:
        return f"{n / GIB:.2f} GiB"
    return f"{n / MIB:.0f} MiB" if abs(n) >= MIB else f"{n / 1024:.0f} KiB"
