"""Fill the compile caches (TileLang's, Inductor's, Triton's) in parallel before a run.

    python -m harness.warm --profile full --jobs 16
    python -m harness.warm --backend tilelang --bench --jobs 16

By default every kernel that declares a compile key (``NormKernel.compile_key``: it compiles per
shape class) is warmed; ``--backend`` names others.

Kernels that compile per shape (TileLang per N, torch.compile per static shape) would otherwise
compile one after another inside the single pytest process: minutes of one busy core on a
many-core machine. This runs the same work first in worker processes, which leave the compiled
code in the on-disk caches, and the pytest run then loads it.

- default: every catalogue case of the profile through ``harness.judging.runner.check``: the same
  inputs, layouts and guarded outputs as the checks, so the same specialisations. Results are
  not reported here: only the pytest run judges.
- ``--bench``: ``kernel.prepare(spec)`` and one call for every shape of the benchmark sweep.
Drawn (hypothesis) cases are random and cannot be warmed.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

_KERNELS: dict = {}
# Largest x a worker prepares: many workers share one GPU's memory.
WARM_BYTES = 2**31
# Set in a worker once a kernel left its CUDA context unusable (a sticky error: illegal address
# or instruction): every later task of that worker is refused with this, not run, so one
# faulting kernel costs the warm-up that worker's share, never the whole warm-up. The pytest
# run compiles what was not warmed and reports the fault against its case.
_LOST: str | None = None


def _init(files: tuple[str, ...]) -> None:
    from impls import registry

    registry.load_all(files)
    for k in registry.kernels():
        _KERNELS[(k.op, k.backend, k.variant)] = k


def _release(what: str) -> str | None:
    """Hand a worker's cached device memory back after each task: the workers share one GPU, and
    memory one keeps cached another cannot use (16 workers ran out of 140 GB without this). A
    CUDA context the task left unusable raises here: the worker is marked lost (_LOST)."""
    global _LOST
    import torch

    try:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    except Exception as exc:  # noqa: BLE001 (a sticky CUDA error: this worker can run nothing more)
        _LOST = f"{what}: {type(exc).__name__}: {exc}"[:300]
        return f"{_LOST} (the CUDA context of this worker is lost; its later tasks are not warmed)"
    return None


def _run(what: str, task) -> str | None:
    """One warm-up task in a worker: None, or what went wrong (never raises: a failure here is
    the pytest run's to report, against its case)."""
    if _LOST:
        return f"{what}: not warmed: this worker's CUDA context was lost after {_LOST}"[:400]
    try:
        task()
        problem = None
    except Exception as exc:  # noqa: BLE001
        problem = f"{what}: {type(exc).__name__}: {exc}"[:300]
    return _release(what) or problem


def _check(key, case_id: str) -> str | None:
    from harness.judging import runner
    from harness.judging.cases import case_from_id

    return _run(f"{case_id} {key}", lambda: runner.check(_KERNELS[key], case_from_id(case_id)))


def _prepare(key, spec) -> str | None:
    from harness.judging.cases import Case, affine_of
    from harness.judging.inputs import make_inputs
    from impls.base import dtype_name

    k = _KERNELS[key]

    def task():
        if spec.rows * spec.n * spec.dtype.itemsize <= WARM_BYTES:  # bigger ones compile in the run
            k.prepare(spec)
        # One real call too: JIT backends (Triton, Liger) compile on first call, per specialisation
        # (which does not depend on M beyond M % 16, kept by 64 or 65 rows).
        rows = spec.rows if spec.rows <= 64 else (64 if spec.rows % 16 == 0 else 65)
        case = Case(spec.op, dtype_name(spec.dtype), (rows, spec.n), affine=affine_of(spec.has_weight, spec.has_bias))
        drawn = make_inputs(case, spec.device)
        k(drawn.x, drawn.weight, drawn.bias, drawn.eps)

    return _run(f"{spec} {key}", task)


def outcome(fut) -> str | None:
    """A finished task's problem, or None; a worker that died (a crash past Python) is one too."""
    try:
        return fut.result()
    except Exception as exc:  # noqa: BLE001 (BrokenProcessPool and the like: reported, not raised)
        return f"a warm-up worker failed: {type(exc).__name__}: {exc}"[:300]


def tasks(backends: list[str], profile: str, bench: bool, files: tuple[str, ...]):
    from harness.judging.cases import catalogue
    from harness.judging.runner import device_for
    from impls import registry
    from impls.base import NormKernel

    registry.load_all(files)
    kernels = [k for k in registry.kernels(registry.expand(backends) if backends else None) if not k.unavailable()]
    if not backends:  # the kernels that compile per shape class
        kernels = [k for k in kernels if type(k).compile_key is not NormKernel.compile_key]
    if bench:
        from harness.benchmarks import bench_sweep as b
        from harness.judging.cases import DTYPES
        from impls.base import NormSpec

        for s in b.sweep(profile, ("rms_norm", "layer_norm"), tuple(DTYPES)):
            for k in kernels:
                if k.op != s.op:
                    continue
                spec = NormSpec(op=s.op, dtype=DTYPES[s.dtype], rows=s.m, n=s.n, row_stride=s.n,
                                device=device_for(k), has_weight=True, has_bias=s.op == "layer_norm")
                if not k.unsupported(spec):
                    yield _prepare, (k.op, k.backend, k.variant), spec
        return
    for case in catalogue(profile):
        if case.nbytes() > WARM_BYTES:  # many workers share the GPU: its plans are warmed by smaller cases
            continue
        for k in kernels:
            if k.op == case.op and not k.unsupported(case.spec(device_for(k))):
                yield _check, (k.op, k.backend, k.variant), case.id


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.warm", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="", help="comma-separated backends or patterns (default: those that compile)")
    p.add_argument("--backend-file", action="append", default=[])
    p.add_argument("--profile", default="full", choices=("quick", "full"))
    p.add_argument("--bench", action="store_true", help="the benchmark sweep's shapes instead of the checks")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    a = p.parse_args(argv)
    files = tuple(a.backend_file)
    work = list(tasks([b for b in a.backend.split(",") if b], a.profile, a.bench, files))
    # Cases sharing a specialisation sit next to each other in the catalogue; shuffled, two
    # workers rarely compile the same one at once, and the later one loads it from the cache.
    random.Random(0).shuffle(work)
    print(f"warming {len(work)} {'benchmark shapes' if a.bench else 'checks'} on {a.jobs} processes", flush=True)
    t0, problems = time.perf_counter(), []
    # spawn: CUDA cannot be used in forked children.
    with ProcessPoolExecutor(a.jobs, mp_context=mp.get_context("spawn"), initializer=_init, initargs=(files,)) as pool:
        futures = [pool.submit(fn, key, arg) for fn, key, arg in work]
        for fut in as_completed(futures):
            problem = outcome(fut)
            if problem:
                problems.append(problem)
    print(f"warmed in {time.perf_counter() - t0:.0f} s; {len(problems)} raised (the run reports them)", flush=True)
    for line in problems[:10]:
        print("  " + line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
