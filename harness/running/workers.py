"""How many xdist workers run the checks, and which GPU each is pinned to (harness.running.isolation
says why workers at all): a worker's GPU is CUDA_VISIBLE_DEVICES in its xdist spec, so a
replacement keeps it; ``--workers-per-gpu`` sets how many share one, within the GPU's memory
budget (harness.running.memory.workers_for)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.running import memory, run

try:
    from xdist.scheduler import LoadScopeScheduling
except ImportError:  # pytest-xdist not installed: checks run in one process
    LoadScopeScheduling = object

XDIST = LoadScopeScheduling is not object
FAKE_GPUS_ENV = "NORMDIFF_FAKE_GPUS"  # simulate a host with this many GPUs (tests of the pinning)
ROOT = Path(__file__).resolve().parents[2]


def visible_gpus() -> list[str]:
    """The GPUs workers are pinned to, as CUDA_VISIBLE_DEVICES tokens."""
    fake = os.environ.get(FAKE_GPUS_ENV)
    if fake:
        return [str(i) for i in range(int(fake))]
    from harness.running import devmem

    if devmem.simulated() is not None:
        return ["0"]
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    from impls.base import cuda_present

    if not cuda_present():
        return []
    import torch

    count = torch.cuda.device_count()
    tokens = [t.strip() for t in listed.split(",") if t.strip()] if listed else []
    return tokens[:count] if tokens else [str(i) for i in range(count)]


def _runs_only_under(config, folder: str) -> bool:
    """Whether every path the run was given lies in the project's ``folder``."""
    args = [a.split("::")[0] for a in config.args] or []
    if not args:
        return False
    root = ROOT / folder
    for a in args:
        p = Path(a) if Path(a).is_absolute() else Path(config.invocation_params.dir) / a
        try:
            p.resolve().relative_to(root)
        except ValueError:
            return False
    return True


def _runs_harness_only(config) -> bool:
    """Isolation is the default for runs of the harness's checks (``pytest harness ...``), not
    for the framework's own tests, whose subprocess runs set their own."""
    return _runs_only_under(config, "harness")


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def plan_workers(config) -> None:
    """Before xdist reads its options: choose the workers and pin each to a GPU."""
    # A worker runs this hook too; with -p no:xdist the plugin is installed but not loaded.
    if not XDIST or hasattr(config, "workerinput") or not hasattr(config.option, "numprocesses"):
        return
    asked = config.option.numprocesses  # None unless -n was given
    if run.is_benchmark_run(config):
        if asked:
            raise pytest.UsageError("benchmarks time one GPU per process and are not xdist workers: drop -n "
                                    "(several GPUs: one pytest per GPU, see README)")
        config.option.numprocesses = 0
        return
    if config.getoption("usepdb", False) or config.getoption("collectonly", False):
        return
    if asked is None and _runs_only_under(config, "tests") and not visible_gpus() and _cores() > 1:
        # The framework's own tests (``pytest tests``) on a machine without a GPU: as with -n
        # CORES, one worker per core (they share nothing but caches that lock); -n 0 runs them in
        # one process, as on a GPU machine, where the native and kernel tests share one device.
        asked = _cores()
    if asked == 0 or (asked is None and not _runs_harness_only(config)):
        return
    gpus = visible_gpus()
    cores = _cores()
    budgets = memory.gpu_budgets(config.getoption("gpu_memory"), gpus)
    if asked in (None, "auto", "logical"):
        per_gpu = config.getoption("workers_per_gpu") or max(1, cores // max(1, len(gpus)))
        if budgets and not config.getoption("workers_per_gpu"):  # no more workers than the memory holds
            per_gpu = min(memory.workers_for(b, per_gpu) for b in budgets.values())
        count = per_gpu * len(gpus) if gpus else max(1, cores)
    else:
        count = int(asked)
    config._normdiff_gpu_budgets = budgets  # noqa: SLF001 (memory_watch.Ledgers writes each GPU's ledger)
    specs = [f"popen//env:CUDA_VISIBLE_DEVICES={gpus[i % len(gpus)]}" if gpus else "popen" for i in range(count)]
    config.option.numprocesses = None  # xdist would replace the specs with plain popen
    config.option.tx = specs
    if config.option.dist == "no":
        config.option.dist = "loadscope"
    config._normdiff_schedule = True  # noqa: SLF001 (pytest_xdist_make_scheduler)
    if config.option.maxworkerrestart is None:
        # Every kernel may crash --crash-limit times before it is stopped, plus some slack.
        from impls import registry

        registry.load_all(config.getoption("backend_file"))
        limit = config.getoption("crash_limit") * max(1, len(registry.backends())) * 2 + 2 * count
        config.option.maxworkerrestart = str(limit)
