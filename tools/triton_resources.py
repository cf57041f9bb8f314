"""Registers, spill stack and blocks per SM of the Triton kernels as the launcher runs them,
compiled for sm_90 on any machine, GPU or not (Triton's own ptxas and cuobjdump).

With one row per program the grid is wide and the time is set by how many programs an SM holds,
which ptxas decides: two registers over a step halve it. At LayerNorm bf16 16384 the 1-D form
took 82 registers (one block of 512 threads per SM) where the tile form took 64 (two), and
measured 58.9% of copy against 92.7%; a cap of 64 registers gave it 92.7% back
(docs/perf-notes.md, item 31). Read this before timing a launch setting.

    python -m tools.triton_resources --op layer_norm --dtype bfloat16 --ns 8192,16384
    python -m tools.triton_resources --op rms_norm --dtype float32 --ns 12288 --forms
    python -m tools.triton_resources --op layer_norm --dtype bfloat16 --ns 4096,16384 --backward

Rows: M only picks the launch rule (decode at M <= 128); up to 256 rows are allocated (on the
CPU, never touched). The split variant is left out: its launcher asks the GPU how many programs
fit. ``--forms`` also compiles the other rowwise form (1-D / tile) of each one-row setting.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

import torch

from impls.gpu_limits import blocks_per_sm

SM90 = ("cuda", 90, 32)
TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int64: "i64", torch.int32: "i32",
         torch.float8_e4m3fn: "fp8e4nv", torch.float8_e5m2: "fp8e5"}


@dataclasses.dataclass
class Resources:
    kernel: str
    config: object
    registers: int
    stack: int  # bytes of local memory per thread: spills
    blocks_per_sm: int


def _tool(name: str) -> str:
    import triton.backends.nvidia as nvidia

    return os.path.join(os.path.dirname(nvidia.__file__), "bin", name)


def compile_sm90(fn, args: tuple, kwargs: dict):
    """Compile a @triton.jit function for sm_90 with the signature and the 16-byte specialisation
    Triton would give these arguments at run time."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    options = {k: kwargs[k] for k in ("num_warps", "maxnreg") if k in kwargs}
    sig, consts, attrs = {}, {}, {}
    positional = iter(args)
    for i, param in enumerate(fn.params):
        v = kwargs[param.name] if param.name in kwargs else next(positional, param.default)
        if v is inspect.Parameter.empty:
            raise TypeError(f"{fn.__name__}: no value for {param.name}")
        if param.is_constexpr:
            sig[param.name], consts[param.name] = "constexpr", v
            continue
        if isinstance(v, torch.Tensor):
            sig[param.name] = "*" + TYPES[v.dtype]
            aligned = v.data_ptr() % 16 == 0
        elif isinstance(v, float):
            sig[param.name], aligned = "fp32", False
        else:
            sig[param.name] = "i32" if -2**31 <= v < 2**31 else "i64"
            aligned = v % 16 == 0
        if aligned:
            attrs[(i,)] = [["tt.divisibility", 16]]
    return triton.compile(ASTSource(fn, sig, consts, attrs), target=GPUTarget(*SM90), options=options)


def resources(op: str, variant: str, dtype: torch.dtype, n: int, m: int = 16384, cfg=None) -> Resources:
    """Compile what ``variant`` launches for M x N rows of ``dtype`` (its own launch setting, or
    ``cfg``) and read its resource usage. In a process whose impls.triton runs the interpreter
    this cannot compile: import triton before impls (main does)."""
    import impls.triton  # noqa: F401  (registers its kernels)
    from impls import registry

    if variant == "split":
        raise ValueError("the split variant's launch needs a GPU (it counts resident programs)")
    kernel = registry.get(op, "triton", variant)
    rows = m if m <= 256 else 256
    x = torch.empty(rows, n, dtype=dtype)
    w = torch.empty(n, dtype=dtype)
    b = torch.empty(n, dtype=dtype) if op == "layer_norm" else None
    launch, = kernel.launches(x, w, b, cfg=cfg or kernel.config(n, dtype, m))
    name, args, kwargs, cfg = launch.kernel_name, launch.args, dict(launch.kwargs), launch.cfg
    if cfg.maxnreg:  # launch_kwargs drops the cap under the interpreter; compiling, keep it
        kwargs["maxnreg"] = cfg.maxnreg
    compiled = compile_sm90(launch.fn, args, kwargs)
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        usage = subprocess.run([_tool("cuobjdump"), "-res-usage", str(cubin)], capture_output=True, text=True,
                               check=True).stdout
    regs = int(re.search(r"REG:(\d+)", usage).group(1))
    stack = int(re.search(r"STACK:(\d+)", usage).group(1))
    return Resources(name, cfg, regs, stack, blocks_per_sm(regs, cfg.num_warps, compiled.metadata.shared))


