"""Two runs side by side: ``python -m harness.report --compare A B`` (run folders or JSON files,
plain or gzipped as in ``reports/<device>/``).

Correctness: the count of each outcome in A and B, then each check that changed, once, under its
most important change: new failures (with what failed and by how much), fixed ones, checks whose
error moved by more than a factor of 2, skips that appeared or vanished, other changes of outcome.
A gate: the command exits 1 when a check that passed in A fails or errs in B, and its last line
says so (like pytest-benchmark's --benchmark-compare-fail).

Speed (when both runs hold a benchmark.json), not gated: kernels whose median moved by more than
the runs' own repeatability (the largest move between the passes of ``--bench-repeat``, in either
run) or, without repeat passes, by more than DEFAULT_SPEED_MOVE.
"""
from __future__ import annotations

from pathlib import Path

from harness.report import find_report, load_report
from harness.report.benchmark_results import repeatability, results
from harness.report.failure import summary_line
from harness.report.markdown import table
from harness.report.outcomes import HARNESS_ERROR

ERROR_FACTOR = 2.0
# Errors under this fraction of the allowance are noise at the level of the last bits: a move
# between two such values is not reported.
ERROR_FLOOR = 0.01
DEFAULT_SPEED_MOVE = 0.10


def _load(path: Path, name: str) -> dict | None:
    """``name`` (or ``name.gz``) in a run folder, or beside a given JSON file; None when absent."""
    path = Path(path)
    if path.is_dir():
        path = path / name
    elif path.name.removesuffix(".gz") != name:
        path = path.with_name(name)
    return load_report(path) if find_report(path) else None


def _worst(rec: dict) -> float | None:
    ratios = [e.get("worst_ratio") for e in rec.get("errors") or () if e.get("worst_ratio") is not None]
    return max(ratios) if ratios else None


BAD = ("failed", HARNESS_ERROR)
OUTCOMES = ("passed", "failed", HARNESS_ERROR, "skipped", "out of memory", "known issue", "not run")


def _outcome(rec: dict | None) -> str | None:
    """A record's outcome; "not reached" for one collected but never run (a partial report)."""
    return None if rec is None else rec.get("outcome", "not reached")


def compare_checks(a: dict, b: dict) -> dict:
    """Each check that changed, once, under its most important change: new failures (failing or
    erring in B, not in A; ``regressions`` are those that passed in A), fixed, error moved, skips
    that appeared or vanished, other changes of outcome (every value empty when nothing changed)."""
    ra = {r["nodeid"]: r for r in a["records"]}
    rb = {r["nodeid"]: r for r in b["records"]}
    out = {key: [] for key in ("new_failures", "fixed", "error_moved", "skips_appeared", "skips_vanished", "other")}
    out["regressions"] = []
    for n, r in rb.items():
        was, now = _outcome(ra.get(n)), _outcome(r)
        if now in BAD and was not in BAD:
            out["new_failures"].append((n, was, now, summary_line(r, r.get("message", ""))))
            if was == "passed":
                out["regressions"].append(n)
        elif was in BAD and now == "passed":
            out["fixed"].append(n)
        elif was is not None and (moved := _moved(ra[n], r)) is not None:
            out["error_moved"].append((n, *moved))
        elif now == "skipped" and was not in (None, "skipped"):
            out["skips_appeared"].append((n, r.get("reason")))
        elif was == "skipped" and now != "skipped":
            out["skips_vanished"].append((n, ra[n].get("reason")))
        elif was is not None and was != now:
            out["other"].append((n, was, now))
    return out


def count_outcomes(a: dict, b: dict) -> dict:
    """outcome -> [checks in A, in B]; "only" -> [checks only in A, only in B]."""
    ra = {r["nodeid"]: r for r in a["records"]}
    rb = {r["nodeid"]: r for r in b["records"]}
    counts = {o: [sum(_outcome(r) == o for r in recs.values()) for recs in (ra, rb)] for o in (*OUTCOMES, "not reached")}
    return {**counts, "only": [len(set(ra) - set(rb)), len(set(rb) - set(ra))]}


def _moved(ra: dict, rb: dict) -> tuple[float, float] | None:
    """(A's worst error, B's) in allowed errors where it moved by more than ERROR_FACTOR."""
    wa, wb = _worst(ra), _worst(rb)
    if wa is None or wb is None or max(wa, wb) < ERROR_FLOOR:
        return None
    lo, hi = max(min(wa, wb), 1e-30), max(wa, wb)
    return (wa, wb) if hi / lo > ERROR_FACTOR else None


