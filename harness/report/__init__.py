"""The correctness report: a JSON document and the markdown a person reads (harness.report.correctness),
written atomically.

``python -m harness.report reports/correctness.json`` renders the markdown again from the JSON.
Committed reports (``reports/<device>/``) hold the JSON gzipped and slimmed (harness.report.publish);
``load_report`` reads either form.
"""
from __future__ import annotations

import gzip
import json
import os
import tempfile
from pathlib import Path

from harness.report import cut_short, memory
from harness.report.correctness import render_markdown, repro_command

SCHEMA = 3  # 3: optional "compiled" (kernels compiled, maybe not run); 2: agreement in allowed errors; 1: in ulps


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
        # machine), with what the compiler reports per kernel: see correctness.render_compiled.
        "compiled": list(compiled),
        # Failed and out-of-memory checks grouped by kind and masked message (every record stays above).
        "failure_groups": memory.groups(rows, selection=selection),
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
        phases=[p for d in docs for p in d.get("phases") or ()],  # each run's own (harness.report.phases)
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
    listing = cut_short.annotate(doc, directory) if stem == "correctness" else None  # what a run cut short left
    markdown = render_markdown(doc)  # render first: a rendering error must not leave a half pair
    atomic_write(json_path, json.dumps(doc, indent=1, default=_json_default, allow_nan=True) + "\n")
    atomic_write(md_path, markdown)
    if listing is not None:
        atomic_write(directory / cut_short.NOT_RUN_FILE, listing)
    elif stem == "correctness":
        (directory / cut_short.NOT_RUN_FILE).unlink(missing_ok=True)  # a stale one of an earlier partial report
    return md_path, json_path


def _json_default(obj):
    if isinstance(obj, tuple):
        return list(obj)
    return str(obj)


__all__ = ["add_agreement_cell", "atomic_write", "build_document", "find_report", "load_report", "merge_documents",
           "render_markdown", "repro_command", "write_report"]
