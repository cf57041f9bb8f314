"""Shrinking a failing case: fewer rows, then a shorter row, each candidate run through the same
check, keeping the smallest that still fails.

Rows first (1, 2, 3, then halvings of M), at the case's N; then N, from the catalogue's row lengths
in ascending order, within the N class the failure pattern names (harness/report/pattern.py: "not a
power of two", "not a multiple of k", "from N", "up to N"; read from the run's report where one is
given, else the class of the case's own N). The first that fails is the smallest of its kind."""
from __future__ import annotations

import re
from dataclasses import replace

from harness.judging import fused_runner, runner
from harness.judging.cases import backward_catalogue, catalogue
from harness.judging.fused_cases import fused_backward_catalogue, fused_catalogue
from harness.report.pattern import RAN, case_shape, rule
from harness.repro.target import Target


def pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def n_class(text: str | None, n: int):
    """(predicate, words) for the N class a pattern names, or the case's own N's class."""
    if text:
        if "not a power of two" in text:
            return (lambda v: not pow2(v)), text
        m = re.search(r"not a multiple of (\d+)", text)
        if m:
            k = int(m[1])
            return (lambda v: v % k != 0), text
        m = re.search(r"from (\d+)", text)
        if m and "fails at every N from" in text:
            lo = int(m[1])
            return (lambda v: v >= lo), text
        m = re.search(r"up to (\d+)", text)
        if m and "fails at every N up to" in text:
            hi = int(m[1])
            return (lambda v: v <= hi), text
    if not pow2(n):
        return (lambda v: not pow2(v)), "N not a power of two (the case's own N's class)"
    return (lambda v: True), "any N (no pattern, and the case's N a power of two)"


def report_rule(doc: dict | None, kernel: str, op: str) -> str | None:
    """The rule the report's failing N follow for this kernel and op, as its *Where it fails* says."""
    if not doc:
        return None
    passing, failing = set(), set()
    for r in doc.get("records", ()):
        shape = case_shape(r.get("case") or "")
        if r.get("kernel") != kernel or r.get("op") != op or shape is None or r.get("outcome") not in RAN:
            continue
        (failing if r["outcome"] == "failed" else passing).add(shape[-1])
    return rule(passing - failing, failing)


def catalogue_ns() -> list[int]:
    """Every row length of the catalogues (plain and fused, forward and backward, both profiles)."""
    ns = set()
    for profile in ("quick", "full"):
        for cases in (catalogue(profile), backward_catalogue(profile), fused_catalogue(profile),
                      fused_backward_catalogue(profile)):
            ns |= {c.n for c in cases}
    return sorted(ns)


def fails(t: Target, case) -> bool:
    """Whether the check fails on ``case``: out of tolerance, a guard finding, or an exception."""
    check = {(False, False): runner.check, (False, True): runner.check_backward,
             (True, False): fused_runner.check_fused, (True, True): fused_runner.check_fused_backward}
    try:
        result = check[(t.fused, t.backward)](t.kernel, case)
    except Exception:  # noqa: BLE001 (an exception in the kernel's call is a failure)
        return True
    return result.skipped is None and not result.ok


def shrink(t: Target, doc: dict | None = None) -> tuple[Target, list[str]]:
    """The smallest failing case found from ``t.case`` (the case itself when none smaller fails),
    and a line per candidate tried."""
    case, tried = t.case, []
    m, n = case.rows, case.n

    def attempt(candidate) -> bool:
        bad = fails(t, candidate)
        tried.append(f"{candidate.id}: {'fails' if bad else 'passes'}")
        return bad

    for rows in sorted({1, 2, 3, *(m >> k for k in range(1, 32))} - {0}):
        if rows >= m:
            break
        candidate = replace(case, shape=(rows, n))
        if attempt(candidate):
            case, m = candidate, rows
            break
    keep, words = n_class(report_rule(doc, t.kernel.name, t.kernel.op), n)
    tried.append(f"N class: {words}")
    for length in catalogue_ns():
        if length >= n:
            break
        if keep(length) and attempt(replace(case, shape=(*case.shape[:-1], length))):
            case = replace(case, shape=(*case.shape[:-1], length))
            break
    return replace(t, case=case), tried
