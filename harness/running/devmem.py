"""Device memory, real or simulated: every question the harness asks of a GPU's memory (free and
total, allocated, reserved, the peak, the per-process cap, handing cache back) goes through a
``Card`` from here, never through ``torch.cuda`` directly.

- ``RealCard`` asks ``torch.cuda``.
- ``SimulatedCard`` (``--simulate-gpu SIZE``, CPU only) is one GPU of SIZE shared by the run's
  processes, so the memory layer (budget, ledger, admission, the retry alone, peaks) runs on a
  machine without a GPU as it runs on one. Checks run on the CPU; a ``TorchDispatchMode`` counts
  the storages allocated through torch's dispatcher (rounded to the caching allocator's 512-byte
  blocks) as *allocated*, freed ones stay *reserved* until ``empty_cache``, and an allocation past
  the per-process cap, or past what the card's other processes leave, raises
  ``torch.OutOfMemoryError`` with CUDA's wording. Factories (``empty``, ``zeros``, ...) are
  checked before they allocate, so asking for more than the card never allocates it. Each
  process publishes its reserved memory and context in one file under ``flock``, from which every
  process reads the card's free memory. Not seen: what code beneath the dispatcher allocates
  (torch.compile's generated code, Triton's interpreter buffers).
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path

from harness.report.outcomes import fmt

SIMULATE_ENV = "NORMDIFF_SIMULATE_GPU"  # "BYTES:FILE": the simulated card's size and its processes' file
BLOCK = 512  # the caching allocator rounds every block up to this
# A worker's CUDA context, library handles and loaded modules: memory outside the caching
# allocator that each process on a GPU holds.
CONTEXT_BYTES = 640 * 2**20


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (one of another user counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


class RealCard:
    """One CUDA device, through torch.cuda."""

    simulated = False
    name = "cuda"

    @staticmethod
    def _cuda():
        import torch

        return torch.cuda

    def mem_get_info(self) -> tuple[int, int]:
        return self._cuda().mem_get_info()

    def memory_allocated(self) -> int:
        return self._cuda().memory_allocated()

    def memory_reserved(self) -> int:
        return self._cuda().memory_reserved()

    def max_memory_allocated(self) -> int:
        return self._cuda().max_memory_allocated()

    def reset_peak_memory_stats(self) -> None:
        self._cuda().reset_peak_memory_stats()

    def set_per_process_memory_fraction(self, fraction: float) -> None:
        self._cuda().set_per_process_memory_fraction(fraction)

    def empty_cache(self) -> None:
        self._cuda().empty_cache()

    def initialized(self) -> bool:
        return self._cuda().is_initialized()

    def track(self) -> None:
        """Nothing to start: CUDA's allocator counts by itself."""


