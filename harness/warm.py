"""Fill the compile caches (TileLang's, Inductor's, Triton's) in parallel before a run.

    python -m harness.warm --profile full --jobs 16
    python -m harness.warm --backend tilelang --bench --jobs 16

By default every kernel that declares a compile key (``NormKernel.compile_key``: it compiles per
shape class) is warmed; ``--backend`` names others.

Kernels that compile per shape (TileLang per N, torch.compile per static shape) would otherwise
compile one after another inside the single pytest process: minutes of one busy core on a
many-core machine. This runs the same work first in worker processes, which leave the compiled
code in the on-disk caches, and the pytest run then loads it.

- default: every check's specialisations, each compile key once (the smallest case that has it;
  a kernel without keys, named by ``--backend``, once per shape class): the catalogue's oracle
  checks (``runner.check``), the backward's (``runner.check_backward``), the fused family's,
  forward and backward (``fused_runner``), batch invariance's other row counts, forward and
  backward (``properties``), and the drawn cases (harness/test_fuzz.py's draws, replayed from
  ``--fuzz-seed`` as the checks draw them). The same inputs, layouts and guarded outputs as the
  checks, so the same specialisations. Results are not reported here: only the pytest run judges.
- ``--bench``: ``kernel.prepare(spec)`` and one call for every shape of the benchmark sweep.
The largest compiles go first (drawn cases, then by case size), so a warm-up cut short by its time
limit leaves the run the cheaper ones.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures import TimeoutError as FuturesTimeout

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
    for k in registry.kernels(family=None):
        _KERNELS[(k.name, k.op)] = k


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


def _check(key, job: tuple) -> str | None:
    """One check's work on its case, as the pytest run does it: ``job`` is (what, case, profile,
    fuzz seed); what is a check family of CHECKS."""
    what, case, profile, fuzz_seed = job
    kernel = _KERNELS[key]

    def task():
        from harness.judging import fused_runner, properties, runner

        device = runner.device_for(kernel)
        quick = profile == "quick"
        calls = {"check": lambda: runner.check(kernel, case), "backward": lambda: runner.check_backward(kernel, case),
                 "fused": lambda: fused_runner.check_fused(kernel, case),
                 "fused backward": lambda: fused_runner.check_fused_backward(kernel, case),
                 "batch": lambda: properties.batch_invariance(kernel, case, device, quick),
                 "backward batch": lambda: properties.backward_batch_invariance(kernel, case, device, quick),
                 "drawn": lambda: _drawn(kernel, case, profile, fuzz_seed)}
        calls[what]()

    return _run(f"{what} {getattr(case, 'id', case)} {key[0]}", task)


def _drawn(kernel, test: str, profile: str, fuzz_seed: int) -> None:
    """harness/test_fuzz.py's check ``test`` on ``kernel``: the same draws from the same seed."""
    import pytest
    from types import SimpleNamespace

    from harness import test_fuzz

    state = SimpleNamespace(profile=profile, selection={"fuzz_seed": fuzz_seed}, watch=None)
    try:
        getattr(test_fuzz, test)(kernel, state, SimpleNamespace(node=SimpleNamespace(user_properties=[])))
    except (AssertionError, pytest.skip.Exception, pytest.fail.Exception, pytest.xfail.Exception):
        pass  # a draw that fails or a kernel that skips: the pytest run reports it


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


def tasks(backends: list[str], profile: str, bench: bool, files: tuple[str, ...], fuzz_seed: int = 0):
    from impls import registry

    registry.load_all(files)
    named = registry.expand(backends) if backends else None
    kernels = [k for k in registry.kernels(named, family=None) if not k.unavailable()]
    if bench:
        yield from _bench_tasks([k for k in kernels if k in registry.kernels(named)], profile, bool(backends))
        return
    yield from check_tasks(kernels, profile, fuzz_seed, every=bool(backends))


def _bench_tasks(kernels, profile: str, named: bool):
    from harness.benchmarks import bench_sweep as b
    from harness.judging.cases import DTYPES
    from harness.judging.runner import device_for
    from impls.base import NormKernel, NormSpec

    if not named:  # the kernels that compile per shape class
        kernels = [k for k in kernels if type(k).compile_key is not NormKernel.compile_key]
    for s in b.sweep(profile, ("rms_norm", "layer_norm"), tuple(DTYPES)):
        for k in kernels:
            if k.op != s.op:
                continue
            spec = NormSpec(op=s.op, dtype=DTYPES[s.dtype], rows=s.m, n=s.n, row_stride=s.n,
                            device=device_for(k), has_weight=True, has_bias=s.op == "layer_norm")
            if not k.unsupported(spec):
                yield _prepare, (k.name, k.op), spec


def shape_class(spec) -> tuple:
    """What a kernel without compile keys is taken to specialise on: everything but the rows."""
    from dataclasses import fields

    return tuple((f.name, str(getattr(spec, f.name))) for f in fields(spec)
                 if f.name not in ("rows", "row_stride")) + (("strided", spec.row_stride != spec.n),)


