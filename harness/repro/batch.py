"""The repros of a run's failures: one file per failing oracle check of a report, written into a
folder beside it, with an index (README.md) naming each file, its check and its command."""
from __future__ import annotations

import re
from pathlib import Path

from harness.repro.emit import generate
from harness.repro.target import CHECKS, resolve


def repro_name(nodeid: str) -> str:
    """A file name for a check's repro: its parameter id, made safe."""
    param = nodeid.rsplit("[", 1)[-1].rstrip("]")
    test = nodeid.split("::")[-1].split("[")[0].removeprefix("test_")
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"{test}-{param}")[:180] + ".py"


def reproducible(record: dict) -> bool:
    return record.get("outcome") == "failed" and record.get("test") in CHECKS and not record.get("failure_kind")


def write_all(doc: dict, out_dir: Path, backend_files=()) -> list[str]:
    """Write a repro of each reproducible failure of ``doc`` into ``out_dir``; what was written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    lines, index = [], ["# Repros of this run's failures", "",
                        "Each file runs alone (`python FILE`) and exits 1 while the defect is present "
                        "(docs/repro.md).", "", "| file | check |", "|---|---|"]
    for r in doc.get("records", ()):
        if not reproducible(r):
            continue
        name = repro_name(r["nodeid"])
        try:
            target = resolve(r["nodeid"], backend_files, doc)
        except (KeyError, ValueError) as exc:  # a kernel not registered here, a check without a repro
            lines.append(f"{r['nodeid']}: no repro ({exc})")
            continue
        (out_dir / name).write_text(generate(target, name))
        index.append(f"| [{name}]({name}) | `{r['nodeid']}` |")
        lines.append(str(out_dir / name))
    (out_dir / "README.md").write_text("\n".join(index) + "\n")
    return lines