def _usage(compiled) -> tuple[int, int]:
    """Registers and stack bytes per thread of a compiled kernel, from cuobjdump."""
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        usage = subprocess.run([_tool("cuobjdump"), "-res-usage", str(cubin)], capture_output=True, text=True,
                               check=True).stdout
    return int(re.search(r"REG:(\d+)", usage).group(1)), int(re.search(r"STACK:(\d+)", usage).group(1))


def backward_resources(op: str, dtype: torch.dtype, n: int, m: int = 16384) -> list[Resources]:
    """Compile every kernel the Triton backward launches for M x N rows (full affine) and read
    each one's resource usage (TritonBackward.backward_launches; setting: settings.backward_config)."""
    import impls.triton  # noqa: F401
    from impls import registry
    from impls.triton.settings import backward_config

    kernel = registry.get(op, "triton", "invariant")
    rows = m if m <= 256 else 256
    x = torch.empty(rows, n, dtype=dtype)
    w = torch.empty(n, dtype=dtype)
    b = torch.empty(n, dtype=dtype) if op == "layer_norm" else None
    cfg = backward_config(n, dtype, op)
    found = []
    for name, fn, args, kwargs in kernel.backward_launches(x, w, b, cfg):
        compiled = compile_sm90(fn, args, kwargs)
        regs, stack = _usage(compiled)
        own = cfg if name != "bwd_reduce" else dataclasses.replace(
            cfg, block_n=kwargs["BLOCK_N"], rows=kwargs["PARTS"], num_warps=kwargs["num_warps"])
        found.append(Resources(name, own, regs, stack, blocks_per_sm(regs, own.num_warps, compiled.metadata.shared)))
    return found


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--op", default="layer_norm", choices=("rms_norm", "layer_norm"))
    p.add_argument("--variant", default="rowwise", choices=("rowwise", "looped"))
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--ns", default="4096,8192,16384")
    p.add_argument("--m", type=int, default=16384)
    p.add_argument("--forms", action="store_true", help="rowwise at one row per program: both forms")
    p.add_argument("--json", help="also write the rows here")
    p.add_argument("--backward", action="store_true", help="the backward's kernels instead (any --variant)")
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        p.error("TRITON_INTERPRET=1: the interpreter's kernels cannot be compiled; unset it")
    # triton before impls.triton: on a machine without a GPU that package would otherwise choose
    # Triton's interpreter, whose kernels cannot be compiled.
    importlib.import_module("triton")
    rows = []
    dtype = getattr(torch, args.dtype)
    print(f"{'op':<10} {'dtype':<8} {'N':>6} {'kernel':<20} {'block':>6} {'rows':>4} {'warps':>5} {'cap':>4} "
          f"{'regs':>4} {'stack':>5} {'blocks/SM':>9}")
    for n in (int(v) for v in args.ns.split(",")) if args.backward else ():
        for x in backward_resources(args.op, dtype, n, args.m):
            rows.append(dict(op=args.op, dtype=args.dtype, n=n, kernel=x.kernel, block_n=x.config.block_n,
                             rows=x.config.rows, warps=x.config.num_warps, registers=x.registers, stack=x.stack,
                             blocks_per_sm=x.blocks_per_sm))
            print(f"{args.op:<10} {args.dtype:<8} {n:>6} {x.kernel:<20} {x.config.block_n:>6} {x.config.rows:>4} "
                  f"{x.config.num_warps:>5} {'-':>4} {x.registers:>4} {x.stack:>5} {x.blocks_per_sm:>9}", flush=True)
    for n in (int(v) for v in args.ns.split(",")) if not args.backward else ():
        r = resources(args.op, args.variant, dtype, n, args.m)
        found = [r]
        if args.forms and args.variant == "rowwise" and r.config.rows == 1:
            other = dataclasses.replace(r.config, one_row=not r.config.one_row)
            found.append(resources(args.op, args.variant, dtype, n, args.m, other))
        for i, x in enumerate(found):
            c = x.config
            rows.append(dict(op=args.op, dtype=args.dtype, n=n, kernel=x.kernel, block_n=c.block_n, rows=c.rows,
                             warps=c.num_warps, maxnreg=c.maxnreg, one_row=c.one_row, chosen=i == 0,
                             registers=x.registers, stack=x.stack, blocks_per_sm=x.blocks_per_sm))
            print(f"{args.op:<10} {args.dtype:<8} {n:>6} {x.kernel:<20} {c.block_n:>6} {c.rows:>4} {c.num_warps:>5} "
                  f"{c.maxnreg or '-':>4} {x.registers:>4} {x.stack:>5} {x.blocks_per_sm:>9}"
                  + ("" if i == 0 else "   (the other form)"), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