def _medians(doc: dict) -> tuple[dict, float]:
    """(kernel, group) -> first-pass median; and the largest move between passes in this run."""
    rows = results(doc)
    # A kernel timed with PDL on and off at decode has two rows in a group: named by launch.
    first = {(r["kernel"] + {True: " (PDL)", False: ""}.get(r.get("pdl"), ""), r["group"]): r["median_s"]
             for r in rows if r["repeat"] == 0}
    moves = [abs(x.get("max_move", 0.0)) for x in repeatability(rows)]
    return first, max(moves, default=0.0)


def compare_speed(a: dict, b: dict) -> dict:
    ma, ra = _medians(a)
    mb, rb = _medians(b)
    threshold = max(ra, rb) if (ra or rb) else DEFAULT_SPEED_MOVE
    how = (f"beyond the runs' own repeatability ({threshold:.1%}, the largest move between passes)"
           if (ra or rb) else f"beyond the default threshold of {DEFAULT_SPEED_MOVE:.0%} (no --bench-repeat passes)")
    moved = []
    for key in sorted(set(ma) & set(mb)):
        change = mb[key] / ma[key] - 1.0
        if abs(change) > threshold:
            moved.append((*key, ma[key], mb[key], change))
    return {"threshold": threshold, "how": how, "moved": moved, "compared": len(set(ma) & set(mb))}


def _name(nodeid: str) -> str:
    return f"`{nodeid.split('::')[-1]}`"


def render_checks(checks: dict, counts: dict) -> list[str]:
    lines = ["## Outcomes", ""]
    rows = [[o, a, b, f"{b - a:+d}" if b != a else ""] for o, (a, b) in counts.items()
            if o in OUTCOMES or (o != "only" and (a or b))]
    lines += table(["outcome", "A", "B", "change"], rows)
    only_a, only_b = counts["only"]
    if only_a or only_b:
        lines += ["", f"{only_a} check(s) only in A, {only_b} only in B."]
    lines.append("")

    def section(title, items, fmt):
        nonlocal lines
        lines += [f"## {title} ({len(items)})", ""]
        lines += [fmt(i) for i in items] or ["None."]
        lines.append("")
    was = lambda w: "not in A" if w is None else f"{w} in A"  # noqa: E731
    section("New failures", checks["new_failures"], lambda t: f"- {_name(t[0])} ({was(t[1])}, {t[2]} in B): {t[3]}")
    section("Fixed", checks["fixed"], lambda n: f"- {_name(n)}")
    section(f"Error moved by more than {ERROR_FACTOR:g}x (in allowed errors)", checks["error_moved"],
            lambda t: f"- {_name(t[0])}: {t[1]:.3g} -> {t[2]:.3g}")
    section("Skips that appeared", checks["skips_appeared"], lambda t: f"- {_name(t[0])}: {t[1]}")
    section("Skips that vanished", checks["skips_vanished"], lambda t: f"- {_name(t[0])}: was {t[1]}")
    section("Other changes of outcome", checks["other"], lambda t: f"- {_name(t[0])}: {t[1]} -> {t[2]}")
    return lines


def verdict(checks: dict | None) -> tuple[int, str]:
    """The exit status and the last line: non-zero when a check that passed in A fails or errs in B."""
    if checks is None:
        return 0, "No correctness to compare: nothing gated."
    bad = checks["regressions"]
    if bad:
        return 1, (f"FAILED: {len(bad)} check(s) that passed in A fail or err in B "
                   f"(first: {bad[0].split('::')[-1]}).")
    return 0, "OK: no check that passed in A fails or errs in B."


def render(a_name: str, b_name: str, checks: dict | None, speed: dict | None, counts: dict | None = None) -> str:
    lines = [f"# normdiff: {b_name} against {a_name}", "", f"A: {a_name}", f"B: {b_name}", ""]
    if checks is not None:
        lines += render_checks(checks, counts or {"only": [0, 0]})
    if speed is not None:
        lines += [f"## Speed: medians that moved {speed['how']} ({len(speed['moved'])} of {speed['compared']})", ""]
        lines += [f"- {k} on {g}: {ta * 1e6:.2f} -> {tb * 1e6:.2f} µs ({c:+.1%})" for k, g, ta, tb, c in speed["moved"]] \
            or ["None."]
        lines.append("")
    if checks is None and speed is None:
        lines.append("Neither run holds a correctness.json or a benchmark.json to compare.")
    lines.append(verdict(checks)[1])
    return "\n".join(lines)


def main(a: Path, b: Path) -> tuple[str, dict]:
    ca, cb = _load(a, "correctness.json"), _load(b, "correctness.json")
    ba, bb = _load(a, "benchmark.json"), _load(b, "benchmark.json")
    checks, counts = (compare_checks(ca, cb), count_outcomes(ca, cb)) if ca and cb else (None, None)
    speed = compare_speed(ba, bb) if ba and bb else None
    return render(str(a), str(b), checks, speed, counts), {"checks": checks, "counts": counts, "speed": speed,
                                                          "status": verdict(checks)[0]}
