"""The correctness report's markdown, one function per section, each reading only the JSON
document (so ``python -m harness.report`` renders it again). A new section is a function here (or
in a module of its own, as memory.py and properties.py are) called from ``render_markdown``."""
from __future__ import annotations

from collections import Counter, defaultdict

from harness.report import cut_short, fused, memory, pattern, phases, properties
from harness.report.failure import LEGEND, render_failure, repro_command
from harness.report.outcomes import HARNESS_ERROR
from harness.report.markdown import fmt, table

# Two kernels whose y differ by more than one allowed error (each may err by one, in opposite
# directions) get a line of their own: they compute differently enough to look at.
DISAGREE = 1.0


def render_markdown(doc: dict) -> str:
    records = doc["records"]
    lines = render_header(doc) + render_backends(doc) + render_summary(records) + pattern.render(doc, records)
    lines += render_skip_reasons(records)
    lines += render_compiled(doc.get("compiled") or ())
    lines += properties.render(records, table)
    lines += fused.render(records, table) + fused.render_coverage(doc, records, table)
    lines += render_known_issues(records)
    lines += memory.render_memory(doc, table)
    lines += render_failures(doc, records)
    lines += render_closest_calls(records)
    lines += render_agreement(doc)
    lines += phases.render(doc) + cut_short.render(doc)
    lines.append("")
    return "\n".join(lines)


def render_header(doc: dict) -> list[str]:
    """The title, the run's environment and command, and whether the run reached its end."""
    lines = ["# normdiff correctness report", ""]
    lines += table(["", ""], [[k, v] for k, v in doc["environment"].items() if v is not None] +
                   [["command", f"`{doc['command']}`"], ["profile", doc["selection"].get("profile")],
                    ["wall time", f"{doc['elapsed_s']} s"]])
    progress = doc.get("progress") or {"final": True}
    if not progress.get("final", True):
        lines += ["", f"> **Partial report**: the run had finished {progress['ran']} of {progress['collected']} "
                      "checks when this was written; it did not reach its end.", ""]
    elif progress.get("ran", 0) < progress.get("collected", 0):
        lines += ["", f"> **Incomplete run**: {progress['ran']} of {progress['collected']} checks ran "
                      "(interrupted or stopped at the first failure).", ""]
    if doc.get("resume"):
        lines += [f"> {doc['resume']['left']} checks did not run: *Not run*, at the end, lists them and the command "
                  "that runs only those.", ""]
    return lines


def render_backends(doc: dict) -> list[str]:
    lines = ["", "## Backends", ""]
    lines += table(["backend", "status here"], [
        [name, f"unavailable: {b['unavailable']}" if b["unavailable"] else (b["note"] or "available")]
        for name, b in doc["backends"].items()
    ])
    return lines


def render_summary(records: list[dict]) -> list[str]:
    """Outcomes per kernel, op and check; skips never count as passes."""
    counts: dict[tuple, Counter] = defaultdict(Counter)
    for r in records:
        counts[(r.get("kernel", "-"), r.get("op", "-"), r.get("test", "-"))][r.get("outcome", "not reached")] += 1
    total = Counter()
    for c in counts.values():
        total.update(c)
    lines = ["", "## Summary", ""]
    known = total["known issue"]
    kinds = Counter(r["failure_kind"] for r in records if r.get("outcome") == "failed" and r.get("failure_kind"))
    not_run = total["not run"]
    oom = total["out of memory"]
    errors = total[HARNESS_ERROR]
    lines.append(
        f"**{total['passed']} passed, {total['failed']} failed, {errors} harness errors, {total['skipped']} skipped"
        + (f", {oom} out of memory (retried alone and out of memory again: neither passed nor failed)" if oom else "")
        + (f", {known} known issues (declared, failing as declared)" if known else "")
        + (f", {not_run} not run (their kernel crashed too often)" if not_run else "")
        + f"** ({sum(total.values())} checks)."
    )
    if kinds:
        crashes = [k for k in kinds if k in ("crashed", "hung", "compile timeout", "fatal")]
        lines += ["", "Failures by kind, beside wrong results: "
                  + ", ".join(f"**{n} {kind}**" for kind, n in sorted(kinds.items()))
                  + (" (crashed, hung, compile timeout: the kernel killed or stalled its worker; each check was "
                     "charged alone and the run went on)." if crashes else ".")]
    lines.append("")
    extra = (["known issue"] if known else []) + (["not run"] if not_run else []) + (["out of memory"] if oom else [])
    if errors:
        lines += ["", f"**{errors} harness errors**: the harness failed around these checks, not the kernels "
                  "(an exception with no frame in the kernel's call); never counted against a kernel, and the run "
                  "exits non-zero. They head *Failures*.", ""]
    lines += table(["kernel", "op", "check", "passed", "failed", "harness errors", "skipped", *extra], [
        [k, op, test, c["passed"], c["failed"], c[HARNESS_ERROR], c["skipped"], *(c[e] for e in extra)]
        for (k, op, test), c in sorted(counts.items())
    ])
    return lines


