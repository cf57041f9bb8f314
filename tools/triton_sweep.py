"""Offline sweep of the Triton launch settings on a GPU, the evidence behind
``impls.triton._launch.launch_config``'s heuristic (see docs/perf-notes.md).

    python tools/triton_sweep.py --dtype bfloat16 --json sweep.json

For each op, N and launch setting (rows per program, warps) it times the rowwise kernel on
M = max(16384, 2**26 / N) rows, cold L2, by CUDA events, and prints GB/s and % of the copy
ceiling of the same run, with the heuristic's own choice marked.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from harness.cases import DTYPES  # noqa: E402
from harness import timing  # noqa: E402
from impls import registry  # noqa: E402
from impls.base import NormOutputs  # noqa: E402
from impls.triton._launch import LaunchConfig, next_pow2  # noqa: E402

NS = (1024, 2048, 4096, 8192, 16384, 32768)


def settings(n: int):
    """Rows per program in 1..8 and 8, 16 or 32 float32 values per thread, one tile at most
    32768 elements."""
    block_n = next_pow2(n)
    for rows in (1, 2, 4, 8):
        if rows * block_n > 32768:
            break
        for per_thread in (8, 16, 32):
            warps = rows * block_n // (32 * per_thread)
            if 1 <= warps <= 32:
                yield LaunchConfig(block_n=block_n, rows=rows, num_warps=warps)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtype", default="bfloat16", choices=tuple(DTYPES))
    p.add_argument("--ns", default=",".join(map(str, NS)))
    p.add_argument("--json")
    args = p.parse_args(argv)
    registry.load_all()
    dtype = DTYPES[args.dtype]
    tools = timing.GpuTools()
    ceiling = timing.copy_ceiling_gbps("cuda", tools)[0]
    print(f"{time.strftime('%Y-%m-%d')} {torch.cuda.get_device_name()} copy {ceiling:.0f} GB/s", flush=True)
    rows_out = []
    for op in ("rms_norm", "layer_norm"):
        kernel = registry.get(op, "triton", "rowwise")
        for n in (int(v) for v in args.ns.split(",")):
            m = max(16384, 2**26 // n)
            x = torch.randn(m, n, device="cuda", dtype=dtype)
            w = torch.randn(n, device="cuda", dtype=dtype)
            b = torch.randn(n, device="cuda", dtype=dtype) if op == "layer_norm" else None
            out: NormOutputs = kernel.allocate(x)
            chosen = kernel.config(n, dtype)
            nbytes = timing.bytes_moved(m, n, dtype, True, b is not None, len(kernel.outputs) - 1)
            for cfg in settings(n):
                ms = timing.gpu_time_ms(lambda: kernel._forward(x, w, b, 1e-6, out, cfg), tools, rounds=20, warmup=2)
                gbps = nbytes / ms / 1e6
                r = dict(op=op, n=n, m=m, rows=cfg.rows, warps=cfg.num_warps, us=ms * 1e3, gbps=gbps,
                         pct=100 * gbps / ceiling, heuristic=cfg == chosen)
                rows_out.append(r)
                mark = " <- heuristic" if r["heuristic"] else ""
                print(f"{op:<10} {m:>6}x{n:<6} rows={cfg.rows:<2} warps={cfg.num_warps:<2} "
                      f"{r['us']:8.1f} us {gbps:6.0f} GB/s {r['pct']:5.1f}%{mark}", flush=True)
            del x, out
    if args.json:
        Path(args.json).write_text(json.dumps({"dtype": args.dtype, "copy_gbps": ceiling,
                                               "gpu": torch.cuda.get_device_name(), "results": rows_out}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
