"""The ledger one GPU's workers share, under load: 16 processes writing and reading thousands of
times see 0 errors, and the same load finds the race of a ledger read without the lock while a
writer truncates and rewrites the file in place (how the ledger was written before: every later
check of a worker that read it mid-write failed)."""
from __future__ import annotations

import contextlib
import fcntl
import json
import multiprocessing
import random

import pytest

from harness.running import ledger as ledger_mod
from harness.running.ledger import GpuLedger, LedgerError
from harness.running.memory import GIB, MIB

PROCESSES = 16
ROUNDS = 150  # each round: 3 writes and 2 reads, so 16 x 150 x 5 = 12000 ledger operations


class UnlockedLedger(GpuLedger):
    """The race's model: reads take no lock; a write truncates the file, then writes it."""

    @contextlib.contextmanager
    def _locked(self):
        with open(self.path, "r+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                state = json.loads(f.read() or "{}")
                self._prune(state)
                yield state
                f.seek(0)
                f.truncate()
                f.write(json.dumps(state))
                f.flush()
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def read(self) -> dict:
        return json.loads(self.path.read_text())


def _hammer(args) -> list[str]:
    """One process's share of the load; the errors it met, each as its type and message."""
    cls, path, name, seed = args
    rng = random.Random(seed)
    ledger, errors = cls(path, name), []
    for _ in range(ROUNDS):
        try:
            ledger.set_held(rng.randrange(1, 64) * MIB)
            budget = ledger.budget
            if not isinstance(budget, int):
                errors.append(f"budget read as {budget!r}")
            ledger.admit(rng.randrange(0, 8) * MIB)
            ledger.done(rng.randrange(1, 64) * MIB)
            if name not in ledger.snapshot()["workers"]:
                errors.append("own entry missing")
        except Exception as exc:  # noqa: BLE001 (every error is what the test counts)
            errors.append(f"{type(exc).__name__}: {exc}")
    return errors


def stress(cls, tmp_path) -> list[str]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = ledger_mod.ledger_path(tmp_path, "0")
    GpuLedger.create(path, 1024 * GIB)  # room for every check: the load is reads and writes, not waits
    jobs = [(cls, path, f"gw{i}", i) for i in range(PROCESSES)]
    with multiprocessing.get_context("fork").Pool(PROCESSES) as pool:
        return [e for errs in pool.map(_hammer, jobs) for e in errs]


def test_sixteen_processes_read_and_write_without_an_error(tmp_path):
    errors = stress(GpuLedger, tmp_path)
    assert not errors, f"{len(errors)} errors, e.g. {errors[:3]}"
    state = GpuLedger(ledger_mod.ledger_path(tmp_path, "0"), "reader").read()
    assert state["budget"] == 1024 * GIB and len(state["workers"]) == PROCESSES


def test_the_same_load_finds_the_unlocked_read(tmp_path):
    """The stress can fail: a ledger read without the lock while writers truncate the file in
    place gets empty or partial JSON (the race that failed every later check of a worker)."""
    errors = []
    for attempt in range(3):  # a race: almost always on the first attempt
        errors = stress(UnlockedLedger, tmp_path / str(attempt))
        if errors:
            break
    assert errors and any("JSONDecodeError" in e for e in errors), errors[:3]


def test_an_unreadable_ledger_is_an_error_never_a_value(tmp_path):
    path = ledger_mod.ledger_path(tmp_path, "0")
    path.write_text('{"budget": ')
    with pytest.raises(LedgerError, match="not whole JSON"):
        GpuLedger(path, "gw0").budget  # noqa: B018
    path.write_text('{"workers": {}}')
    with pytest.raises(LedgerError, match="no budget"):
        GpuLedger(path, "gw0").admit(MIB)
    with pytest.raises(LedgerError, match="cannot be opened"):
        GpuLedger(tmp_path / "missing.json", "gw0").read()


def test_the_ledger_is_never_replaced_by_a_rename(tmp_path):
    """flock locks an inode: a writer must rewrite the same file, never a new one renamed over it."""
    path = ledger_mod.ledger_path(tmp_path, "0")
    GpuLedger.create(path, 4 * GIB)
    inode = path.stat().st_ino
    ledger = GpuLedger(path, "gw0")
    ledger.set_held(MIB)
    ledger.admit(MIB)
    ledger.done(MIB)
    GpuLedger.create(path, 4 * GIB)
    assert path.stat().st_ino == inode


RACY_COMMIT = "d71247d"  # the last commit whose ledger read without the lock


def test_the_stress_fails_against_the_racy_commits_ledger(tmp_path):
    """The regression test proper: the ledger as it was at RACY_COMMIT, taken from git, fails it."""
    import importlib.util
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    shown = subprocess.run(["git", "show", f"{RACY_COMMIT}:harness/memory.py"], cwd=root, capture_output=True,
                           text=True)
    if shown.returncode != 0:
        pytest.skip(f"commit {RACY_COMMIT} is not in this clone's history ({shown.stderr.strip()[:120]})")
    source = tmp_path / "racy_memory.py"
    source.write_text(shown.stdout)
    spec = importlib.util.spec_from_file_location("racy_memory", source)
    racy = importlib.util.module_from_spec(spec)
    sys.modules["racy_memory"] = racy  # its dataclasses, and the pool's pickles, look it up there
    spec.loader.exec_module(racy)
    errors = []
    for attempt in range(3):
        errors = stress(racy.GpuLedger, tmp_path / str(attempt))
        if errors:
            break
    assert errors and any("JSONDecodeError" in e for e in errors), errors[:3]
