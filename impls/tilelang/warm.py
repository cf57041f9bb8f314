"""Fill TileLang's disk cache for every kernel a harness profile will compile, in parallel.

    python -m impls.tilelang.warm [--profile full] [--jobs 16] [--arch sm_90]

The full profile needs a few hundred specializations (about 2 s each, one core each); run
this first on a many-core machine and the harness then loads them from the cache instead of
compiling them one after another inside the test run.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed


def plans_for(profile: str):
    from harness.cases import catalogue
    from impls import registry
    from impls.tilelang._plan import choose_vec

    registry.load_builtins()
    kernels = registry.kernels(["tilelang"])
    plans = {}
    for case in catalogue(profile):
        for k in kernels:
            spec = case.spec("cuda")
            if k.op != case.op or (k.max_n is not None and spec.n > k.max_n):
                continue
            # The harness's y rows are N + 16 apart (harness.guards.GAP): the same vector width.
            strides = (spec.row_stride, spec.n + 16) if spec.rows > 1 else ()
            plan = k.plan_for(spec.dtype, spec.n, spec.has_weight, spec.has_bias, choose_vec(spec.dtype, spec.n, strides))
            plans[plan.key] = plan
    return list(plans.values())


def _compile_one(plan, target):
    from impls.tilelang import _compile

    t0 = time.perf_counter()
    _compile.compile_plan(plan, target)
    return plan.describe(), time.perf_counter() - t0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m impls.tilelang.warm", description=__doc__.splitlines()[0])
    p.add_argument("--profile", default="full", choices=("quick", "full"))
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--arch", default=None, help="default: the GPU here, else sm_90")
    a = p.parse_args(argv)
    from impls.tilelang import _compile

    target = {"kind": "cuda", "arch": a.arch} if a.arch else _compile.default_target()
    plans = plans_for(a.profile)
    print(f"{len(plans)} specializations for the {a.profile} profile, target {target}, {a.jobs} jobs", flush=True)
    t0, failed = time.perf_counter(), 0
    with ProcessPoolExecutor(max_workers=a.jobs) as pool:
        futures = {pool.submit(_compile_one, plan, target): plan for plan in plans}
        for i, fut in enumerate(as_completed(futures), 1):
            try:
                what, s = fut.result()
                print(f"[{i}/{len(plans)}] {s:5.1f} s  {what}", flush=True)
            except Exception as exc:  # noqa: BLE001 (report every failure, go on)
                failed += 1
                print(f"[{i}/{len(plans)}] FAILED {futures[fut].describe()}: {exc}", file=sys.stderr, flush=True)
    print(f"done in {time.perf_counter() - t0:.0f} s, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
