"""Two runs side by side: ``python -m harness.report --compare A B`` (run folders or JSON files,
plain or gzipped as in ``reports/<device>/``).

Correctness: new failures and fixed ones, checks whose error moved by more than a factor of 2,
skips that appeared or vanished. Speed (when both runs hold a benchmark.json): kernels whose
median moved by more than the runs' own repeatability (the largest move between the passes of
``--bench-repeat``, in either run) or, without repeat passes, by more than DEFAULT_SPEED_MOVE.
"""
from __future__ import annotations

from pathlib import Path

from harness.report import find_report, load_report
from harness.report.benchmark_results import repeatability, results

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


def compare_checks(a: dict, b: dict) -> dict:
    ra = {r["nodeid"]: r for r in a["records"]}
    rb = {r["nodeid"]: r for r in b["records"]}
    failed = lambda r: r is not None and r.get("outcome") == "failed"  # noqa: E731
    out = {
        "new_failures": [n for n, r in rb.items() if failed(r) and not failed(ra.get(n))],
        "fixed": [n for n, r in ra.items() if failed(r) and (rb.get(n) or {}).get("outcome") == "passed"],
        "skips_appeared": [(n, r.get("reason")) for n, r in rb.items()
                           if r.get("outcome") == "skipped" and (ra.get(n) or {}).get("outcome") not in (None, "skipped")],
        "skips_vanished": [(n, ra[n].get("reason")) for n, r in rb.items()
                           if (ra.get(n) or {}).get("outcome") == "skipped" and r.get("outcome") not in (None, "skipped")],
        "error_moved": [],
    }
    for n in sorted(set(ra) & set(rb)):
        wa, wb = _worst(ra[n]), _worst(rb[n])
        if wa is None or wb is None or max(wa, wb) < ERROR_FLOOR:
            continue
        lo, hi = max(min(wa, wb), 1e-30), max(wa, wb)
        if hi / lo > ERROR_FACTOR:
            out["error_moved"].append((n, wa, wb))
    return out


def _medians(doc: dict) -> tuple[dict, float]:
    """(kernel, group) -> first-pass median; and the largest move between passes in this run."""
    rows = results(doc)
    first = {(r["kernel"], r["group"]): r["median_s"] for r in rows if r["repeat"] == 0}
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


def render(a_name: str, b_name: str, checks: dict | None, speed: dict | None) -> str:
    lines = [f"# normdiff: {b_name} against {a_name}", ""]
    if checks is not None:
        def section(title, items, fmt):
            nonlocal lines
            lines += [f"## {title} ({len(items)})", ""]
            lines += [fmt(i) for i in items] or ["None."]
            lines.append("")
        section("New failures", checks["new_failures"], lambda n: f"- `{n.split('::')[-1]}`")
        section("Fixed", checks["fixed"], lambda n: f"- `{n.split('::')[-1]}`")
        section(f"Error moved by more than {ERROR_FACTOR:g}x (in allowed errors)", checks["error_moved"],
                lambda t: f"- `{t[0].split('::')[-1]}`: {t[1]:.3g} -> {t[2]:.3g}")
        section("Skips that appeared", checks["skips_appeared"], lambda t: f"- `{t[0].split('::')[-1]}`: {t[1]}")
        section("Skips that vanished", checks["skips_vanished"], lambda t: f"- `{t[0].split('::')[-1]}`: was {t[1]}")
    if speed is not None:
        lines += [f"## Speed: medians that moved {speed['how']} ({len(speed['moved'])} of {speed['compared']})", ""]
        lines += [f"- {k} on {g}: {ta * 1e6:.2f} -> {tb * 1e6:.2f} µs ({c:+.1%})" for k, g, ta, tb, c in speed["moved"]] \
            or ["None."]
        lines.append("")
    if checks is None and speed is None:
        lines.append("Neither run holds a correctness.json or a benchmark.json to compare.")
    return "\n".join(lines)


def main(a: Path, b: Path) -> tuple[str, dict]:
    ca, cb = _load(a, "correctness.json"), _load(b, "correctness.json")
    ba, bb = _load(a, "benchmark.json"), _load(b, "benchmark.json")
    checks = compare_checks(ca, cb) if ca and cb else None
    speed = compare_speed(ba, bb) if ba and bb else None
    return render(str(a), str(b), checks, speed), {"checks": checks, "speed": speed}