def render_skip_reasons(records: list[dict]) -> list[str]:
    skips: dict[str, Counter] = defaultdict(Counter)
    for r in records:
        if r.get("outcome") in ("skipped", "not run"):
            skips[r.get("kernel", "-")][r.get("reason", "no reason given")] += 1
    if not skips:
        return []
    return ["", "### Skip reasons", ""] + table(["kernel", "reason", "count"], [
        [k, reason.replace("|", "\\|"), n] for k, reasons in sorted(skips.items()) for reason, n in reasons.most_common()
    ])


def render_compiled(compiled) -> list[str]:
    """One section per (backend, arch): what each compiled kernel costs on chip. A kernel that
    was only compiled is said to be so; it never counts as passed."""
    groups: dict[tuple, list] = defaultdict(list)
    for c in compiled:
        groups[(c.get("backend", "-"), c.get("arch", "-"), bool(c.get("executed")))].append(c)
    lines: list[str] = []
    for (backend, arch, executed), rows in sorted(groups.items()):
        title = f"{backend} on {arch}: compiled" + ("" if executed else ", not executed")
        lines += ["", f"## {title}", ""]
        if executed:
            lines.append("Compiled here for this device; the executed results are the differential checks above.")
        else:
            lines.append("Compiled for this target without a device to run on: these kernels are neither passed "
                         "nor failed here. Numbers from ptxas (-v); shared memory is static + dynamic bytes per block.")
        lines.append("")
        lines += table(
            ["kernel", "dtype", "N", "affine", "vec", "threads", "regs/thread", "smem/block (B)", "spill st/ld (B)",
             "SASS", "compile s"],
            [[c["kernel"], c["dtype"], c["n"], c.get("affine", "-"), c.get("vec", "-"), c.get("threads", "-"),
              c.get("registers"), f"{c.get('smem_static', 0)} + {fmt(c.get('smem_dynamic'))}",
              f"{c.get('spill_stores', 0)} / {c.get('spill_loads', 0)}", c.get("sass_arch") or "-",
              fmt(c.get("seconds"), 2)] for c in sorted(rows, key=lambda c: (c["kernel"], c["dtype"], c["n"], str(c.get("affine"))))],
        )
    return lines


def render_known_issues(records: list[dict]) -> list[str]:
    issues = [r for r in records if r.get("outcome") == "known issue"]
    if not issues:
        return []
    lines = ["", f"## Known issues ({len(issues)})", "",
             "Defects a backend declares (`NormKernel.known_issue`); each still ran and failed as declared.", ""]
    lines += table(["check", "declared", "worst error (allowed errors)"], [
        [f"`{r['nodeid'].split('::')[-1]}`", r.get("reason", "").replace("|", "\\|"),
         fmt(max((e.get("worst_ratio", 0) for e in r.get("errors") or []), default=None))]
        for r in issues
    ])
    return lines


def render_failures(doc: dict, records: list[dict]) -> list[str]:
    """The failures grouped by kind and message, then each with what failed and how to reproduce it."""
    failures = [r for r in records if r.get("outcome") == "failed"]
    errors = [r for r in records if r.get("outcome") == HARNESS_ERROR]
    lines = ["", f"## Failures ({len(failures)})", ""]
    lines += render_harness_errors(doc, errors)
    if not failures:
        lines.append("None." if not errors else "No kernel failed.")
    lines += memory.render_groups(memory.groups(records, ("failed",), doc.get("selection")), table)
    if failures:
        lines += ["", "Each failure:", "", LEGEND, ""]
    for r in failures:
        lines += render_failure(doc, r)
    return lines


