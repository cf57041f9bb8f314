"""The ledger one GPU's workers share (harness.running.memory has the estimate and the budget): one JSON
file per GPU that every worker reads and writes under ``flock`` on the file itself, shared for a
read and exclusive for a write. The file is created once and rewritten in place, never replaced
by a rename: ``flock`` locks an inode, so after a rename two writers could each hold "the" lock
on a different file, and a reader could read a file half written.

Each worker's entry holds ``held`` (context + reserved, between checks), ``need`` (the running
check's estimate, 0 when none), ``ticket`` (when it began to wait, None when not waiting) and
``alone``. A file that cannot be read whole raises ``LedgerError``: a harness error, never a
value the caller goes on with.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from pathlib import Path

from harness.running.devmem import CONTEXT_BYTES, pid_alive

POLL_S = 0.05


class LedgerError(RuntimeError):
    """The ledger file is missing or not a whole ledger: the harness's fault, not a kernel's."""


def ledger_path(directory: Path, gpu: str) -> Path:
    return Path(directory) / f"gpu{gpu}.ledger.json"


def _parse(text: str, path: Path) -> dict:
    try:
        state = json.loads(text)
    except json.JSONDecodeError as exc:
        raise LedgerError(f"ledger {path} is not whole JSON ({exc}; {len(text)} bytes)") from exc
    if not isinstance(state, dict) or not isinstance(state.get("budget"), int) or "workers" not in state:
        raise LedgerError(f"ledger {path} has no budget or workers: {text[:200]!r}")
    return state


class GpuLedger:
    """A worker's handle on its GPU's ledger file."""

    def __init__(self, path: Path, worker: str):
        self.path, self.worker = Path(path), worker

    @staticmethod
    def create(path: Path, budget: int) -> None:
        """Before any worker starts (the controller): the file, written whole under the lock."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        with os.fdopen(fd, "r+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                f.seek(0)
                f.truncate()
                f.write(json.dumps({"budget": int(budget), "workers": {}}))
                f.flush()
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def _open(self):
        try:
            return open(self.path, "r+")
        except OSError as exc:
            raise LedgerError(f"ledger {self.path} cannot be opened: {exc}") from exc

    @contextlib.contextmanager
    def _locked(self):
        """The state under the exclusive lock, written back whole when the block ends."""
        with self._open() as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                state = _parse(f.read(), self.path)
                self._prune(state)
                yield state
                text = json.dumps(state)
                f.seek(0)
                f.write(text)
                f.truncate()
                f.flush()
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def read(self) -> dict:
        """The state as it is, under the shared lock (no writer is midway)."""
        with self._open() as f:
            fcntl.flock(f, fcntl.LOCK_SH)
            try:
                return _parse(f.read(), self.path)
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    @property
    def budget(self) -> int:
        return self.read()["budget"]

    def _me(self, state: dict) -> dict:
        me = state["workers"].setdefault(self.worker, {"held": CONTEXT_BYTES, "need": 0, "ticket": None,
                                                       "alone": False, "need_wanted": 0})
        me["pid"] = os.getpid()
        return me

    @staticmethod
    def _prune(state: dict) -> None:
        """A worker that died (a crash, a replaced worker) holds nothing any more."""
        for name, w in list(state["workers"].items()):
            pid = w.get("pid")
            if pid is not None and pid != os.getpid() and not pid_alive(pid):
                del state["workers"][name]

    def set_held(self, held: int) -> None:
        with self._locked() as st:
            self._me(st)["held"] = int(held)

    def leave(self) -> None:
        with self._locked() as st:
            st["workers"].pop(self.worker, None)

    @staticmethod
    def footprint(w: dict) -> int:
        return max(w["held"], w["need"]) if w["need"] else w["held"]

    def _fits(self, st: dict, need: int, alone: bool) -> bool:
        me = self._me(st)
        others = {k: w for k, w in st["workers"].items() if k != self.worker}
        running = [w for w in others.values() if w["need"]]
        if any(w["alone"] for w in running):
            return False
        if alone:
            return not running
        if not running:
            # Nothing else runs: the check goes ahead whatever its size (the biggest run alone),
            # unless an earlier waiter must run alone or first.
            return not any(w["ticket"] is not None and w["ticket"] < me["ticket"] for w in others.values())
        used = sum(self.footprint(w) for w in others.values())
        mine = max(me["held"], need)
        if used + mine > st["budget"]:
            return False
        # First come, first served: an earlier waiter must still fit beside this check.
        for w in others.values():
            if w["ticket"] is not None and w["ticket"] < me["ticket"]:
                if w["alone"] or used + mine + max(w["held"], w.get("need_wanted", 0)) > st["budget"]:
                    return False
        return True

    def admit(self, need: int, alone: bool = False, while_waiting=None) -> float:
        """Wait until the check of ``need`` bytes (its estimate) fits beside what the other
        workers hold, then mark it running; the seconds waited.
        ``while_waiting()`` runs between polls (the worker hands its cached memory back) and
        returns its new ``held``."""
        need = int(need) + CONTEXT_BYTES  # the worker's context beside the check's allocations
        started = time.monotonic()
        ticket = time.time()
        first = True
        while True:
            with self._locked() as st:
                me = self._me(st)
                if me["ticket"] is None:
                    me["ticket"] = ticket
                me["need_wanted"], me["alone"] = int(need), alone
                if self._fits(st, need, alone):
                    me.update(need=int(need), ticket=None)
                    break
            if first and while_waiting is not None:
                held = while_waiting()
                if held is not None:
                    self.set_held(held)
            first = False
            time.sleep(POLL_S)
        return time.monotonic() - started

    def done(self, held: int) -> None:
        """The check ended: its need goes, what the worker now holds stays."""
        with self._locked() as st:
            me = self._me(st)
            me.update(need=0, held=int(held), ticket=None, alone=False)

    def snapshot(self) -> dict:
        return self.read()