class SimulatedCard:
    """One GPU of ``size`` bytes on the CPU (see the module's docstring)."""

    simulated = True
    name = "simulated GPU"

    def __init__(self, size: int, shared: Path):
        self.size, self.shared = int(size), Path(shared)
        self.cap = self.size
        self.allocated = self.reserved = self.peak = 0
        self.live: dict[int, tuple[int, object]] = {}  # data_ptr -> (bytes, StorageWeakRef)
        self._mode = None
        self._published = None

    # -- what torch.cuda answers ----------------------------------------------------------------
    def mem_get_info(self) -> tuple[int, int]:
        self.sweep()
        used = sum(self._others().values()) + (self._mine() if self._mode is not None else 0)
        return max(0, self.size - used), self.size

    def memory_allocated(self) -> int:
        self.sweep()
        return self.allocated

    def memory_reserved(self) -> int:
        self.sweep()
        return self.reserved

    def max_memory_allocated(self) -> int:
        return self.peak

    def reset_peak_memory_stats(self) -> None:
        self.sweep()
        self.peak = self.allocated

    def set_per_process_memory_fraction(self, fraction: float) -> None:
        if not 0 < fraction <= 1:
            raise ValueError(f"memory fraction {fraction} is not in (0, 1]")
        self.cap = int(fraction * self.size)

    def empty_cache(self) -> None:
        self.sweep()
        self.reserved = self.allocated
        self._publish()

    def initialized(self) -> bool:
        return self._mode is not None

    def track(self) -> None:
        """From now on, this process's allocations count (it holds a context on the card)."""
        if self._mode is None:
            from harness.running import devmem_mode

            self._mode = devmem_mode.Tracker(self)
            self._mode.__enter__()
            self._publish(force=True)

    # -- the allocator ----------------------------------------------------------------------------
    def _mine(self) -> int:
        return CONTEXT_BYTES + self.reserved

    def admit(self, nbytes: int) -> None:
        """Before ``nbytes`` more are allocated: out of memory past the cap or the card's room."""
        want = self.allocated + -(-int(nbytes) // BLOCK) * BLOCK
        if want <= self.reserved:
            return
        self.sweep()
        want = self.allocated + -(-int(nbytes) // BLOCK) * BLOCK
        if want <= self.reserved:
            return
        others = sum(self._others().values())
        if want > self.cap or others + CONTEXT_BYTES + want > self.size:
            import torch

            free = max(0, min(self.cap, self.size - others - CONTEXT_BYTES) - self.allocated)
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {fmt(nbytes)}. GPU 0 has a total capacity of "
                f"{fmt(self.size)} of which {fmt(free)} is free. Of the allocated memory {fmt(self.allocated)} "
                f"is allocated by PyTorch, and {fmt(self.reserved - self.allocated)} is reserved by PyTorch "
                f"but unallocated (simulated GPU, --simulate-gpu; this process's cap {fmt(self.cap)})")

    def add(self, ptr: int, nbytes: int, ref) -> None:
        """A new storage of ``nbytes`` at ``ptr``, alive while ``ref`` (a StorageWeakRef) is."""
        nbytes = -(-int(nbytes) // BLOCK) * BLOCK
        self.live[ptr] = (nbytes, ref)
        self.allocated += nbytes
        self.peak = max(self.peak, self.allocated)
        if self.allocated > self.reserved:
            self.reserved = self.allocated
            self._publish()

    def release(self, ptr: int) -> None:
        """A tracked tensor went: its storage is freed if nothing else holds it."""
        entry = self.live.get(ptr)
        if entry is not None and entry[1].expired():
            del self.live[ptr]
            self.allocated -= entry[0]

    def sweep(self) -> None:
        for ptr in [p for p, (_, ref) in self.live.items() if ref.expired()]:
            self.allocated -= self.live.pop(ptr)[0]

    # -- the card's other processes ---------------------------------------------------------------
    @contextlib.contextmanager
    def _file(self, exclusive: bool):
        fd = os.open(self.shared, os.O_RDWR | os.O_CREAT, 0o644)
        with os.fdopen(fd, "r+") as f:
            fcntl.flock(f, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            try:
                text = f.read()
                yield f, (json.loads(text) if text else {})
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def _others(self) -> dict[str, int]:
        with self._file(exclusive=False) as (_, procs):
            return {pid: used for pid, used in procs.items() if pid != str(os.getpid()) and pid_alive(int(pid))}

    def _publish(self, force: bool = False) -> None:
        if self._mode is None or (not force and self._published == self.reserved):
            return
        with self._file(exclusive=True) as (f, procs):
            procs = {pid: used for pid, used in procs.items() if pid_alive(int(pid))}
            procs[str(os.getpid())] = self._mine()
            f.seek(0)
            f.write(json.dumps(procs))
            f.truncate()
            f.flush()
        self._published = self.reserved


_CARD: list = []


def simulated() -> SimulatedCard | None:
    """This process's simulated card, when the run simulates one (``SIMULATE_ENV``)."""
    spec = os.environ.get(SIMULATE_ENV)
    if not spec:
        return None
    if not _CARD:
        size, _, shared = spec.partition(":")
        _CARD.append(SimulatedCard(int(size), Path(shared)))
    return _CARD[0]


def card_for(device: str):
    """The card a check on ``device`` uses: the CUDA device, the simulated one for the CPU's
    checks under --simulate-gpu, or None (no device memory to watch)."""
    if device == "cuda":
        import torch

        return RealCard() if torch.cuda.is_available() else None
    return simulated() if device == "cpu" else None


def simulate(size: int, directory: Path) -> None:
    """Make this process (and the processes it starts) simulate one GPU of ``size`` bytes."""
    os.environ[SIMULATE_ENV] = f"{int(size)}:{Path(directory) / 'simulated-gpu.json'}"
    _CARD.clear()
