"""python -m harness.repro NODEID [--out repro.py] [--shrink] [--report RUN/correctness.json]

Writes one self-contained file that reproduces a failing check: NODEID is the check's pytest node
id (``harness/test_differential.py::test_against_oracle[CASE-KERNEL]``, as the report prints it) or
``CASE-KERNEL`` (``--backward`` for the backward check). ``--report`` takes the run's environment,
plug-in files and the numbers it printed into the header; ``--all`` writes a repro of every
failure of that report into ``--dir`` (default: a ``repros`` folder beside the report).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.report import load_report
from harness.repro.batch import write_all
from harness.repro.emit import generate
from harness.repro.target import resolve


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.repro", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("nodeid", nargs="?", help="the failing check's node id, or CASE-KERNEL")
    p.add_argument("--out", "-o", type=Path, help="the file to write (default: repro.py here)")
    p.add_argument("--report", type=Path, help="the run's correctness.json: its environment, plug-ins, numbers")
    p.add_argument("--backend-file", action="append", default=[], help="a plug-in file the kernel comes from")
    p.add_argument("--case", help="the case id of a drawn (fuzz) check")
    p.add_argument("--backward", action="store_true", help="with CASE-KERNEL: the backward check")
    p.add_argument("--shrink", action="store_true", help="write the smallest failing case found instead")
    p.add_argument("--all", action="store_true", help="with --report: a repro of every failure of the run")
    p.add_argument("--dir", type=Path, help="with --all: where the files go (default: repros/ beside the report)")
    args = p.parse_args(argv)
    doc = load_report(args.report) if args.report else None
    if args.all:
        if doc is None:
            p.error("--all needs --report RUN/correctness.json")
        out_dir = args.dir or Path(str(args.report).removesuffix(".gz")).parent / "repros"
        for line in write_all(doc, out_dir, args.backend_file):
            print(line)
        return 0
    if not args.nodeid:
        p.error("give a node id (or CASE-KERNEL), or --report with --all")
    target = resolve(args.nodeid, args.backend_file, doc, args.case, args.backward)
    if args.shrink:
        from harness.repro.shrink import shrink

        target, tried = shrink(target, doc)
        for line in tried:
            print(line, file=sys.stderr)
    out = args.out or Path("repro.py")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(generate(target, out.name))
    print(f"{out}: {target.kernel.name} on {target.case.id} ({target.test}); run: python {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
