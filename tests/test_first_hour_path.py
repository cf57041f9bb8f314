"""The README's *Your first hour*, run as written: its commands read from the section's code
blocks and run by a shell with a home of their own, the bug planted as the prose says between
them; the first run passes, the second fails with the pattern on the report's first screen, and
the comparison exits 1."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORRECT = "tl.sum(x * x, axis=0) / N + eps"
PLANTED = "tl.sum(x * x, axis=0) / BLOCK_N + eps"


def section_commands() -> list[list[str]]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Your first hour")[1].split("\n## ")[0]
    blocks = re.findall(r"^```sh\n(.*?)^```", section, re.S | re.M)
    return [[line.split("   #")[0].strip() for line in b.splitlines() if line.strip()] for b in blocks]


def test_the_readme_first_hour_path(tmp_path):
    before, after = section_commands()
    env = {**os.environ, "HOME": str(tmp_path)}

    def sh(line: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", line], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)

    for line in before:
        ran = sh(line)
        assert ran.returncode == 0, (line, ran.stdout[-3000:], ran.stderr[-3000:])
    mine = tmp_path / "mine" / "my_rms.py"
    assert CORRECT in mine.read_text()  # the prose's edit applies to the example as it is
    mine.write_text(mine.read_text().replace(CORRECT, PLANTED))
    checks, compared = (sh(line) for line in after)
    assert checks.returncode == 1 and checks.stdout.rstrip().splitlines()[-1].startswith("normdiff correctness report:")
    assert "Traceback (most recent call last)" not in checks.stdout
    md = (tmp_path / "mine" / "after" / "correctness.md").read_text()
    assert "fails at every N that is not a power of two, passes at every power of two" in md
    assert md.index("### First failure") < md.index("## Closest calls")
    assert compared.returncode == 1 and compared.stdout.rstrip().splitlines()[-1].startswith("FAILED:")
