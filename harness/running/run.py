"""What the checks (harness.plugin) and the benchmarks (harness.bench) share about a run: the
selection options, the environment and command a report names, the backends' status, and the
partial reports written while a run goes on."""
from __future__ import annotations

import os
import platform
import shlex
import subprocess
import time
import warnings
from pathlib import Path

import pytest
import torch

from impls.base import NormKernel

# Variables that change what a check runs: a reproduce command sets them as the run had them.
REPRO_ENV = ("TRITON_INTERPRET", "NORMDIFF_COMPILE_ROWS", "CUDA_VISIBLE_DEVICES")
PARTIAL_REPORT_S = 60.0  # seconds between partial reports during a run
# The run's HarnessState (harness.plugin): selection, kernels, records; read by the benchmarks too.
STATE = pytest.StashKey["HarnessState"]()


def is_benchmark_run(config) -> bool:
    """Whether this pytest run times benchmarks (``--benchmark-only``) rather than checking."""
    return bool(config.getoption("benchmark_only", False))


def write_partial(owner) -> None:
    """Every PARTIAL_REPORT_S, ``owner.write_report(final=False)`` (the correctness state, the
    benchmark context), so a run that is killed leaves its last report. A partial report that
    cannot be written warns and never ends the run: the final one is where an error must show."""
    if time.time() - owner._last_write <= PARTIAL_REPORT_S:
        return
    owner._last_write = time.time()
    try:
        owner.write_report(final=False)
    except Exception as exc:
        warnings.warn(f"partial report not written: {type(exc).__name__}: {exc}")


def report_dir(config, kind: str) -> Path:
    """Where this run's report goes: ``--report-dir``, else a folder of its own,
    ``reports/runs/<date-time>-<kind>-<selection>/``, which ``reports/latest`` then points to,
    so one run never overwrites another (``python -m harness.report --compare A B``)."""
    chosen = config.getoption("report_dir")
    if chosen:
        return Path(chosen)
    if not hasattr(config, "_normdiff_run_dir"):
        sel = [config.getoption(o) for o in ("backend", "op", "dtype")] + [config.getoption("profile") or ""]
        shard = config.getoption("shard")
        words = [kind, *(v for v in sel if v and v != "all"), *([f"shard{shard.replace('/', 'of')}"] if shard else [])]
        slug = "-".join(words).replace(",", "+").replace("*", "x")
        slug = "".join(c if c.isalnum() or c in "+-_." else "_" for c in slug)[:80]
        name = time.strftime("%Y%m%d-%H%M%S", time.localtime()) + "-" + slug
        config._normdiff_run_dir = Path(config.rootpath) / "reports" / "runs" / name  # noqa: SLF001
    return config._normdiff_run_dir  # noqa: SLF001


def point_latest(config, directory: Path) -> None:
    """``reports/latest`` -> the run folder just written (only for run folders, not --report-dir)."""
    if config.getoption("report_dir"):
        return
    latest = Path(config.rootpath) / "reports" / "latest"
    tmp = latest.with_name(".latest.tmp")
    try:
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(directory.relative_to(latest.parent))
        os.replace(tmp, latest)
    except OSError as exc:  # a file system without links: the summary still names the folder
        warnings.warn(f"reports/latest not updated: {exc}")


def split_names(value: str, allowed: tuple[str, ...] | None, what: str) -> tuple[str, ...] | None:
    if value == "all":
        return None
    names = tuple(v.strip() for v in value.split(",") if v.strip())
    if allowed is not None:
        bad = [n for n in names if n not in allowed]
        if bad:
            from impls.registry import KNOWN_PLUGINS

            hints = [f"{n} is a plug-in: add --backend-file {KNOWN_PLUGINS[n]}" for n in bad if n in KNOWN_PLUGINS]
            raise pytest.UsageError(f"unknown {what} {', '.join(bad)}; expected all or {', '.join(allowed)}"
                                    + "".join(f"; {h}" for h in hints))
    return names


def backend_status(kernels: list[NormKernel]) -> dict[str, tuple[str, str | None]]:
    """backend -> (how it runs here, why it cannot run here or None)."""
    by_backend: dict[str, list[NormKernel]] = {}
    for k in kernels:
        by_backend.setdefault(k.backend, []).append(k)
    status = {}
    for backend, ks in by_backend.items():
        whys = {k: k.unavailable() for k in ks}
        if all(whys.values()):  # the whole backend cannot run: its first reason says why
            status[backend] = (ks[0].note(), whys[ks[0]])
            continue
        # Some kernels can run: the note names those that cannot.
        partial = "; ".join(f"{k.op} {k.name} unavailable: {why}" for k, why in whys.items() if why)
        status[backend] = ("; ".join(filter(None, [ks[0].note(), partial])), None)
    return status


def invocation(config) -> str:
    return "pytest " + " ".join(shlex.quote(a) for a in config.invocation_params.args)


def _simulated_gpu() -> str | None:
    from harness.running import devmem

    card = devmem.simulated()
    return f"none: a simulated GPU of {card.size / 2**30:g} GiB (--simulate-gpu; checks run on the CPU)" if card else None


def environment(kernels=()) -> dict:
    """What a report names about the machine and software; ``versions``: the distributions the
    run's kernels declare (``NormKernel.packages``), as installed."""
    import importlib.metadata as md

    def version(pkg):
        try:
            return md.version(pkg)
        except md.PackageNotFoundError:
            return "not installed as a distribution"

    packages = sorted({p for k in kernels for p in k.packages})
    env = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "versions": ", ".join(f"{p} {version(p)}" for p in packages) or None,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else _simulated_gpu(),
        "triton_interpret": os.environ.get("TRITON_INTERPRET"),
        # What a reproduce command must set again (harness.report.repro_command).
        "repro_env": {k: os.environ[k] for k in REPRO_ENV if os.environ.get(k)},
    }
    # A copy of the tree run elsewhere (the GPU machine) may carry stale git metadata: the
    # runner then names the commit it copied.
    if os.environ.get("NORMDIFF_COMMIT"):
        env["commit"] = os.environ["NORMDIFF_COMMIT"]
        return _with_driver(env)
    try:
        env["commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
            cwd=Path(__file__).parent,
        ).stdout.strip() or None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=10, cwd=Path(__file__).parent).stdout.strip()
        if env["commit"] and dirty:
            env["commit"] += " (with uncommitted changes)"
    except (OSError, subprocess.SubprocessError):
        env["commit"] = None
    return _with_driver(env)

def _with_driver(env: dict) -> dict:
    if torch.cuda.is_available():
        try:
            env["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=20,
            ).stdout.strip().splitlines()[0]
        except (OSError, subprocess.SubprocessError, IndexError):
            env["driver"] = None
    return env


def device_name(device: str) -> str:
    """The device a row was timed on; with a GPU its index as the process sees it set (one
    process times one GPU: CUDA_VISIBLE_DEVICES), so merged runs name the GPU of each row."""
    gpu = os.environ.get("CUDA_VISIBLE_DEVICES")
    if device == "cuda":
        return f"{torch.cuda.get_device_name()} #{gpu if gpu is not None else torch.cuda.current_device()}"
    if gpu is not None and os.environ.get("NORMDIFF_FAKE_GPUS"):  # a simulated multi-GPU host
        return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads) #{gpu}"
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
