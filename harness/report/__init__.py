"""The correctness report: a JSON document and the markdown a person reads, written atomically.

``python -m harness.report reports/correctness.json`` renders the markdown again from the JSON.
Committed reports (``reports/<device>/``) hold the JSON gzipped and slimmed (harness.report.publish);
``load_report`` reads either form.
"""
from __future__ import annotations

import gzip
import json
import math
import os
import shlex
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

from harness.report import memory, properties

SCHEMA = 3  # 3: optional "compiled" (kernels compiled, maybe not run); 2: agreement in allowed errors; 1: in ulps
# Two kernels whose y differ by more than one allowed error (each may err by one, in opposite
# directions) get a line of their own: they compute differently enough to look at.
DISAGREE = 1.0


def build_document(*, records, agreement, backends, selection, environment, command, elapsed, compiled=()) -> dict:
    rows = []
    for nodeid, rec in records.items():
        rows.append({"nodeid": nodeid, **rec})
    return {
        "schema": SCHEMA,
        "environment": environment,
        "command": command,
        "selection": selection,
        "elapsed_s": round(elapsed, 1),
        "backends": {name: {"note": note, "unavailable": why} for name, (note, why) in backends.items()},
        "records": rows,
        "agreement": [
            {"op": op, "dtype": dt, "a": a, "b": b, "max_diff": d, "cases": n, "worst_case": worst}
            for (op, dt, a, b), (d, n, worst) in sorted(agreement.items())
        ],
        # Kernels compiled for a target without running (e.g. TileLang for sm_90 on a CPU
        # machine), with what the compiler reports per kernel: see render_compiled.
        "compiled": list(compiled),
        # Failed and out-of-memory checks grouped by kind and masked message (every record stays above).
        "failure_groups": memory.groups(rows),
    }


def add_agreement_cell(cell: list, d: float, cases: int, case_id: str) -> None:
    """Fold a comparison (or another run's cell) into [max difference, cases, worst case]; on a
    tie the smaller case id, so a cell does not depend on the order checks ran or merged in."""
    if d > cell[0] or (d == cell[0] and case_id and (not cell[2] or case_id < cell[2])):
        cell[0], cell[2] = d, case_id
    cell[1] += cases


def merge_documents(docs: list[dict]) -> dict:
    """One report from shards (``--shard K/N``) or runs made side by side: the records of each
    run (a check that ran in several keeps its first record; one that a run collected but did
    not reach, interrupted at its time limit, takes the record of a later run that ran it) and
    their agreement cells folded together. Shards keep each case in one run, so their merge
    equals one unsharded run; runs split by backend compare only the kernels that ran in the same
    run; a run of what an interrupted run left makes the two one run's report."""
    if len(docs) == 1:
        return docs[0]
    merged = dict(docs[0])
    by_id, compiled, backends = {}, [], {}
    cells: dict[tuple, list] = {}
    for d in docs:
        for r in d["records"]:
            old = by_id.get(r["nodeid"])
            if old is None or (old.get("outcome") is None and r.get("outcome") is not None):
                # Each record keeps its own run's selection, so its reproduce command is right.
                by_id[r["nodeid"]] = {"selection": d.get("selection", {}), **r}
        for a in d.get("agreement", []):
            if "max_diff" not in a:
                continue  # schema 1 (ulps) cannot be merged with allowed errors
            cell = cells.setdefault((a["op"], a["dtype"], a["a"], a["b"]), [0.0, 0, ""])
            add_agreement_cell(cell, a["max_diff"], a["cases"], a["worst_case"])
        compiled += d.get("compiled") or []
        backends.update(d.get("backends", {}))
    agreement = [{"op": op, "dtype": dt, "a": a, "b": b, "max_diff": c[0], "cases": c[1], "worst_case": c[2]}
                 for (op, dt, a, b), c in sorted(cells.items())]
    records = list(by_id.values())
    ran = sum(r.get("outcome") is not None for r in records)
    merged.update(
        command=" ; ".join(d["command"] for d in docs),
        elapsed_s=max(d.get("elapsed_s", 0) for d in docs),
        records=records, agreement=agreement, compiled=compiled, backends=backends,
        # Counted over the merged checks: a check collected by two runs is one check.
        progress={"final": ran == len(records) or all((d.get("progress") or {}).get("final", True) for d in docs),
                  "ran": ran, "collected": len(records)},
        merged_from=len(docs),
    )
    return merged


def find_report(path) -> Path | None:
    """``X.json`` if it exists, else ``X.json.gz`` beside it; None when neither does."""
    path = Path(path)
    for p in (path,) if path.suffix == ".gz" else (path, path.with_name(path.name + ".gz")):
        if p.is_file():
            return p
    return None


