"""What a run cut short left, run again: ``--resume-from REPORT`` runs only the checks that
REPORT (a correctness.json, its .json.gz or its run folder) collected but did not run, stopped
by its time limit, SIGINT or a lost machine (its last partial report then); ``--ids-file PATH``
runs only the node ids a file lists, one a line (the ``not-run.txt`` such a report leaves beside
it). Every other check is deselected, so the run's report holds only those, and merges with the
first: ``python -m harness.report A/correctness.json B/correctness.json --out DIR``
(harness.report.cut_short writes the listing and the command into each report)."""
from __future__ import annotations

from pathlib import Path

import pytest

WANTED = pytest.StashKey["set[str] | None"]()


def _path(text: str) -> str:
    return str(Path(text).expanduser().resolve())


def addoption(group) -> None:
    group.addoption("--resume-from", default=None, metavar="REPORT", type=_path,
                    help="run only the checks REPORT (correctness.json or its run folder) collected but did not "
                         "run (a run stopped by its time limit, SIGINT or a lost machine); merge the two reports "
                         "with python -m harness.report A.json B.json --out DIR")
    group.addoption("--ids-file", default=None, metavar="PATH", type=_path,
                    help="run only the checks whose node ids PATH lists, one a line (e.g. a cut-short run's "
                         "not-run.txt)")


def left_in(report: str | Path) -> set[str]:
    """The node ids a report collected but holds no outcome for."""
    from harness.report import load_report

    path = Path(report)
    doc = load_report(path / "correctness.json" if path.is_dir() else path)
    return {r["nodeid"] for r in doc["records"] if r.get("outcome") is None}


def listed_in(path: str | Path) -> set[str]:
    lines = (line.strip() for line in Path(path).read_text().splitlines())
    return {line for line in lines if line and not line.startswith("#")}


def wanted(config) -> set[str] | None:
    """The node ids this run is limited to (both options: the ids either names), or None."""
    if WANTED not in config.stash:
        resume, listed = config.getoption("resume_from", None), config.getoption("ids_file", None)
        ids = None
        try:
            if resume or listed:
                ids = (left_in(resume) if resume else set()) | (listed_in(listed) if listed else set())
        except (OSError, ValueError, KeyError) as exc:
            raise pytest.UsageError(f"--resume-from / --ids-file: {type(exc).__name__}: {exc}") from exc
        config.stash[WANTED] = ids
    return config.stash[WANTED]


def deselect_done(config, items) -> None:
    """At collection: every check the options do not name is deselected (not part of this run)."""
    ids = wanted(config)
    if ids is None:
        return
    drop = [i for i in items if i.nodeid not in ids]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = [i for i in items if i.nodeid in ids]
