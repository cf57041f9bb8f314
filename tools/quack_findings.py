"""QuACK's findings (examples/quack_backend.py), reproduced outside the harness and without a GPU:
QuACK's own functions called as its entry points call them, compiled for sm_90 on the CPU.

    QUACK_ARCH=sm_90 CUTE_DSL_ARCH=sm_90a QUACK_CACHE_ENABLED=0 python -m tools.quack_findings [what]

with quack-kernels 0.6.5 and nvidia-cutlass-dsl 4.7.1 installed (torch from the project's
environment). ``what``: one or more of

- ``autotune``: ``rmsnorm_fwd_tuned``'s autotuner at N < 64. Its menu's pruner leaves no config,
  and the call raises ValueError from ``builtins.min`` over the empty timings. The only change to
  QuACK is that its GPU warm-up, a loop of matrix products on the GPU, is skipped: with no config
  to time, nothing else in the call needs a GPU.
- ``odd``: the forward and the backward of bfloat16 rows of odd N. The CuTe DSL refuses to build
  either (cp_size 16). N = 6 compiles as a control.
- ``launch``: one config of the autotune menu (128 threads, 64 per row, cluster 1) at bfloat16
  N = 131072. It compiles, and its host code checks the shared memory the launch asks for (read
  from the compiled module) against sm_90's 232448 bytes. The CuTe DSL's launch error type is not
  a RuntimeError, and the autotuner's bench catches only RuntimeError and MemoryError.

Each compile takes 20 to 30 s on two CPU cores.
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import os
import re
import sys

import torch

SM90_SMEM_BYTES = 232448


def _rmsnorm():
    return importlib.import_module("quack.rmsnorm")  # the attribute quack.rmsnorm is the function


def autotune(ns=(1, 2, 32, 63, 64)) -> list[str]:
    """For each N: the configs QuACK's pruner leaves of its menu, and what the tuned call does on
    CPU tensors of 3 x N (its GPU warm-up skipped)."""
    import quack.autotuner as autotuner
    from quack.rmsnorm_config import get_all_fwd_configs, prune_invalid_rmsnorm_fwd_configs
    from quack.autotuner import AutotuneConfig

    autotuner._gpu_warmup = lambda duration_ms=200: None  # the only change: no GPU to warm
    menu = [AutotuneConfig(config=c) for c in get_all_fwd_configs()]
    lines = [f"menu: {len(menu)} configs (threads per row: "
             f"{sorted({c.kwargs['config'].threads_per_row for c in menu})})"]
    for n in ns:
        x = torch.randn(3, n, dtype=torch.bfloat16)
        left = prune_invalid_rmsnorm_fwd_configs(menu, {"x": x})
        if left:
            lines.append(f"N={n}: {len(left)} configs left by the pruner (timing them needs a GPU)")
            continue
        try:
            _rmsnorm().rmsnorm_fwd_tuned(x, torch.ones(n, dtype=x.dtype), torch.empty_like(x), None,
                                         torch.empty(3), None, eps=1e-6, is_layernorm=False, per_head=False)
            got = "returned"
        except Exception as exc:  # noqa: BLE001 (what QuACK raises is the finding)
            got = f"{type(exc).__name__}: {exc}"
        lines.append(f"N={n}: 0 configs left by the pruner; rmsnorm_fwd_tuned raised {got}")
    return lines


def _compile(fn, *args, **kwargs) -> str:
    try:
        fn(*args, **kwargs)
        return "compiled"
    except Exception as exc:  # noqa: BLE001 (the refusal is the finding)
        found = re.search(r"'cp_size' only supports[^\n]*(?:\n[^\n]*got \d+)?", str(exc))
        return f"{type(exc).__name__}: " + (" ".join(found.group(0).split()) if found else str(exc)[:300])


def odd() -> list[str]:
    """The forward and backward compiles of bfloat16 rows of 7 (odd) and of 6 (the control)."""
    import cutlass

    r, bf = _rmsnorm(), cutlass.BFloat16
    lines = []
    for n in (7, 6):
        # rmsnorm_fwd(x, w, store_rstd=True): x, y, weight in x's dtype; rstd; no residual, bias or mean.
        fwd = _compile(r._compile_rmsnorm_fwd, bf, bf, None, bf, None, None, n, True, False, False, False)
        # rmsnorm_bwd(x, w, dy, rstd): dx of x's dtype, weight, dw partials; no db or residual.
        bwd = _compile(r._compile_rmsnorm_bwd, n, bf, bf, bf, bf, False, None, None, True, False, 16)
        lines += [f"bfloat16 N={n}: forward {fwd}", f"bfloat16 N={n}: backward {bwd}"]
    return lines


def launch(n: int = 131072) -> list[str]:
    """The shared memory one menu config asks at bfloat16 N, from its compiled host code, and why
    the autotuner lets its launch error through."""
    import cutlass
    from cutlass.cutlass_dsl.tvm_ffi_provider import CUDADialectError
    from quack.rmsnorm_config import RmsNormFwdConfig

    import quack.autotuner as autotuner

    cfg = RmsNormFwdConfig(num_threads=128, threads_per_row=64, cluster_n=1, reload_from=None)
    bf = cutlass.BFloat16
    compiled = _rmsnorm()._compile_rmsnorm_fwd(bf, bf, None, bf, None, None, n, True, False, False, False,
                                               0.0, config=cfg)
    ir = str(getattr(compiled, "ir_module", ""))
    limit = re.search(r"shared memory exceeds current GPU arch (\w+) allowed.*?Max: (\d+) bytes", ir)
    asked = sorted({int(v) for v in re.findall(r"llvm\.mlir\.constant\((\d+) : i(?:32|64)\)", ir)
                    if SM90_SMEM_BYTES < int(v) < 2**31 - 1 and int(v) != n})
    lines = [f"config {cfg} at bfloat16 N={n}: compiled",
             f"  its host code checks the launch's shared memory against {limit.group(2)} bytes ({limit.group(1)})"
             if limit else "  no shared-memory check found in its host code (compiled module cached? "
                           "set QUACK_CACHE_ENABLED=0)",
             f"  constants above that limit in the module: {asked} (sX: 2 rows x {n} x 2 bytes = {4 * n})"]
    bases = [c.__name__ for c in CUDADialectError.__mro__]
    lines.append(f"CUDADialectError's bases: {' > '.join(bases)}; a RuntimeError: "
                 f"{issubclass(CUDADialectError, RuntimeError)}")
    catches = [ln.strip() for ln in inspect.getsource(autotuner.Autotuner._bench).splitlines()
               if ln.strip().startswith("except")]
    lines.append(f"Autotuner._bench catches: {catches}")
    return lines


STEPS = {"autotune": autotune, "odd": odd, "launch": launch}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", nargs="*", help=f"any of {', '.join(STEPS)} (default: all)")
    args = parser.parse_args(argv)
    unknown = [w for w in args.what if w not in STEPS]
    if unknown:
        parser.error(f"unknown: {', '.join(unknown)} (choose from {', '.join(STEPS)})")
    if not os.environ.get("QUACK_ARCH"):
        print("set QUACK_ARCH=sm_90 CUTE_DSL_ARCH=sm_90a (no GPU: QuACK targets the arch named)", file=sys.stderr)
        return 2
    for what in args.what or STEPS:
        print(f"== {what}")
        for line in STEPS[what]():
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
