"""A run cut short says what it left: a report whose checks did not all run lists their node ids
in ``not-run.txt`` beside it and names one command that runs only those (``--resume-from``,
harness.running.resume) and the one that merges the two reports. The listing is written with
every report, the partial ones a run writes as it goes too, so a run killed outright (a lost
machine) leaves its last one."""
from __future__ import annotations

import shlex
from pathlib import Path

NOT_RUN_FILE = "not-run.txt"
# Options of the first run that the resumed one replaces.
REPLACED = ("--report-dir", "--resume-from", "--ids-file")


def left_ids(records) -> list[str]:
    """The checks collected but never run to an outcome, in the report's order."""
    return [r["nodeid"] for r in records if r.get("outcome") is None]


def resume_command(command: str, report: Path) -> tuple[str, Path]:
    """(the command that runs only what ``report`` left, where its report goes): the first run's
    own arguments (of a merged report, its first run's), its report directory and earlier
    resume options replaced."""
    args = shlex.split(command.split(" ; ")[0])[1:]
    kept, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a.split("=", 1)[0] in REPLACED:
            skip = "=" not in a
            continue
        kept.append(a)
    rest = report.parent.with_name(report.parent.name + "-rest")
    return shlex.join(["pytest", *kept, "--resume-from", str(report), f"--report-dir={rest}"]), rest


def annotate(doc: dict, directory: Path) -> str | None:
    """``doc["resume"]`` for a run that left checks, and the listing to write beside its report
    as NOT_RUN_FILE (None, and no ``resume``, for one that ran them all)."""
    left = left_ids(doc["records"])
    if not left:
        doc.pop("resume", None)
        return None
    report = Path(directory) / "correctness.json"
    command, rest = resume_command(doc.get("command") or "pytest harness", report)
    doc["resume"] = {"left": len(left), "ids_file": NOT_RUN_FILE, "command": command,
                     "merge": shlex.join(["python", "-m", "harness.report", str(report), str(rest / "correctness.json"),
                                          "--out", f"{Path(directory)}-merged"])}
    return "".join(f"{nid}\n" for nid in left)


def render(doc: dict) -> list[str]:
    """The report's lines on what the run left: the command, the merge, the ids."""
    info = doc.get("resume")
    if not info:
        return []
    left = left_ids(doc["records"])
    lines = ["", "## Not run", "",
             f"{info['left']} checks did not run (listed one a line in `{info['ids_file']}` beside this report). "
             "Run only those:", "", f"    {info['command']}", "", "then merge the two reports:", "",
             f"    {info['merge']}", "", "<details><summary>the checks that did not run</summary>", ""]
    return lines + [f"    {nid}" for nid in left] + ["", "</details>"]


def terminal_lines(doc: dict) -> list[str]:
    info = doc.get("resume")
    if not info:
        return []
    return [f"normdiff: {info['left']} checks did not run ({info['ids_file']} beside the report); run only those:",
            f"  {info['command']}", f"then merge: {info['merge']}"]
