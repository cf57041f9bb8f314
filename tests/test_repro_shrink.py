"""Shrinking (harness/repro/shrink.py): the planted padded-N bug (tests/plugins/repro_planted.py)
from the largest case of the full profile it fails, without running that case, to at most 3 rows
and the smallest N of the catalogue at which it fails; and the N class a report's pattern names."""
from __future__ import annotations

from pathlib import Path

from harness.judging import runner
from harness.judging.cases import catalogue
from harness.judging.shapes import HUGE_ELEMENTS
from harness.repro import resolve
from harness.repro.__main__ import main
from harness.repro.shrink import catalogue_ns, n_class, pow2, shrink

PLUGIN = str(Path(__file__).parent / "plugins" / "repro_planted.py")


def test_a_padded_n_bug_shrinks_to_few_rows_and_the_smallest_failing_n():
    # The planted bug fails wherever N is not a power of two: the largest such case of the full profile.
    fails = [c for c in catalogue("full") if c.op == "rms_norm" and not pow2(c.n) and c.rows * c.n < HUGE_ELEMENTS]
    largest = max(fails, key=lambda c: c.rows * (c.n + c.row_pad))
    target = resolve(f"{largest.id}-reproplant.padded", [PLUGIN])
    small, tried = shrink(target)
    assert small.case.rows <= 3
    kernel = target.kernel
    smallest = next(n for n in catalogue_ns()
                    if not runner.check(kernel, type(small.case)(**{**vars(small.case), "shape": (1, n)})).ok)
    assert small.case.n == smallest
    assert not runner.check(kernel, small.case).ok and len(tried) < 10


def test_the_report_pattern_names_the_n_class():
    keep, words = n_class("fails at every N that is not a multiple of 64, passes at every multiple of 64", 4000)
    assert keep(1000) and not keep(128) and "multiple of 64" in words
    keep, _ = n_class("fails at every N from 4097 (passes up to 4096)", 8191)
    assert keep(5120) and not keep(4096)
    keep, words = n_class(None, 1000)
    assert keep(7) and not keep(8) and "power of two" in words


def test_the_command_writes_the_shrunk_repro(tmp_path, capsys):
    out = tmp_path / "small.py"
    assert main(["rms_norm-bfloat16-17x4000-large_mean-reproplant.padded", "--backend-file", PLUGIN, "--shrink",
                 "--out", str(out)]) == 0
    assert "rms_norm-bfloat16-1x7-large_mean" in out.read_text().splitlines()[0]
