"""The benchmark report: markdown and PNG plots rendered from pytest-benchmark's JSON.

``pytest --benchmark-only`` writes ``benchmark.json`` (pytest-benchmark's own document plus a
``normdiff`` section: skips, failures, environment, copy ceiling) and renders it. To render again
from a saved document (``benchmark.json``, or any ``--benchmark-json`` file of a normdiff run)::

    python -m harness.report.benchmark reports/latest/benchmark.json [--out DIR]  # or a .json.gz
    python -m harness.report.benchmark run-bf16/benchmark.json run-fp16/benchmark.json --out DIR  # merged

Times are pytest-benchmark's medians (``stats.median``, seconds); GB/s = bytes / median; "% of
copy" is against the copy ceiling of the same run; speedups are against the baseline kernel of
the same group and pass. Tables and plots use the first pass; further passes (``--bench-repeat``)
feed the repeatability section.

The rows and their figures: harness.report.benchmark_results; the markdown, one function per
section: benchmark_markdown; the plots: benchmark_plots. This module writes them all.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from harness.report import atomic_write, load_report
from harness.report.benchmark_markdown import render_markdown
from harness.report.benchmark_plots import figure, plot, plot_name
from harness.report.benchmark_results import ceiling_of, repeatability, results


def write_all(doc: dict, directory: Path, json_name: str | None = "benchmark.json") -> tuple[Path, ...]:
    """benchmark.json (unless json_name is None), the PNG plots and benchmark.md (written last, so
    a crash leaves the previous markdown)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    if json_name:
        json_path = directory / json_name
        atomic_write(json_path, json.dumps(doc, indent=1, default=repr, allow_nan=True) + "\n")
        written.append(json_path)
    rows = [r for r in results(doc) if r["regime"] == "bandwidth" and r["repeat"] == 0]
    ceiling = ceiling_of(doc, rows)
    plots = {}
    for op, dt in sorted({(r["case"], r["dtype"]) for r in rows}):  # a fused row's case: its own plot
        sub = [r for r in rows if (r["case"], r["dtype"]) == (op, dt)]
        path = directory / plot_name(op, dt)
        tmp = path.with_name(f".{path.name}.tmp.png")
        devices = sorted({r["device"] for r in sub if r["device"]})
        plot(sub, op, dt, ceiling, tmp, ", ".join(devices) or None)
        tmp.replace(path)
        plots[(op, dt)] = path.name
        written.append(path)
    md_path = directory / "benchmark.md"
    atomic_write(md_path, render_markdown(doc, plots))
    return (md_path, *written)


def merge(docs: list[dict]) -> dict:
    """One document from several runs (a sweep split by --dtype or --op over several commands).
    Each result keeps its own run's copy ceiling; repeat passes compare within a run."""
    if len(docs) == 1:
        return docs[0]
    out = {**docs[0], "benchmarks": [b for d in docs for b in d.get("benchmarks", ())]}
    nds = [d.get("normdiff") or {} for d in docs]
    nd = {**nds[0]}
    for key in ("skipped", "failed"):
        nd[key] = [e for x in nds for e in x.get(key, ())]
    for key in ("collected", "done", "elapsed_s"):
        nd[key] = sum(x.get(key, 0) for x in nds)
    nd["final"] = all(x.get("final", True) for x in nds)
    nd["command"] = " ; ".join(x.get("command", "?") for x in nds)
    # Each run's ceiling under the device its rows name (one GPU per run when split over GPUs).
    labels = [sorted({(b.get("extra_info") or {}).get("device") for b in d.get("benchmarks", ())} - {None}) for d in docs]
    nd["ceiling"] = {(", ".join(labels[i]) if labels[i] else f"{dev} (run {i + 1})"): c
                     for i, x in enumerate(nds) for dev, c in (x.get("ceiling") or {}).items()}
    out["normdiff"] = nd
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.report.benchmark", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("json", type=Path, nargs="+",
                   help="benchmark.json, or a --benchmark-json file of a normdiff run; several are merged")
    p.add_argument("--out", type=Path, help="directory for benchmark.md and the plots (default: beside the first JSON)")
    args = p.parse_args(argv)
    doc = merge([load_report(path) for path in args.json])
    first = args.json[0]
    out = args.out or first.parent
    same = len(args.json) == 1 and out.resolve() == first.parent.resolve() and first.name.startswith("benchmark.json")
    for path in write_all(doc, out, json_name=None if same else "benchmark.json"):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["ceiling_of", "figure", "merge", "plot", "plot_name", "render_markdown", "repeatability", "results", "write_all"]
