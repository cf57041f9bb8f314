"""The correctness report's section on the fused family (impls.fused): what each fused kernel
declares, which the oracle and the guards followed in its checks (the sum its statistics are
taken on, its write conventions, its weight offsets and fp8 outputs, its scale convention and
what a NaN becomes), with the source each declaration cites."""
from __future__ import annotations

from collections import Counter


def render(records: list[dict], table) -> list[str]:
    declared: dict[tuple[str, str], dict] = {}
    for r in records:
        if r.get("declaration"):
            declared.setdefault((r["kernel"], r["op"]), r["declaration"])
    if not declared:
        return []
    lines = ["", "## Fused kernels: what the oracle followed", "",
             "Each fused kernel's declarations (impls/fused.py), as its checks judged it: the oracle normalises the "
             "sum its statistics are declared on, the guards allow only the writes its convention names.", ""]
    rows = []
    for (kernel, op), d in sorted(declared.items()):
        rows.append([kernel, op, ", ".join(d["writes"]), d["stats_on"].replace("_", " "),
                     ", ".join(f"{o:g}" for o in d["weight_offsets"]), ", ".join(d["out_dtypes"]),
                     f"{d['scale_convention']}; NaN -> {d['fp8_nan']}", ", ".join(d["residual_dtypes"]),
                     d.get("source") or ""])
    lines += table(["kernel", "op", "writes", "statistics on", "weight offsets", "y dtypes", "fp8 scale; NaN",
                    "residual dtypes", "source"], rows)
    return lines


def _ran(r: dict) -> bool:
    return r.get("outcome") in ("passed", "failed", "xfailed", "xpassed")


def _skip_kind(r: dict, unavailable: dict[str, str]) -> str:
    """Why a check was skipped, for the coverage table: the kernel's declarations ("declared"), its
    backend missing here ("unavailable"), or the CPU's quick sampling ("sampled")."""
    reason = r.get("reason") or ""
    if reason.startswith("quick profile on the CPU"):
        return "sampled"
    if unavailable.get(r.get("backend")) and unavailable[r["backend"]] in reason:
        return "unavailable"
    return "declared"


def render_coverage(doc: dict, records: list[dict], table) -> list[str]:
    """Each fused kernel's coverage per write convention: checks run, skipped by its declarations
    (what it says it cannot do) or for want of its backend here, and the edge kinds (the
    catalogue rows' tags, and dtypes) it ran, lacked by declaration, or was never given."""
    # The oracle checks (their properties and drawn cases have sections of their own).
    mine = [r for r in records if r.get("write") and r.get("case") and r.get("needs", "oracle") in ("oracle", "backward")]
    if not mine:
        return []
    unavailable = {name: b.get("unavailable") or "" for name, b in doc.get("backends", {}).items()}
    groups: dict[tuple, list[dict]] = {}
    for r in mine:
        groups.setdefault((r["kernel"], r["op"], r.get("needs", "oracle")), []).append(r)
    rows = []
    for (kernel, op, test), recs in sorted(groups.items()):
        kinds = {k for r in recs for k in (*r.get("tags", ()), f"dtype {r['dtype']}")}
        writes = (recs[0].get("declaration") or {}).get("writes") or sorted({r["write"] for r in recs})
        for write in ("new", "in_place", "out_y"):
            here = [r for r in recs if r["write"] == write]
            if write not in writes:
                if op.startswith("add_"):  # the other ops write new outputs only (the interface's rule)
                        rows.append([kernel, op, test, write, "not declared", "", "", ""])
                continue
            ran = [r for r in here if _ran(r)]
            skipped = Counter(_skip_kind(r, unavailable) for r in here if r.get("outcome") == "skipped")
            covered = {k for r in ran for k in (*r.get("tags", ()), f"dtype {r['dtype']}")}
            declared = {k for r in here if r.get("outcome") == "skipped" and _skip_kind(r, unavailable) == "declared"
                        for k in (*r.get("tags", ()), f"dtype {r['dtype']}")} - covered
            given = {k for r in here for k in (*r.get("tags", ()), f"dtype {r['dtype']}")}
            rows.append([kernel, op, test, write, str(len(ran)),
                         ", ".join(f"{n} {k}" for k, n in sorted(skipped.items())) or "0",
                         f"{len(covered)} of {len(kinds)}" + (f"; declared not: {', '.join(sorted(declared))}" if declared else ""),
                         ", ".join(sorted(kinds - given)) or "none"])
    lines = ["", "## Fused kernels: coverage per write convention", "",
             "Checks run per kernel and write convention; *skipped* says why (declared: the kernel's own declarations "
             "rule the case out; unavailable: its backend is missing here; sampled: the CPU's quick sampling). *Edge "
             "kinds* are the catalogue rows' tags and dtypes this kernel's op was given: how many it ran in that "
             "convention, and those it declares it cannot run; *not given* lists those the catalogue has no case of "
             "in that convention (an fp8 y is never written in place).", ""]
    return lines + table(["kernel", "op", "check", "convention", "ran", "skipped", "edge kinds ran", "not given"], rows)