def render_harness_errors(doc: dict, errors: list[dict]) -> list[str]:
    """The harness's own errors, grouped by error and place, each check named with its reproduction."""
    if not errors:
        return []
    groups: dict[tuple, list] = defaultdict(list)
    for r in errors:
        e = (r.get("harness_errors") or [{}])[0]
        groups[(e.get("error", "?"), e.get("where", "?"), e.get("phase", "?"))].append(r)
    lines = [f"### Harness errors ({len(errors)}): not the kernels'", "",
             "Raised outside every kernel's call (harness/running/attribution.py has the rule): a defect of normdiff, "
             "to be reported; the kernels' outcomes in these checks are unknown.", ""]
    lines += table(["error", "where", "phase", "checks", "first"], [
        [err.replace("|", "\\|"), f"`{where}`", phase, len(rs), f"`{rs[0]['nodeid'].split('::')[-1]}`"]
        for (err, where, phase), rs in sorted(groups.items(), key=lambda g: -len(g[1]))])
    lines += ["", "Reproduce the first:", "", "```", repro_command(doc, errors[0]), "```", ""]
    return lines


def render_closest_calls(records: list[dict]) -> list[str]:
    lines = ["", "## Closest calls", "",
             "Largest error of each kernel among its passing cases, as a fraction of the allowed error.", ""]
    worst: dict[tuple, tuple] = {}
    for r in records:
        if r.get("outcome") != "passed":
            continue
        for e in r.get("errors") or ():
            key = (r["kernel"], r["dtype"], e["output"])
            if key not in worst or e["worst_ratio"] > worst[key][0]:
                worst[key] = (e["worst_ratio"], e["max_ulp"], r["case"])
    lines += table(["kernel", "dtype", "output", "x allowed", "max ulp err", "case"],
                   [[k, dt, o, *v] for (k, dt, o), v in sorted(worst.items())]) if worst else ["No passing cases."]
    return lines


def render_agreement(doc: dict) -> list[str]:
    """One matrix per (op, dtype) of the largest difference between two kernels, then the pairs
    that differ by more than DISAGREE allowed errors."""
    lines = ["", "## Agreement between kernels", "",
             "Largest difference between two kernels' outputs on the same case, over y and the statistics "
             "both write (mean, rstd), in units of the error each may make against the oracle (the "
             "tolerance above); cases compared in brackets; a worst case names the statistic where one "
             "was furthest apart. `inf` means their NaN patterns differ. The *backward* tables compare dx, dw "
             "and db the same way, each in its own allowed error (harness/judging/compare_backward.py).", ""]
    by_table: dict[tuple, dict] = defaultdict(dict)
    unit = "allowed errors"
    for a in doc.get("agreement", ()):
        if "max_diff" not in a:  # a schema-1 document measured agreement in ulps
            a, unit = {**a, "max_diff": a["max_ulp"]}, "ulps (schema 1: values under 2^-10 counted as 2^-10)"
        by_table[(a["op"], a["dtype"])][(a["a"], a["b"])] = a
    if not by_table:
        lines.append("Only one kernel ran per case: nothing to compare.")
    flagged = []
    for (op, dt), cells in sorted(by_table.items()):
        names = sorted({n for pair in cells for n in pair})
        lines += ["", f"**{op}, {dt}**", ""]
        rows = []
        for a in names:
            row = [a]
            for b in names:
                cell = cells.get(tuple(sorted((a, b))))
                row.append("" if a == b else (f"{fmt(cell['max_diff'])} ({cell['cases']})" if cell else "-"))
            rows.append(row)
        lines += table([f"max difference in {unit} (cases)", *names], rows)
        if unit == "allowed errors":
            flagged += [cell for cell in cells.values() if cell["max_diff"] > DISAGREE]
    if flagged:
        lines += ["", "Pairs that differ by more than one allowed error somewhere:", ""]
        for c in flagged:
            lines.append(f"- {c['op']} {c['dtype']}: {c['a']} vs {c['b']}: {fmt(c['max_diff'])} allowed errors, "
                         f"worst on `{c['worst_case']}`")
    return lines