def load_report(path) -> dict:
    """A report's JSON document, from ``X.json`` or its gzipped form ``X.json.gz``."""
    found = find_report(path)
    if found is None:
        raise FileNotFoundError(f"{path} (nor {Path(path).name}.gz)")
    data = found.read_bytes()
    return json.loads(gzip.decompress(data) if found.suffix == ".gz" else data)


def atomic_write(path: Path, text: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a report is for everyone to read
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_report(doc: dict, directory: Path, stem: str = "correctness") -> tuple[Path, Path]:
    """Write <stem>.json then <stem>.md; a crash leaves the previous pair in place."""
    md_path, json_path = directory / f"{stem}.md", directory / f"{stem}.json"
    markdown = render_markdown(doc)  # render first: a rendering error must not leave a half pair
    atomic_write(json_path, json.dumps(doc, indent=1, default=_json_default, allow_nan=True) + "\n")
    atomic_write(md_path, markdown)
    return md_path, json_path


def _json_default(obj):
    if isinstance(obj, tuple):
        return list(obj)
    return str(obj)


# -- markdown ---------------------------------------------------------------------------------
def _fmt(v, digits=3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if math.isinf(v) or math.isnan(v):
            return str(v)
        return f"{v:.{digits}g}"
    return str(v)


def _index(i):
    """An element index as the run prints it: a tuple there, a list once read back from JSON."""
    return tuple(i) if isinstance(i, list) else i


def _table(header: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(_fmt(c) for c in row) + " |" for row in rows]
    return out


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
    if rec.get("test") == "test_fuzz" and sel.get("fuzz_seed"):
        parts += ["--fuzz-seed", str(sel["fuzz_seed"])]
    return " ".join(parts)


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
        lines += _table(
            ["kernel", "dtype", "N", "affine", "vec", "threads", "regs/thread", "smem/block (B)", "spill st/ld (B)",
             "SASS", "compile s"],
            [[c["kernel"], c["dtype"], c["n"], c.get("affine", "-"), c.get("vec", "-"), c.get("threads", "-"),
              c.get("registers"), f"{c.get('smem_static', 0)} + {_fmt(c.get('smem_dynamic'))}",
              f"{c.get('spill_stores', 0)} / {c.get('spill_loads', 0)}", c.get("sass_arch") or "-",
              _fmt(c.get("seconds"), 2)] for c in sorted(rows, key=lambda c: (c["kernel"], c["dtype"], c["n"], str(c.get("affine"))))],
        )
    return lines


def render_markdown(doc: dict) -> str:
    env, records = doc["environment"], doc["records"]
    lines = ["# normdiff correctness report", ""]
    lines += _table(["", ""], [[k, v] for k, v in env.items() if v is not None] +
                    [["command", f"`{doc['command']}`"], ["profile", doc["selection"].get("profile")],
                     ["wall time", f"{doc['elapsed_s']} s"]])
    progress = doc.get("progress") or {"final": True}
    if not progress.get("final", True):
        lines += ["", f"> **Partial report**: the run had finished {progress['ran']} of {progress['collected']} "
                      "checks when this was written; it did not reach its end.", ""]
    elif progress.get("ran", 0) < progress.get("collected", 0):
        lines += ["", f"> **Incomplete run**: {progress['ran']} of {progress['collected']} checks ran "
                      "(interrupted or stopped at the first failure).", ""]
    lines += ["", "## Backends", ""]
    lines += _table(["backend", "status here"], [
        [name, f"unavailable: {b['unavailable']}" if b["unavailable"] else (b["note"] or "available")]
        for name, b in doc["backends"].items()
    ])

    # Summary per kernel and op; skips never count as passes.
    counts: dict[tuple, Counter] = defaultdict(Counter)
    skips: dict[str, Counter] = defaultdict(Counter)
    for r in records:
        key = (r.get("kernel", "-"), r.get("op", "-"), r.get("test", "-"))
        counts[key][r.get("outcome", "not reached")] += 1
        if r.get("outcome") in ("skipped", "not run"):
            skips[key[0]][r.get("reason", "no reason given")] += 1
    total = Counter()
    for c in counts.values():
        total.update(c)
    lines += ["", "## Summary", ""]
    known = total["known issue"]
    kinds = Counter(r["failure_kind"] for r in records if r.get("outcome") == "failed" and r.get("failure_kind"))
    not_run = total["not run"]
    oom = total["out of memory"]
    lines.append(
        f"**{total['passed']} passed, {total['failed']} failed, {total['skipped']} skipped"
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
    lines += _table(["kernel", "op", "check", "passed", "failed", "skipped", *extra], [
        [k, op, test, c["passed"], c["failed"], c["skipped"], *(c[e] for e in extra)]
        for (k, op, test), c in sorted(counts.items())
    ])
    if skips:
        lines += ["", "### Skip reasons", ""]
        lines += _table(["kernel", "reason", "count"], [
            [k, reason.replace("|", "\\|"), n] for k, reasons in sorted(skips.items()) for reason, n in reasons.most_common()
        ])

    lines += render_compiled(doc.get("compiled") or ())
    lines += properties.render(records, _table)

    issues = [r for r in records if r.get("outcome") == "known issue"]
    if issues:
        lines += ["", f"## Known issues ({len(issues)})", "",
                  "Defects a backend declares (`NormKernel.known_issue`); each still ran and failed as declared.", ""]
        lines += _table(["check", "declared", "worst error (allowed errors)"], [
            [f"`{r['nodeid'].split('::')[-1]}`", r.get("reason", "").replace("|", "\\|"),
             _fmt(max((e.get("worst_ratio", 0) for e in r.get("errors") or []), default=None))]
            for r in issues
        ])

    lines += memory.render_memory(doc, _table)
    failures = [r for r in records if r.get("outcome") == "failed"]
    lines += ["", f"## Failures ({len(failures)})", ""]
    if not failures:
        lines.append("None.")
    lines += memory.render_groups(memory.groups(records, ("failed",)), _table)
    if failures:
        lines += ["", "Each failure:", ""]
    for r in failures:
        lines += [f"### `{r['nodeid'].split('::')[-1]}`", ""]
        if r.get("drawn_case"):
            lines += [f"- drawn case: `{r['drawn_case']}` (`harness.cases.case_from_id` rebuilds its inputs)", ""]
        if r.get("failure_kind"):
            c = r.get("crash") or {}
            lines += [f"- **{r['failure_kind']}**: {c.get('detail', '')} ({c.get('where', '')}, worker {c.get('worker', '?')})", ""]
        for f in r.get("findings") or ():
            lines.append(f"- guard: **{f['kind']}** in `{f['output']}`: {f['count']} element(s), first at {f['first']}")
        bad = [e for e in r.get("errors") or () if e["mismatched"]]
        if bad:
            lines += _table(
                ["output", "elements out of tolerance", "max abs err", "max ulp err", "rel L2 err", "x allowed", "worst (index: got / expected)"],
                [[e["output"], f"{e['mismatched']}/{e['numel']}", e["max_abs"], e["max_ulp"], e["rel_l2"], e["worst_ratio"],
                  f"{_index(e['worst_index'])}: {_fmt(e['worst_out'], 9)} / {_fmt(e['worst_ref'], 9)}"] for e in bad],
            )
        if not bad and not r.get("findings") and not r.get("failure_kind"):
            msg = (r.get("message") or "").strip().splitlines()
            lines += ["```", *msg[-12:], "```"]
        lines += ["", "Reproduce:", "", "```", repro_command(doc, r), "```", ""]

    lines += ["", "## Closest calls", "",
              "Largest error of each kernel among its passing cases, as a fraction of the allowed error.", ""]
    worst: dict[tuple, tuple] = {}
    for r in records:
        if r.get("outcome") != "passed":
            continue
        for e in r.get("errors") or ():
            key = (r["kernel"], r["dtype"], e["output"])
            if key not in worst or e["worst_ratio"] > worst[key][0]:
                worst[key] = (e["worst_ratio"], e["max_ulp"], r["case"])
    lines += _table(["kernel", "dtype", "output", "x allowed", "max ulp err", "case"],
                    [[k, dt, o, *v] for (k, dt, o), v in sorted(worst.items())]) if worst else ["No passing cases."]

    lines += ["", "## Agreement between kernels", "",
              "Largest difference between two kernels' outputs on the same case, over y and the statistics "
              "both write (mean, rstd), in units of the error each may make against the oracle (the "
              "tolerance above); cases compared in brackets; a worst case names the statistic where one "
              "was furthest apart. `inf` means their NaN patterns differ. The *backward* tables compare dx, dw "
              "and db the same way, each in its own allowed error (harness/compare_backward.py).", ""]
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
                row.append("" if a == b else (f"{_fmt(cell['max_diff'])} ({cell['cases']})" if cell else "-"))
            rows.append(row)
        lines += _table([f"max difference in {unit} (cases)", *names], rows)
        if unit == "allowed errors":
            flagged += [cell for cell in cells.values() if cell["max_diff"] > DISAGREE]
    if flagged:
        lines += ["", "Pairs that differ by more than one allowed error somewhere:", ""]
        for c in flagged:
            lines.append(f"- {c['op']} {c['dtype']}: {c['a']} vs {c['b']}: {_fmt(c['max_diff'])} allowed errors, "
                         f"worst on `{c['worst_case']}`")
    lines.append("")
    return "\n".join(lines)

