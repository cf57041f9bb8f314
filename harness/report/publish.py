"""A run's report as committed under ``reports/<device>/``:

    python -m harness.report --publish reports/runs/<run> reports/h200

copies the run's markdown and plots as the run wrote them and writes its JSON gzipped and slimmed
(``correctness.json.gz``, ``benchmark.json.gz``): only the fields the renderers and ``--compare``
read, without pytest-benchmark's per-round times. Publishing refuses when the slimmed document
renders differently from the full one. It replaces the files of the same kind in the device folder
and leaves the rest (README, setup/, checks/) alone; RUN may be DEST, to slim a folder in place.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

from harness.report import atomic_write, find_report, load_report
from harness.report import render_markdown as correctness_markdown
from harness.report import benchmark

# What a correctness record keeps; a record that did not pass keeps its errors whole, a passed
# one only what "Closest calls" and --compare read.
RECORD_KEYS = ("nodeid", "test", "kernel", "backend", "op", "dtype", "case", "outcome", "reason", "failure_kind",
               "crash", "findings", "drawn_case", "message", "errors", "selection",
               # the determinism and batch-invariance sections (harness/report/properties.py)
               "deterministic", "bit_diffs", "batch_invariant", "batch_sizes", "batch_changes", "batch_claim",
               # the GPU-memory section (harness/report/memory.py)
               "mem_estimate", "mem_peak", "mem_budget", "mem_wait_s", "mem_retained", "oom_events",
               # the fused kernels' declarations and coverage per write convention (harness/report/fused.py;
               # tags only where a record has a write convention)
               "declaration", "tags", "write", "family", "needs")
PASSED_ERROR_KEYS = ("output", "worst_ratio", "max_ulp")
# What a benchmark keeps: harness.report.benchmark_results.results reads these.
BENCH_EXTRA_KEYS = ("op", "dtype", "m", "n", "regime", "repeat", "kernel", "bytes", "ceiling_gbps", "timing",
                    "timer", "device", "project", "prepare_s", "entry_point", "host_call_us", "wall_call_us",
                    "user_call", "user_call_error", "direction", "host_paired_us", "host_paired_rounds_us", "host_paired_left_out",
                    # the fused ops' rows (harness/benchmarks/bench_fused.py)
                    "family", "case", "case_title", "baseline",
                    # whether a row's calls launched with PDL (harness/report/targets.py)
                    "pdl")
BENCH_STATS_KEYS = ("median", "rounds")
BENCH_TOP_KEYS = ("datetime", "version", "normdiff")
NOTE = "slimmed by harness/report/publish.py: fields the reports do not read were dropped"


def slim_correctness(doc: dict) -> dict:
    records = []
    for r in doc["records"]:
        rec = {k: r[k] for k in RECORD_KEYS if k in r}
        if "write" not in rec:  # a case's tags are read only by the fused coverage section
            rec.pop("tags", None)
        if rec.get("outcome") == "passed" and rec.get("errors"):
            rec["errors"] = [{k: e[k] for k in PASSED_ERROR_KEYS if k in e} for e in rec["errors"]]
        records.append(rec)
    return {**doc, "records": records, "slimmed": NOTE}


def slim_benchmark(doc: dict) -> dict:
    rows = []
    for b in doc.get("benchmarks", ()):
        row = {"group": b.get("group"), "extra_info": {k: v for k, v in (b.get("extra_info") or {}).items()
                                                       if k in BENCH_EXTRA_KEYS}}
        if b.get("stats"):
            row["stats"] = {k: b["stats"][k] for k in BENCH_STATS_KEYS if k in b["stats"]}
        rows.append(row)
    return {**{k: doc[k] for k in BENCH_TOP_KEYS if k in doc}, "benchmarks": rows, "slimmed": NOTE}


def benchmark_markdown(doc: dict) -> str:
    """benchmark.md as ``write_all`` renders it, plot links included."""
    rows = [r for r in benchmark.results(doc) if r["regime"] == "bandwidth" and r["repeat"] == 0]
    return benchmark.render_markdown(doc, {(r["case"], r["dtype"]): benchmark.plot_name(r["case"], r["dtype"]) for r in rows})


KINDS = {"correctness": (slim_correctness, correctness_markdown), "benchmark": (slim_benchmark, benchmark_markdown)}


def gzip_json(doc: dict) -> bytes:
    """Compact JSON, gzipped without a timestamp: the same document gives the same bytes."""
    text = json.dumps(doc, separators=(",", ":"), default=repr, allow_nan=True)
    return gzip.compress(text.encode(), compresslevel=9, mtime=0)


def publish(run: Path, dest: Path) -> list[Path]:
    run, dest = Path(run), Path(dest)
    written = []
    for stem, (slim, render) in KINDS.items():
        if not find_report(run / f"{stem}.json"):
            continue
        full = load_report(run / f"{stem}.json")
        small = slim(full)
        if render(small) != render(full):
            raise ValueError(f"{run}/{stem}.json: the slimmed document renders differently; "
                             "harness/report/publish.py drops a field the renderer reads")
        # Read before removing: RUN may be DEST (slimming a folder in place).
        files = {p.name: p.read_bytes() for p in [run / f"{stem}.md", *sorted(run.glob(f"{stem}-*.png"))] if p.is_file()}
        files.setdefault(f"{stem}.md", render(small).encode())  # a run that left no markdown
        files[f"{stem}.json.gz"] = gzip_json(small)
        for old in [dest / f"{stem}.json", dest / f"{stem}.json.gz", dest / f"{stem}.md", *dest.glob(f"{stem}-*.png")]:
            old.unlink(missing_ok=True)
        for name, data in files.items():
            atomic_write(dest / name, data)
            written.append(dest / name)
    if not written:
        raise FileNotFoundError(f"{run} holds no correctness.json or benchmark.json")
    return written
