"""The report's first screen after the summary: for each kernel that failed, where it fails (a
pass/fail grid by row length N and dtype, and the rule the failing N follow when a simple one
does), then its first failure with its size and reproduction. N is the last number of the case's
shape in the case id (``rms_norm-bfloat16-17x4000-normal``: N = 4000)."""
from __future__ import annotations

from collections import Counter, defaultdict

from harness.report.failure import LEGEND, error_table, repro_command, summary_line
from harness.report.markdown import table
from harness.report.outcomes import HARNESS_ERROR

MAX_COLUMNS = 16  # N columns per grid; more are split into further grids
RAN = ("passed", "failed", HARNESS_ERROR)
LEGEND_GRID = ("Each cell: checks passed / checks run for that N and dtype (the forward against the oracle, "
               "guards, determinism, batch invariance; skips not counted); **✗**: one failed; **E**: a harness "
               "error (not the kernel's); -: none ran.")


def case_shape(case_id: str) -> tuple[int, ...] | None:
    """The shape in a case id (op-dtype-shape-...), or None."""
    parts = case_id.split("-")
    if len(parts) < 3:
        return None
    try:
        return tuple(int(d) for d in parts[2].split("x"))
    except ValueError:
        return None


def _failing_kernels(records: list[dict]) -> list[tuple[str, str]]:
    seen = []
    for r in records:
        key = (r.get("kernel", "-"), r.get("op", "-"))
        if r.get("outcome") in ("failed", HARNESS_ERROR) and key not in seen:
            seen.append(key)
    return seen


def _cell(c: Counter) -> str:
    ran = sum(c[o] for o in RAN)
    if not ran:
        return "-"
    text = f"{c['passed']}/{ran}" + (" ✗" if c["failed"] else "") + (" E" if c[HARNESS_ERROR] else "")
    return f"**{text}**" if c["failed"] else text


def rule(passing: set[int], failing: set[int]) -> str | None:
    """A simple rule that separates the failing N from the passing ones, or None."""
    if len(passing) < 2 or len(failing) < 2:  # one N on a side is no pattern yet
        return None
    pow2 = lambda n: n > 0 and n & (n - 1) == 0  # noqa: E731
    if all(pow2(n) for n in passing) and not any(pow2(n) for n in failing):
        return "fails at every N that is not a power of two, passes at every power of two"
    for k in (1024, 512, 256, 128, 64, 32, 16, 8, 4, 2):
        if all(n % k == 0 for n in passing) and all(n % k for n in failing):
            return f"fails at every N that is not a multiple of {k}, passes at every multiple of {k}"
    if min(failing) > max(passing):
        return f"fails at every N from {min(failing)} (passes up to {max(passing)})"
    if max(failing) < min(passing):
        return f"fails at every N up to {max(failing)} (passes from {min(passing)})"
    return None


def render_grid(records: list[dict], kernel: str, op: str) -> list[str]:
    cells: dict[tuple[str, int], Counter] = defaultdict(Counter)
    for r in records:
        shape = case_shape(r.get("case") or "")
        if r.get("kernel") != kernel or r.get("op") != op or shape is None or r.get("outcome") not in RAN:
            continue
        row = r.get("dtype", "-") + (" backward" if "backward" in r.get("test", "") else "")
        cells[(row, shape[-1])][r["outcome"]] += 1
    if not cells:
        return []
    ns = sorted({n for _, n in cells})
    rows = sorted({row for row, _ in cells})
    lines = [f"**{kernel}** ({op}): pass/fail by N", ""]
    for start in range(0, len(ns), MAX_COLUMNS):
        part = ns[start:start + MAX_COLUMNS]
        lines += table(["dtype \\ N", *map(str, part)], [[row, *(_cell(cells[(row, n)]) for n in part)] for row in rows])
        lines.append("")
    failing = {n for (_, n), c in cells.items() if c["failed"]}
    passing = {n for (_, n), c in cells.items() if c["passed"]} - failing
    found = rule(passing, failing)
    if found:
        lines += [f"Pattern: {kernel} {found}.", ""]
    return lines


def render_first_failure(doc: dict, records: list[dict], kernel: str, op: str) -> list[str]:
    """The kernel's first failure in the report's order: its case and size, what failed, the
    errors' table with its legend, and the command that reproduces it."""
    first = next((r for r in records if r.get("kernel") == kernel and r.get("op") == op
                  and r.get("outcome") == "failed"), None)
    if first is None:
        return []
    shape = case_shape(first.get("case") or first.get("drawn_case") or "")
    about = [first.get("test"), shape and f"shape {'x'.join(map(str, shape))} (N = {shape[-1]})", first.get("dtype")]
    lines = [f"### First failure of {kernel}: `{first['nodeid'].split('::')[-1]}`", "",
             f"{', '.join(a for a in about if a)}: {summary_line(first, first.get('message', ''))}.", ""]
    rows = error_table(first)
    if rows:
        lines += rows + ["", LEGEND, ""]
    lines += ["Reproduce:", "", "```", repro_command(doc, first), "```", ""]
    return lines


def render(doc: dict, records: list[dict]) -> list[str]:
    """Under the summary: each failing kernel's grid, then each one's first failure (the
    *Failures* section below has them all)."""
    kernels = _failing_kernels(records)
    if not kernels:
        return []
    lines = ["", "### Where it fails", "", LEGEND_GRID, ""]
    for kernel, op in kernels:
        lines += render_grid(records, kernel, op)
    for kernel, op in kernels:
        lines += render_first_failure(doc, records, kernel, op)
    return lines