def check_tasks(kernels, profile: str, fuzz_seed: int, every: bool):
    """(fn, kernel key, job) of each check family whose specialisation is not warmed yet, largest
    first; ``every``: kernels without compile keys too (once per shape class)."""
    from dataclasses import replace

    from harness.judging import properties
    from harness.judging.cases import backward_catalogue, catalogue
    from harness.judging.fused_cases import fused_backward_catalogue, fused_catalogue, with_writes
    from harness.judging.runner import device_for

    def key(k, spec):
        got = k.compile_key(spec)
        return None if got is None and not every else (k.name, k.op, repr(got) if got is not None else shape_class(spec))

    plain, fused = [k for k in kernels if k in _plain(kernels)], [k for k in kernels if k not in _plain(kernels)]
    families = [("check", catalogue(profile), plain, ()), ("backward", backward_catalogue(profile), plain, ()),
                ("batch", properties.batch_cases(profile), plain, "sizes"),
                ("backward batch", properties.backward_batch_cases(profile), plain, "sizes")]
    done, out = set(), []
    for k in plain + fused:  # the drawn cases: each draw a shape class of its own, so first
        if every or k.compile_key(_any_spec(k)) is not None:
            out += [(_check, (k.name, k.op), ("drawn", test, profile, fuzz_seed)) for test in _drawn_tests(k)]
    for what, cases, ks, sizes in families:
        # Many workers share the GPU: a case above WARM_BYTES compiles in the run (its plans are
        # mostly warmed by smaller cases).
        for case in sorted((c for c in cases if c.nbytes() <= WARM_BYTES), key=lambda c: c.rows * c.n):
            for k in (k for k in ks if k.op == case.op):
                device = device_for(k)
                spec = case.spec(device)
                if k.unsupported(spec) or ("backward" in what and not k.has_backward):
                    continue
                rows = properties.batch_sizes(k, case, device, profile == "quick") if sizes else ()
                side = "backward" if "backward" in what else "forward"  # each compiles apart
                keys = {(side, key(k, replace(spec, rows=m))) for m in (spec.rows, *rows)} - {(side, None)}
                if keys - done:
                    done |= keys
                    out.append((_check, (k.name, k.op), (what, case, profile, fuzz_seed)))
    for what, cases in (("fused", fused_catalogue(profile)), ("fused backward", fused_backward_catalogue(profile))):
        for k in fused:
            runs = [c for c in with_writes(cases, k, device_for(k), what != "fused") if c.nbytes() <= WARM_BYTES]
            for case in sorted(runs, key=lambda c: c.rows * c.n):
                got = (what, key(k, case.spec(device_for(k))))
                if got[1] is not None and got not in done:
                    done.add(got)
                    out.append((_check, (k.name, k.op), (what, case, profile, fuzz_seed)))
    return out


def _plain(kernels) -> list:
    from impls import registry

    plain = {id(k) for k in registry.kernels(None)}
    return [k for k in kernels if id(k) in plain]


def _any_spec(kernel):
    from harness.judging.cases import Case
    from harness.judging.runner import device_for

    return Case(kernel.op if kernel.op in ("rms_norm", "layer_norm") else "rms_norm", "bfloat16", (64, 4096)).spec(
        device_for(kernel))


def _drawn_tests(kernel) -> list[str]:
    """harness/test_fuzz.py's checks that take this kernel (plain ``kernel``, or ``fused_kernel``)."""
    import inspect

    from harness import test_fuzz
    from impls import registry

    fixture = "kernel" if any(k is kernel for k in registry.kernels(None)) else "fused_kernel"
    return [name for name, fn in vars(test_fuzz).items() if name.startswith("test_") and callable(fn)
            and next(iter(inspect.signature(fn).parameters), None) == fixture]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.warm", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="", help="comma-separated backends or patterns (default: those that compile)")
    p.add_argument("--backend-file", action="append", default=[])
    p.add_argument("--profile", default="full", choices=("quick", "full"))
    p.add_argument("--fuzz-seed", type=int, default=0, help="the drawn cases' seed, as the checks' --fuzz-seed")
    p.add_argument("--bench", action="store_true", help="the benchmark sweep's shapes instead of the checks")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--time-limit", type=float, default=None, metavar="S",
                   help="stop after S seconds: tasks not begun are dropped, running ones ended (the run compiles them)")
    a = p.parse_args(argv)
    files = tuple(a.backend_file)
    work = list(tasks([b for b in a.backend.split(",") if b], a.profile, a.bench, files, a.fuzz_seed))
    # Drawn cases first (each draw compiles), the rest shuffled: kernels of one backend spread
    # over the workers rather than queued behind each other's compile locks.
    drawn = [w for w in work if isinstance(w[2], tuple) and w[2][0] == "drawn"]
    rest = [w for w in work if w not in drawn]
    random.Random(0).shuffle(rest)
    work = drawn + rest
    print(f"warming {len(work)} {'benchmark shapes' if a.bench else 'check specialisations'} on {a.jobs} processes",
          flush=True)
    t0 = time.perf_counter()
    problems, left = _pool(work, a.jobs, files, a.time_limit)
    print(f"warmed in {time.perf_counter() - t0:.0f} s; {len(problems)} raised (the run reports them)"
          + (f"; {left} not warmed: the time limit of {a.time_limit:g} s" if left else ""), flush=True)
    for line in problems[:10]:
        print("  " + line)
    return 0


def _pool(work, jobs: int, files, limit: float | None) -> tuple[list[str], int]:
    """Run ``work`` on ``jobs`` spawned processes (CUDA cannot be used in forked children); at the
    time limit, the tasks not begun are cancelled and the processes ended, none left holding a GPU."""
    problems = []
    pool = ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn"), initializer=_init, initargs=(files,))
    futures = [pool.submit(fn, key, arg) for fn, key, arg in work]
    try:
        for fut in as_completed(futures, timeout=limit):
            problem = outcome(fut)
            if problem:
                problems.append(problem)
    except FuturesTimeout:
        pass
    left = sum(not f.done() for f in futures)
    if left:
        processes = list((pool._processes or {}).values())  # noqa: SLF001 (ended below, not waited on)
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in processes:
            proc.terminate()
        for proc in processes:
            proc.join(10)
    else:
        pool.shutdown()
    return problems, left


if __name__ == "__main__":
    raise SystemExit(main())
