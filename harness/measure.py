"""A quick speed measurement on the GPU outside pytest: GB/s and % of a device-to-device copy
measured in the same run, timed exactly as the benchmark suite times (``harness.benchmarks.timing``).

    python -m harness.measure --backend triton --dtype bfloat16 --shapes 16384x4096,16384x4000,32768x1024

For the full comparison of every backend, with the report and plots: ``pytest --benchmark-only``.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from harness.benchmarks import timing
from harness.judging.cases import DTYPES, Case
from harness.judging.inputs import make_inputs
from impls import registry
from impls.base import UnsupportedCase, dtype_name, spec_of


def measure(kernel, m: int, n: int, dtype: torch.dtype, tools: timing.GpuTools) -> dict:
    drawn = make_inputs(Case(kernel.op, dtype_name(dtype), (m, n)), "cuda")  # as the benchmarks draw them
    x, w, b, eps = drawn.x, drawn.weight, drawn.bias, drawn.eps
    kernel.prepare(spec_of(kernel.op, x, "cuda", w, b))
    out = kernel(x, w, b, eps)  # validates once, compiles, and gives the output buffers
    ms = timing.gpu_time_ms(kernel.bench_callable(x, w, b, eps, out), tools)
    nbytes = timing.bytes_moved(m, n, dtype, True, b is not None, len({"mean", "rstd"} & set(kernel.outputs)))
    return {"op": kernel.op, "kernel": kernel.name, "shape": f"{m}x{n}", "dtype": str(dtype).removeprefix("torch."),
            "ms": ms, "gbps": nbytes / ms / 1e6}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.measure", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", required=True, help="comma-separated backends, e.g. the one you are tuning")
    p.add_argument("--dtype", default="bfloat16", choices=tuple(DTYPES))
    p.add_argument("--shapes", default="16384x4096,16384x4000,32768x1024")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU")
    registry.load_all()
    tools = timing.GpuTools()
    ceiling = timing.copy_ceiling_gbps("cuda", tools)[0]
    rows = []
    for shape in args.shapes.split(","):
        m, n = (int(v) for v in shape.split("x"))
        for op in ("rms_norm", "layer_norm"):
            for kernel in registry.kernels(args.backend.split(","), op):
                try:
                    r = measure(kernel, m, n, DTYPES[args.dtype], tools)
                except UnsupportedCase as exc:
                    print(f"{kernel.name} {op} {shape}: skipped: {exc}")
                    continue
                r["pct_of_copy"] = 100 * r["gbps"] / ceiling
                rows.append(r)
    doc = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "gpu": torch.cuda.get_device_name(),
           "torch": torch.__version__, "copy_gbps": ceiling, "results": rows}
    print(f"{doc['date']} {doc['gpu']}: device-to-device copy {ceiling:.0f} GB/s")
    print(f"{'op':<11} {'kernel':<16} {'shape':<12} {'us':>8} {'GB/s':>7} {'% copy':>7}")
    for r in rows:
        print(f"{r['op']:<11} {r['kernel']:<16} {r['shape']:<12} {r['ms'] * 1e3:8.1f} {r['gbps']:7.0f} {r['pct_of_copy']:6.1f}%")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
