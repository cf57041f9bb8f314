"""Render the markdown report again from its JSON: python -m harness.report reports/correctness.json"""
import argparse
import json
from pathlib import Path

from harness.report import atomic_write, render_markdown


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.report", description=__doc__)
    parser.add_argument("json", type=Path, help="a correctness.json written by pytest harness")
    parser.add_argument("-o", "--output", type=Path, help="markdown path (default: beside the JSON, .md)")
    args = parser.parse_args(argv)
    doc = json.loads(args.json.read_text())
    out = args.output or args.json.with_suffix(".md")
    atomic_write(out, render_markdown(doc))
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
