"""Render the markdown report again from its JSON, or merge the reports of runs made side by side:

    python -m harness.report reports/correctness.json
    python -m harness.report run1/correctness.json run2/correctness.json --out reports/h200
"""
import argparse
import json
from pathlib import Path

from harness.report import atomic_write, merge_documents, render_markdown, write_report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("json", type=Path, nargs="+", help="correctness.json written by pytest harness")
    parser.add_argument("-o", "--output", type=Path, help="markdown path for one JSON (default: beside it, .md)")
    parser.add_argument("--out", type=Path, help="directory for the merged correctness.md and .json")
    args = parser.parse_args(argv)
    docs = [json.loads(p.read_text()) for p in args.json]
    if len(docs) > 1 or args.out:
        if not args.out:
            parser.error("merging several reports needs --out DIR")
        md, _ = write_report(merge_documents(docs), args.out)
        print(md)
        return 0
    out = args.output or args.json[0].with_suffix(".md")
    atomic_write(out, render_markdown(docs[0]))
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
