"""The report's failure groups and its GPU-memory section.

- ``groups``: failures (or out-of-memory events) with the same kind and message signature
  (numbers, shapes, case ids and kernel names masked), each with its count, kernels and up to
  three example checks: a run with 783 out-of-memory checks reads as one group.
- ``render_memory``: the budget, how long checks waited for memory, every out-of-memory event
  and what became of it, kernels that asked for far more than their estimate, checks whose
  measured peak passed their estimate, and kernels that kept memory after their calls.
"""
from __future__ import annotations

import re
from collections import defaultdict

from harness.report.failure import standalone_command
from harness.report.outcomes import TOO_BIG, fmt

EXAMPLES = 3
# A kernel whose checks left this much allocated after them in all (beyond the harness's caches)
# is named as keeping memory: its later checks, and other kernels', may run out.
LEAK_BYTES = 256 * 2**20
PEAK_ROWS = 40  # checks over their estimate listed one by one; the rest counted

_MASKS = [
    (re.compile(r"0x[0-9a-fA-F]+"), "<hex>"),
    (re.compile(r"\b\d+(?:x\d+)+\b"), "<shape>"),
    (re.compile(r"gw\d+"), "<worker>"),
    (re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"), "<n>"),
]


def mask(text: str, names=()) -> str:
    for name in sorted((n for n in names if n), key=len, reverse=True):
        text = text.replace(name, "<" + ("case" if "-" in name else "kernel") + ">")
    for pattern, repl in _MASKS:
        text = pattern.sub(repl, text)
    return " ".join(text.split())[:240]


def signature(r: dict) -> tuple[str, str]:
    """(kind, masked message) of a failed or out-of-memory record."""
    names = (r.get("kernel"), r.get("case"), r.get("drawn_case"))
    if r.get("outcome") == "out of memory":
        events = r.get("oom_events") or [{}]
        return "out of memory", mask(events[-1].get("message") or r.get("reason", ""), names)
    if r.get("failure_kind"):
        return r["failure_kind"], mask((r.get("crash") or {}).get("detail") or r.get("message", ""), names)
    findings = sorted({f"{f['kind']} in {f['output']}" for f in r.get("findings") or ()})
    bad = sorted(e["output"] for e in r.get("errors") or () if e.get("mismatched"))
    if findings or bad:
        parts = [f"guard: {f}" for f in findings] + ([f"out of tolerance: {', '.join(bad)}"] if bad else [])
        return "wrong result", "; ".join(parts)
    lines = [ln for ln in (r.get("message") or "").strip().splitlines() if ln.strip()]
    error = next((ln for ln in reversed(lines) if ln.startswith("E ")), lines[-1] if lines else "")
    return "failed", mask(error.removeprefix("E").strip(), names)


def groups(records: list[dict], outcomes=("failed", "out of memory"), selection: dict | None = None) -> list[dict]:
    """Records of ``outcomes`` grouped by signature, largest group first (``selection``: the run's,
    for the plug-in files a group's standalone repro names)."""
    run = {"selection": selection or {}}
    found: dict[tuple, dict] = {}
    for r in records:
        if r.get("outcome") not in outcomes:
            continue
        kind, text = signature(r)
        g = found.setdefault((kind, text), {"kind": kind, "signature": text, "count": 0, "kernels": set(),
                                            "examples": []})
        g["count"] += 1
        g["kernels"].add(r.get("kernel", "-"))
        if len(g["examples"]) < EXAMPLES:
            g["examples"].append(r["nodeid"].split("::")[-1])
        if "repro" not in g and standalone_command(run, r):
            g["repro"] = standalone_command(run, r)  # the first reproducible check's standalone repro
    out = sorted(found.values(), key=lambda g: (-g["count"], g["kind"], g["signature"]))
    return [{**g, "kernels": sorted(g["kernels"])} for g in out]


def render_groups(gs: list[dict], table) -> list[str]:
    if not gs:
        return []
    lines = ["", f"Grouped by kind and message (numbers, shapes, cases and kernels masked): {len(gs)} group(s).", ""]
    repro = any(g.get("repro") for g in gs)
    lines += table(["checks", "kind", "signature", "kernels", "examples", *(["standalone repro"] if repro else [])], [
        [g["count"], g["kind"], "`" + g["signature"].replace("|", "\\|").replace("`", "'") + "`",
         ", ".join(g["kernels"]), "<br>".join(f"`{e}`" for e in g["examples"]),
         *([f"`{g['repro']}`".replace("|", "\\|") if g.get("repro") else "-"] if repro else [])] for g in gs])
    if repro:
        lines += ["", "Each group's *standalone repro* writes one file that reproduces its first check with torch and "
                  "the kernel's library alone; `python -m harness.repro --report RUN/correctness.json --all` writes "
                  "every failure's into the run's folder (docs/repro.md)."]
    return lines


def render_memory(doc: dict, table) -> list[str]:
    records = doc["records"]
    gpu = [r for r in records if r.get("mem_estimate") is not None]
    events = [(r, e) for r in records for e in r.get("oom_events") or ()]
    if not gpu and not events:
        return []
    simulated = (doc.get("selection") or {}).get("simulate_gpu")
    lines = ["", "## GPU memory", ""]
    if simulated:
        lines += [f"> **A simulated GPU of {simulated}** (`--simulate-gpu`): the checks ran on the CPU while the "
                  "budget, the ledger, admission and the retry alone ran as on one GPU; a peak is what the CPU "
                  "kernels allocated through torch's dispatcher, not what a GPU kernel would.", ""]
    budgets = sorted({r["mem_budget"] for r in gpu if r.get("mem_budget")})
    if budgets:
        asked = (doc.get("selection") or {}).get("gpu_memory")
        lines.append(f"- budget per GPU: {', '.join(fmt(b) for b in budgets)}"
                     + (f" (`--gpu-memory {asked}`)" if asked else " (free memory at the start, less a reserve)"))
    waits = [r.get("mem_wait_s") or 0.0 for r in gpu]
    waited = [w for w in waits if w > 0.01]
    if gpu:
        lines.append(f"- checks that waited for memory: {len(waited)} of {len(gpu)}, {sum(waits):.1f} s in all"
                     + (f", the longest {max(waited):.1f} s" if waited else ""))
    too_big = [r for r in records if str(r.get("reason", "")).startswith(TOO_BIG)]
    if too_big:
        lines.append(f"- skipped up front, larger than the budget: {len(too_big)} checks")
    lines += _render_events(records, events, table)
    lines += render_groups(groups(records, ("out of memory",)), table)
    if gpu:
        lines += _render_peaks(gpu, table, "the simulated card's allocated bytes" if simulated
                               else "`torch.cuda.max_memory_allocated`")
        lines += _render_retained(records, table)
    return lines


def _render_events(records, events, table) -> list[str]:
    if not events:
        return ["- out-of-memory events: none"]
    oom = [r for r in records if r.get("outcome") == "out of memory"]
    recovered = {r["nodeid"] for r, _ in events} - {r["nodeid"] for r in oom}
    lines = [f"- out-of-memory events: {len(events)} in {len({r['nodeid'] for r, _ in events})} checks; "
             f"{len(recovered)} passed or were judged when retried alone, {len(oom)} ran out of memory alone too "
             "(counted as *out of memory*, never as failed)", ""]
    lines += table(["check", "attempt", "asked", "estimate", "budget", "message"], [
        [f"`{r['nodeid'].split('::')[-1]}`", e.get("attempt"), fmt(e.get("asked")), fmt(e.get("estimate")),
         fmt(e.get("budget")), (e.get("message") or "")[:160].replace("|", "\\|")] for r, e in events[:60]])
    over = defaultdict(list)
    for r, e in events:
        if e.get("over_allocation"):
            over[r.get("kernel", "-")].append(e["over_allocation"])
    if over:
        lines += ["", "**Over-allocation** (a finding about the kernel): an allocation larger than its check's whole "
                  "estimate, workspace included.", ""]
        lines += [f"- **{k}**: {len(v)} time(s); {v[0]}" for k, v in sorted(over.items())]
    return lines


def _render_peaks(gpu, table, how: str) -> list[str]:
    over = sorted((r for r in gpu if r.get("mem_peak") and r["mem_peak"] > r["mem_estimate"]),
                  key=lambda r: -r["mem_peak"] / max(1, r["mem_estimate"]))
    if not over:
        return ["", f"Measured peak ({how} around each check): every one of {len(gpu)} "
                "checks within its estimate."]
    lines = ["", f"**{len(over)} of {len(gpu)} checks passed their estimate** (measured peak, "
             f"{how} around the check):", ""]
    lines += table(["check", "kernel", "estimate", "peak", "peak / estimate"], [
        [f"`{r['nodeid'].split('::')[-1]}`", r.get("kernel"), fmt(r["mem_estimate"]), fmt(r["mem_peak"]),
         f"{r['mem_peak'] / max(1, r['mem_estimate']):.2f}"] for r in over[:PEAK_ROWS]])
    if len(over) > PEAK_ROWS:
        lines.append(f"\n... and {len(over) - PEAK_ROWS} more (in the JSON: `mem_peak` > `mem_estimate`).")
    return lines


def _render_retained(records, table) -> list[str]:
    kept: dict[str, list] = defaultdict(lambda: [0, 0])
    for r in records:
        if r.get("mem_retained"):
            kept[r.get("kernel", "-")][0] += r["mem_retained"]
            kept[r.get("kernel", "-")][1] += 1
    leaking = {k: v for k, v in kept.items() if v[0] >= LEAK_BYTES}
    if not leaking:
        return ["", "No kernel kept memory after its calls (beyond the harness's own caches)"
                + (f"; below {fmt(LEAK_BYTES)} in all: " + ", ".join(f"{k} {fmt(v[0])}" for k, v in sorted(kept.items()))
                   if kept else "") + "."]
    lines = ["", f"**Kernels that kept memory after their calls** ({fmt(LEAK_BYTES)} or more in all, beyond the "
             "harness's caches): their later checks, and other kernels' on the same GPU, may run out of memory.", ""]
    lines += table(["kernel", "kept in all", "checks"], [[k, fmt(v[0]), v[1]] for k, v in sorted(leaking.items())])
    return lines
