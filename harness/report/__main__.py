"""Render the markdown report again from its JSON, merge the reports of shards or of runs made
side by side, or compare two runs:

    python -m harness.report reports/latest/correctness.json
    python -m harness.report shard1/correctness.json shard2/correctness.json --out reports/merged
    python -m harness.report --compare reports/runs/A reports/runs/B   # run folders or JSON files;
                                        # exits 1 when a check that passed in A fails or errs in B
    python -m harness.report --publish reports/runs/A reports/h200    # the committed, slimmed form
    python -m harness.report --phases reports/latest/correctness.json  # where the run's time went
    python -m harness.report --repros reports/latest/correctness.json  # each failure's standalone repro, beside it
"""
import argparse
import subprocess
import sys
from pathlib import Path

from harness.report import atomic_write, load_report, merge_documents, render_markdown, write_report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("json", type=Path, nargs="*", help="correctness.json written by pytest harness (or its .json.gz)")
    parser.add_argument("--compare", type=Path, nargs=2, metavar=("A", "B"),
                        help="what changed from run A to run B (run folders, or their JSON files); exits 1 "
                             "when a check that passed in A fails or errs in B")
    parser.add_argument("--publish", type=Path, nargs=2, metavar=("RUN", "DEST"),
                        help="copy a run's markdown and plots into DEST with its JSON slimmed and gzipped "
                             "(harness/report/publish.py)")
    parser.add_argument("--phases", action="store_true",
                        help="print where each report's run spent its time (harness/report/phases.py)")
    parser.add_argument("--repros", action="store_true",
                        help="write each failure's standalone repro into the report's folder (repros/, with an "
                             "index), as python -m harness.repro --report JSON --all does")
    parser.add_argument("-o", "--output", type=Path, help="markdown path for one JSON (default: beside it, .md)")
    parser.add_argument("--out", type=Path, help="directory for the merged correctness.md and .json")
    args = parser.parse_args(argv)
    if args.compare:
        from harness.report.compare import main as compare

        text, result = compare(*args.compare)
        if args.output:
            atomic_write(args.output, text + "\n")
        print(text)
        return result["status"]  # 1 when a check that passed in A fails or errs in B
    if args.publish:
        from harness.report.publish import publish

        for path in publish(*args.publish):
            print(path)
        return 0
    if not args.json:
        parser.error("give a correctness.json, several to merge, or --compare A B")
    if args.repros:  # harness.repro comes after this package: its command, not its modules
        return max(subprocess.call([sys.executable, "-m", "harness.repro", "--report", str(p), "--all"])
                   for p in args.json)
    docs = [load_report(p) for p in args.json]
    if args.phases:
        from harness.report.phases import text

        for path, doc in zip(args.json, docs):
            print("\n".join([f"{path}:", *("  " + line for line in text(doc))]))
        return 0
    if len(docs) > 1 or args.out:
        if not args.out:
            parser.error("merging several reports needs --out DIR")
        md, _ = write_report(merge_documents(docs), args.out)
        print(md)
        return 0
    out = args.output or Path(str(args.json[0]).removesuffix(".gz")).with_suffix(".md")
    atomic_write(out, render_markdown(docs[0]))
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
