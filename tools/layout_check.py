"""Does the arena's layout move a kernel's time? The check behind the gap between
``harness.measure`` and the benchmark report for some kernels (docs/perf-notes.md), run on a GPU:

    python tools/layout_check.py --json layout.json

bf16 16384 x 4096, timed as the benchmarks time (``harness.timing.gpu_time_ms``), for four
one-pass kernels, with x, weight, bias, y, mean and rstd:
- ``separate``: each its own allocation, as ``harness.measure`` has them;
- ``arena-4k``: carved from one 32 GiB allocation at 4 KiB-aligned offsets, as the benchmarks'
  Arena does (y starts 16 KiB past a 2 MiB multiple from x: weight and bias take two pages each);
- ``arena-2m``: the same allocation, every part at a 2 MiB boundary;
- ``separate-y+16k``: separate allocations, y starting 16 KiB into its own.
Each layout is timed twice, in turn, so drift shows.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import _session

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from harness import timing  # noqa: E402
from impls import registry  # noqa: E402
from impls.base import DEFAULT_EPS, NormOutputs  # noqa: E402

KERNELS = (("rms_norm", "triton.rowwise"), ("rms_norm", "tilelang.fragment"),
           ("layer_norm", "triton.rowwise"), ("layer_norm", "tilelang.layer_norm_fwd"))
M, N, DT = 16384, 4096, torch.bfloat16
ARENA_BYTES = 32 * 2**30


def carve(buf: torch.Tensor, align: int) -> dict[str, torch.Tensor]:
    parts = (("x", DT, (M, N)), ("w", DT, (N,)), ("b", DT, (N,)), ("y", DT, (M, N)),
             ("mean", torch.float32, (M,)), ("rstd", torch.float32, (M,)))
    out, off = {}, 0
    for name, dt, shape in parts:
        nbytes = torch.Size(shape).numel() * dt.itemsize
        out[name] = buf[off:off + nbytes].view(dt).view(shape)
        off += -(-nbytes // align) * align
    return out


def separate(y_offset: int = 0) -> dict[str, torch.Tensor]:
    t = {"x": torch.empty(M, N, dtype=DT, device="cuda"), "w": torch.empty(N, dtype=DT, device="cuda"),
         "b": torch.empty(N, dtype=DT, device="cuda"), "mean": torch.empty(M, device="cuda"),
         "rstd": torch.empty(M, device="cuda")}
    ybuf = torch.empty(M * N * DT.itemsize + y_offset, dtype=torch.uint8, device="cuda")
    t["y"] = ybuf[y_offset:].view(DT).view(M, N)
    return t


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json")
    args = p.parse_args(argv)
    tools, ceiling = _session.start()
    arena = torch.empty(ARENA_BYTES, dtype=torch.uint8, device="cuda")
    layouts = {"separate": separate(), "arena-4k": carve(arena, 4096), "arena-2m": carve(arena[2**30:], 2 * 2**20),
               "separate-y+16k": separate(16384)}
    for t in layouts.values():
        for name in ("x", "w", "b"):
            t[name].normal_()
    for name, t in layouts.items():
        print(f"{name:<14} y - x = {t['y'].data_ptr() - t['x'].data_ptr()} bytes "
              f"({(t['y'].data_ptr() - t['x'].data_ptr()) % 2**21} past a 2 MiB multiple)", flush=True)
    results = []
    for op, kname in KERNELS:
        kernel = registry.get(op, *kname.split("."))
        layer = op == "layer_norm"
        nbytes = timing.bytes_moved(M, N, DT, True, layer, len({"mean", "rstd"} & set(kernel.outputs)))
        for attempt in (1, 2):
            for name, t in layouts.items():
                out = NormOutputs(y=t["y"], mean=t["mean"] if "mean" in kernel.outputs else None, rstd=t["rstd"])
                b = t["b"] if layer else None
                kernel._forward(t["x"], t["w"], b, DEFAULT_EPS[op], out)  # compiles on first use
                ms = timing.gpu_time_ms(kernel.bench_callable(t["x"], t["w"], b, DEFAULT_EPS[op], out), tools)
                pct = 100 * nbytes / ms / 1e6 / ceiling
                results.append(dict(op=op, kernel=kname, layout=name, attempt=attempt, us=ms * 1e3, pct=pct))
                print(f"{op:<10} {kname:<24} {name:<14} #{attempt} {ms * 1e3:7.1f} us {pct:6.1f}% of copy", flush=True)
    if args.json:
        _session.write_json(args.json, ceiling, results, m=M, n=N, dtype="bfloat16")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
