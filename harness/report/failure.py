"""One failing check as the reports show it: its reproduction command, its table of errors with a
legend for the columns, and a one-line summary (what failed and by how much) that the terminal
prints in place of a traceback and the comparison lists."""
from __future__ import annotations

import re
import shlex

from harness.report.markdown import fmt, table

ERROR_COLUMNS = ["output", "elements out of tolerance", "max abs err", "max ulp err", "rel L2 err", "x allowed",
                 "worst (index: got / expected)"]
LEGEND = ("Columns: *elements out of tolerance*: elements whose error exceeds their allowed error, of all "
          "elements; *max abs err*: the largest |got - expected|; *max ulp err*: the largest error in units "
          "in the last place of the dtype at the expected value; *rel L2 err*: ||got - expected|| / ||expected|| "
          "over the output; *x allowed*: the worst element's error as a multiple of its allowed error (over 1 "
          "fails; docs/checks.md, *The forward*, has the allowance); *worst*: that element's index, the kernel's value "
          "and the oracle's.")


def _index(i):
    """An element index as the run prints it: a tuple there, a list once read back from JSON."""
    return tuple(i) if isinstance(i, list) else i


def repro_command(doc: dict, rec: dict) -> str:
    sel = rec.get("selection") or doc.get("selection", {})
    backend = rec.get("backend") or sel.get("backend", "all")
    env = dict((doc.get("environment") or {}).get("repro_env") or {})
    if (doc.get("environment") or {}).get("triton_interpret") and "TRITON_INTERPRET" not in env:
        env["TRITON_INTERPRET"] = doc["environment"]["triton_interpret"]  # reports before repro_env
    prefix = [f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())]
    parts = [*prefix, "pytest", shlex.quote(rec["nodeid"]), "--backend", backend, "--profile", sel.get("profile", "quick")]
    for f in sel.get("backend_file") or ():
        parts += ["--backend-file", shlex.quote(f)]
    for option in ("gpu_memory", "simulate_gpu"):  # the memory layer's setting, where a check's fate may lie
        if sel.get(option):
            parts += [f"--{option.replace('_', '-')}", shlex.quote(str(sel[option]))]
    if rec.get("test") == "test_fuzz" and sel.get("fuzz_seed"):
        parts += ["--fuzz-seed", str(sel["fuzz_seed"])]
    return " ".join(parts)


# The checks a standalone repro reproduces (python -m harness.repro; harness/repro/target.py).
REPRO_TESTS = ("test_against_oracle", "test_backward", "test_fuzz", "test_fuzz_backward", "test_fused_against_oracle",
               "test_fused_backward")


def standalone_command(doc: dict, rec: dict) -> str | None:
    """The command that writes the check's standalone repro file (docs/repro.md), or None for a
    check no repro reproduces (a crash, a property check)."""
    if rec.get("test") not in REPRO_TESTS or rec.get("failure_kind"):
        return None
    sel = rec.get("selection") or doc.get("selection", {})
    parts = ["python -m harness.repro", shlex.quote(rec["nodeid"])]
    for f in sel.get("backend_file") or ():
        parts += ["--backend-file", shlex.quote(f)]
    if rec.get("drawn_case"):
        parts += ["--case", shlex.quote(rec["drawn_case"])]
    return " ".join(parts)


def error_table(rec: dict) -> list[str]:
    """The outputs out of tolerance, one row each; empty when none is."""
    bad = [e for e in rec.get("errors") or () if e.get("mismatched")]
    if not bad:
        return []
    return table(ERROR_COLUMNS, [
        [e["output"], f"{e['mismatched']}/{e['numel']}", e["max_abs"], e["max_ulp"], e["rel_l2"], e["worst_ratio"],
         f"{_index(e['worst_index'])}: {fmt(e['worst_out'], 9)} / {fmt(e['worst_ref'], 9)}"] for e in bad])


def render_failure(doc: dict, r: dict, heading: str = "###") -> list[str]:
    lines = [f"{heading} `{r['nodeid'].split('::')[-1]}`", ""]
    if r.get("drawn_case"):
        lines += [f"- drawn case: `{r['drawn_case']}` (`harness.judging.cases.case_from_id` rebuilds its inputs)", ""]
    if r.get("failure_kind"):
        c = r.get("crash") or {}
        lines += [f"- **{r['failure_kind']}**: {c.get('detail', '')} ({c.get('where', '')}, worker {c.get('worker', '?')})", ""]
    for f in r.get("findings") or ():
        what = f.get("detail") or f"{f['count']} element(s), first at {f['first']}"
        lines.append(f"- guard: **{f['kind']}** in `{f['output']}`: {what}")
    rows = error_table(r)
    lines += rows
    if not rows and not r.get("findings") and not r.get("failure_kind"):
        msg = (r.get("message") or "").strip().splitlines()
        lines += ["```", *msg[-12:], "```"]
    lines += ["", "Reproduce:", "", "```", repro_command(doc, r), "```", ""]
    standalone = standalone_command(doc, r)
    if standalone:
        lines += ["Standalone repro (one file, torch and the kernel's library only; add `--report` with this "
                  "run's correctness.json for its environment and numbers):", "", "```", standalone, "```", ""]
    return lines


def summary_line(fields: dict, message: str = "") -> str:
    """What failed and by how much, in one line: the outputs out of tolerance (count and the worst
    element's error in allowed errors), guard findings, a crash; else the message's first line
    that says something."""
    parts = [f"{e['output']} {e['mismatched']}/{e['numel']} out of tolerance, worst {fmt(e.get('worst_ratio'), 2)}x allowed"
             for e in fields.get("errors") or () if e.get("mismatched")]
    parts += [f"{f['kind']} in {f['output']}: {f.get('detail') or str(f['count']) + ' element(s)'}"
              for f in fields.get("findings") or ()]
    if fields.get("failure_kind"):
        parts.insert(0, f"{fields['failure_kind']}: {(fields.get('crash') or {}).get('detail', '')}".rstrip(": "))
    if not parts:  # a traceback's exception lines ("E   ...") where it has them, else every line
        lines = (message or "").splitlines()
        lines = [ln[1:] for ln in lines if re.match(r"E\s", ln)] or lines
        lines = [ln.strip() for ln in lines]
        lines = [ln for ln in lines if ln and not ln.endswith(":") and not ln.startswith(("assert ", "+"))]
        parts = [lines[0] if lines else "failed"]
    line = "; ".join(parts)
    if fields.get("drawn_case"):
        line = f"drawn case {fields['drawn_case']}: {line}"
    return line if len(line) <= 300 else line[:297] + "..."
