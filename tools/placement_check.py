"""Does where x lives move a kernel's time? The check behind the benchmark arena
(harness/bench.py, docs/perf-notes.md), run on a GPU:

    python tools/placement_check.py --json placement.json

float32 RMSNorm, 65536 x 1024 (the shape whose medians moved between two passes of one
benchmark session), timed as the benchmarks time, for three kernels, with x and y at:
1. a first allocation on a fresh process;
2. six further allocations, each after a spacer allocation of a different size;
3. a new allocation after 34 GB were allocated and freed (as the sweep's longest rows do);
4. the first allocation again, after two seconds of the heaviest benchmark shape.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import _session

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from harness import timing  # noqa: E402
from impls import registry  # noqa: E402

KERNELS = ("torch.eager", "triton.rowwise", "triton.looped")
M, N = 65536, 1024


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json")
    args = p.parse_args(argv)
    tools, ceiling = _session.start()
    kernels = [registry.get("rms_norm", *name.split(".")) for name in KERNELS]
    nbytes = timing.bytes_moved(M, N, torch.float32, True, False, 1)
    w = torch.randn(N, device="cuda")
    results = []

    def measure(label: str, x: torch.Tensor) -> None:
        for k in kernels:
            out = k.allocate(x)
            fn = k.bench_callable(x, w, None, 1e-6, out)
            ms = [timing.gpu_time_ms(fn, tools, rounds=40, warmup=5) for _ in range(2)]
            pct = [100 * nbytes / t / 1e6 / ceiling for t in ms]
            results.append(dict(where=label, kernel=k.name, x_addr=hex(x.data_ptr()), pct=pct))
            print(f"{label:<34} {k.name:<15} x@{x.data_ptr():#x}  {pct[0]:5.1f}% {pct[1]:5.1f}%", flush=True)

    x0 = torch.randn(M, N, device="cuda")
    measure("first allocation", x0)
    keep = []
    for i, spacer_mb in enumerate((2, 6, 34, 130, 514, 2050)):
        keep.append(torch.empty(spacer_mb * 2**20, dtype=torch.uint8, device="cuda"))
        keep.append(x0.clone())
        measure(f"allocation {i + 2} (after {spacer_mb} MB)", keep[-1])
    del keep
    big = torch.empty(34 * 10**9, dtype=torch.uint8, device="cuda")
    del big
    torch.cuda.empty_cache()
    measure("after 34 GB allocated and freed", x0.clone())
    heavy = torch.randn(16384, 262144, device="cuda")
    ln = registry.get("layer_norm", "torch", "eager")
    t_end = time.time() + 2
    while time.time() < t_end:
        ln(heavy, None, None, 1e-5)
        torch.cuda.synchronize()
    del heavy
    measure("first allocation, after heavy work", x0)

    spread = {k: [r["pct"][0] for r in results if r["kernel"] == k] for k in KERNELS}
    for k, v in spread.items():
        print(f"{k:<15} over placements: min {min(v):.1f}% median {statistics.median(v):.1f}% max {max(v):.1f}%")
    if args.json:
        _session.write_json(args.json, ceiling, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
