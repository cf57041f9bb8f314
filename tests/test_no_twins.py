"""The fused family shares code with the plain one instead of mirroring it: no run of six or more
lines (blank lines, comments, imports and lone punctuation passed over, white space folded)
stands both in a plain file and in a fused file of impls/ or harness/ (a fused file: "fused" in
its path)."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WINDOW = 6
_SKIP = re.compile(r"^(#.*|import .*|from \S+ import .*|[\]\[(){}:,]*)$")


def code_lines(text: str) -> list[tuple[int, str]]:
    """(line number, folded text) of the lines that count."""
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        folded = " ".join(line.split())
        if folded and not _SKIP.match(folded):
            out.append((i, folded))
    return out


def shared_runs(a: str, b: str, window: int = WINDOW) -> list[tuple[int, int]]:
    """(line in a, line in b) where a run of ``window`` counted lines of a stands in b."""
    la, lb = code_lines(a), code_lines(b)
    starts: dict[tuple[str, ...], int] = {}
    for k in range(len(lb) - window + 1):
        starts.setdefault(tuple(t for _, t in lb[k:k + window]), lb[k][0])
    return [(la[k][0], starts[key]) for k in range(len(la) - window + 1)
            if (key := tuple(t for _, t in la[k:k + window])) in starts]


def test_the_scan_finds_a_twin():
    body = "\n".join(f"    total = total + value_{i} * {i}" for i in range(7))
    plain, fused = f"def plain(v):\n{body}\n", f"# other\nimport os\n\ndef fused(v):\n{body}\n"
    assert shared_runs(plain, fused) == [(2, 5), (3, 6)]
    assert shared_runs(plain, "def other():\n    return 1\n") == []


def test_no_run_repeats_between_a_plain_and_a_fused_file():
    files = [p for d in ("impls", "harness") for p in (ROOT / d).rglob("*.py")]
    fused = [p for p in files if "fused" in str(p.relative_to(ROOT))]
    plain = [p for p in files if p not in fused]
    texts = {p: p.read_text() for p in files}
    found = [f"{f.relative_to(ROOT)}:{i} ~ {p.relative_to(ROOT)}:{j}"
             for f in fused for p in plain for i, j in shared_runs(texts[f], texts[p])[:1]]
    assert not found, "runs of six lines a plain and a fused file share:\n" + "\n".join(found)
