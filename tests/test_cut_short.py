"""A run cut short says what it left, and where the time went (harness.report.cut_short,
harness.running.resume, harness.report.phases): a run stopped by SIGINT part-way lists the checks
that did not run and prints one command that runs only those; that run's report merges with the
first into the report of one whole run. The phases: each worker's time cut into set-up, first
compiles, waiting for memory, checking, between checks and after its last check."""
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.report import cut_short, load_report, phases
from harness.running import isolation

ROOT = Path(__file__).resolve().parents[1]
SELECTION = ["harness/test_differential.py", "harness/test_properties.py", "--backend", "torch", "--op", "rms_norm",
             "--dtype", "float32", "--profile", "quick"]


def pytest_run(*args, env=None):
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:randomly", *args], cwd=ROOT,
                          env={**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")},  # not a worker
                               "PYTHONPATH": str(ROOT), **(env or {})},
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("workers", ["0", "2"])
def test_an_interrupted_run_names_what_it_left_and_the_rest_merges_whole(tmp_path, workers):
    first_dir = tmp_path / "first"
    extra = ["--simulate-gpu", "8GiB"] if workers != "0" else []
    first = pytest_run(*SELECTION, "-n", workers, *extra, "-p", "tests.plugins.interrupt", f"--report-dir={first_dir}",
                       env={"NORMDIFF_INTERRUPT_AFTER": "8"})
    assert first.returncode == 2, first.stdout[-3000:]  # pytest's "interrupted"
    doc = load_report(first_dir / "correctness.json")
    left = [r["nodeid"] for r in doc["records"] if r.get("outcome") is None]
    ran = len(doc["records"]) - len(left)
    assert left and ran >= 8, (len(left), ran)
    # Where its time went: every check that ran has its span, each worker's time is cut whole.
    p, = doc["phases"]
    assert p["checks"] >= ran - 1 and set(p["worker_s"]) == set(phases.WORKER_PHASES)
    assert p["wall_s"]["total"] >= p["wall_s"]["set-up"] + p["wall_s"]["checks"] > 0
    listed = (first_dir / cut_short.NOT_RUN_FILE).read_text().split()
    assert listed == left and doc["resume"]["left"] == len(left)
    md = (first_dir / "correctness.md").read_text()
    assert "## Not run" in md and doc["resume"]["command"] in md and left[0] in md
    # The terminal names the same command; run it as printed.
    printed = re.search(r"run only those:\n\s+(pytest .+)\n", first.stdout).group(1)
    assert printed == doc["resume"]["command"] and "--resume-from" in printed
    second = pytest_run(*shlex.split(printed)[1:])
    assert second.returncode == 0, second.stdout[-3000:]
    rest = load_report(first_dir.parent / "first-rest" / "correctness.json")
    assert sorted(r["nodeid"] for r in rest["records"]) == sorted(left)
    assert all(r.get("outcome") for r in rest["records"]) and "resume" not in rest
    assert not (first_dir.parent / "first-rest" / cut_short.NOT_RUN_FILE).exists()
    merged_dir = tmp_path / "merged"
    merge = subprocess.run(shlex.split(doc["resume"]["merge"].replace(f"{first_dir}-merged", str(merged_dir))),
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert merge.returncode == 0, merge.stderr
    whole = load_report(merged_dir / "correctness.json")
    assert len(whole["records"]) == len(doc["records"]) and all(r.get("outcome") for r in whole["records"])
    assert whole["progress"] == {"final": True, "ran": len(doc["records"]), "collected": len(doc["records"])}
    assert "resume" not in whole and len(whole["phases"]) == 2
    assert "Run 2 of 2" in (merged_dir / "correctness.md").read_text()


def test_ids_file_runs_only_the_ids_it_lists(tmp_path):
    ids = tmp_path / "ids.txt"
    ids.write_text("# two checks\nharness/test_differential.py::test_against_oracle[rms_norm-float32-3x769-normal-torch.eager]\n"
                   "harness/test_properties.py::test_batch_invariant[rms_norm-float32-256x1000-normal-torch.eager]\n\n")
    run = pytest_run(*SELECTION, "-n", "0", f"--ids-file={ids}", f"--report-dir={tmp_path / 'r'}")
    assert run.returncode == 0, run.stdout[-3000:]
    doc = load_report(tmp_path / "r" / "correctness.json")
    assert sorted(r["nodeid"] for r in doc["records"]) == sorted(ids.read_text().split("\n")[1:3])


def test_the_resume_command_keeps_the_selection_and_replaces_the_report_options():
    command, rest = cut_short.resume_command(
        "pytest harness --backend all --report-dir /o/a -k 'not fuzz' --resume-from=/o/x.json --ids-file f ; pytest b",
        Path("/o/a/correctness.json"))
    assert shlex.split(command) == ["pytest", "harness", "--backend", "all", "-k", "not fuzz", "--resume-from",
                                    "/o/a/correctness.json", "--report-dir=/o/a-rest"]
    assert rest == Path("/o/a-rest")


def test_phases_cut_each_workers_time():
    t = 1000.0
    records = [
        # gw0: started at t+2, first check at t+5; 2 checks (one compiles 3 s, one waits 1 s), a 1 s gap
        {"worker": "gw0", "backend": "triton", "t_start": t + 5, "t_end": t + 10, "compile_s": 3.0, "compiled": 1},
        {"worker": "gw0", "backend": "triton", "t_start": t + 11, "t_end": t + 13, "mem_wait_s": 1.0},
        {"worker": "gw1", "backend": "torch", "t_start": t + 6, "t_end": t + 16},
        {"nodeid": "never ran"},  # no times: not counted
    ]
    clock = {"started": t, "workers": {"gw0": {"started": t + 2, "collected": t + 4},
                                       "gw1": {"started": t + 2, "collected": t + 4.5}, "gw2": {"started": t + 3}}}
    p = phases.summarise(records, clock, ended=t + 20)
    assert p["workers"] == 3 and p["checks"] == 3 and p["compiled"] == 1
    assert p["wall_s"] == {"total": 20.0, "set-up": 5.0, "workers collected": 4.5, "checks": 11.0, "finish": 4.0}
    w = p["worker_s"]
    # set-up: gw0 3 s, gw1 4 s, gw2 (never got a check) 17 s
    assert w == {"set-up": 24.0, "first compiles": 3.0, "waiting for memory": 1.0, "checking": 13.0,
                 "between checks": 1.0, "after its last check": 11.0}
    assert sum(w.values()) == pytest.approx(18 + 18 + 17)  # each worker from its start to the end
    assert p["compile_s_by_backend"] == {"triton": 3.0}
    text = "\n".join(phases.render({"phases": [p]}))
    assert "## Where the time went" in text and "| first compiles | 3.0 s |" in text


def test_a_first_call_counts_as_compile_with_its_time():
    config = SimpleNamespace(getoption=lambda name: {"check_timeout": 60.0, "compile_timeout": 60.0}[name])
    watch = isolation.CallWatch(config)
    watch.start_item("x")
    kernel = SimpleNamespace(name="k", compile_key=lambda spec: ("n", 7))
    case, spec = SimpleNamespace(id="c"), SimpleNamespace(device="cpu")
    for _ in range(2):
        with watch.call(kernel, case, spec):
            time.sleep(0.2)
    assert watch.item_compiles == 1 and 0.2 <= watch.item_compile_s < 0.4
    watch.start_item("y")
    assert (watch.item_compiles, watch.item_compile_s) == (0, 0.0)
