"""The benchmarks on every GPU of a host: one pytest process per GPU, never two timings on one.

    python -m harness.bench_gpus --out reports/runs/bench [pytest options...]

Each process sees one GPU (CUDA_VISIBLE_DEVICES), times its shard of the sweep (``--shard K/N``
by benchmark group, so a group's kernels are timed together, the baseline first) and measures its
own copy ceiling; the merged report (harness.report.benchmark) names the GPU of each row. With
one GPU this is one plain ``pytest benchmarks --benchmark-only``. pytest-benchmark does not time
under pytest-xdist, so these are processes of their own, not xdist workers.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from harness.running.workers import visible_gpus

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.bench_gpus", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="the merged report's directory")
    parser.add_argument("--gpus", help="comma-separated CUDA_VISIBLE_DEVICES tokens (default: every GPU here)")
    args, pytest_args = parser.parse_known_args(argv)
    gpus = args.gpus.split(",") if args.gpus else visible_gpus() or [None]
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    procs = []
    for k, gpu in enumerate(gpus):
        env = dict(os.environ) if gpu is None else {**os.environ, "CUDA_VISIBLE_DEVICES": gpu}
        part = out / f"gpu{gpu if gpu is not None else 0}"
        cmd = [sys.executable, "-m", "pytest", "benchmarks", "--benchmark-only", "-p", "no:randomly", *pytest_args,
               f"--report-dir={part}"] + (["--shard", f"{k + 1}/{len(gpus)}"] if len(gpus) > 1 else [])
        log = open(out / f"{part.name}.log", "w")  # noqa: SIM115 (closed when the process ends)
        print(f"{'no GPU' if gpu is None else f'GPU {gpu}'}: {' '.join(cmd)} > {log.name}", flush=True)
        procs.append((subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT), part, log))
    codes = []
    for proc, part, log in procs:
        codes.append(proc.wait())
        log.close()
    from harness.report.benchmark import merge, write_all

    docs = [json.loads((part / "benchmark.json").read_text()) for _, part, _ in procs if (part / "benchmark.json").is_file()]
    if not docs:
        print("no benchmark report was written; see the logs", file=sys.stderr)
        return max(codes) or 1
    paths = write_all(merge(docs), out)
    print(f"merged report of {len(docs)} GPU run(s): {paths[0]}")
    return max(codes)


if __name__ == "__main__":
    raise SystemExit(main())
