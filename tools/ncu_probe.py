"""Hardware counters of chosen kernels, read by Nsight Compute: the evidence for what limits a
shape that misses its target (docs/perf-notes.md). Run on a GPU under ncu:

    ncu --clock-control none --profile-from-start off --nvtx --print-nvtx-rename kernel \\
        --metrics $(python tools/ncu_probe.py --metrics) --csv --page raw \\
        python tools/ncu_probe.py --group long > ncu-long.csv
    python tools/ncu_probe.py --summarize ncu-long.csv ncu-rest.csv > ncu.md

Each case runs its kernel a few times (compiles, settles), then once between
cudaProfilerStart/Stop inside an NVTX range named for the case, so ncu profiles that call only
and names its kernels after the case. ncu replays each kernel once per group of counters, with
L2 flushed before each replay (its default cache control), so DRAM bytes are those of a cold
call, as the bandwidth benchmarks time it.
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

METRICS = {
    "gpu__time_duration.sum": "us",
    "dram__bytes_read.sum": "read MB",
    "dram__bytes_write.sum": "write MB",
    "lts__t_sector_hit_rate.pct": "L2 hit %",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "DRAM % of peak",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "occupancy %",
    "launch__occupancy_limit_registers": "blocks/SM (regs)",
    "launch__registers_per_thread": "regs",
    "launch__grid_size": "grid",
    "launch__block_size": "block",
    "smsp__inst_executed.sum": "instructions",
}

# (op, backend.variant, dtype, M, N): the kernels of the gaps in reports/h200/benchmark.md, with a
# kernel that meets its target beside each for comparison.
GROUPS = {
    # (No copy for comparison: Tensor.copy_ of one dtype is a cudaMemcpy, which ncu does not
    # profile. A kernel's "DRAM % of peak" beside the fastest kernels' is the comparison.)
    "long": [
        ("rms_norm", "triton.looped", "bfloat16", 16384, 65536),
        ("rms_norm", "triton.split", "bfloat16", 16384, 65536),
        ("rms_norm", "tilelang.splitk", "bfloat16", 16384, 65536),
        ("rms_norm", "triton.split", "float32", 16384, 65536),
        ("rms_norm", "triton.looped", "bfloat16", 16384, 262144),
        ("rms_norm", "triton.split", "bfloat16", 16384, 262144),
        ("layer_norm", "triton.looped", "bfloat16", 16384, 65536),
        ("layer_norm", "triton.split", "float32", 16384, 65536),
        ("layer_norm", "triton.looped", "bfloat16", 16384, 262144),
        ("layer_norm", "triton.looped", "float16", 16384, 262144),
        ("layer_norm", "torch_compile.inductor", "bfloat16", 16384, 262144),
    ],
    "rest": [
        ("layer_norm", "triton.looped", "bfloat16", 16384, 32768),
        ("layer_norm", "tilelang.layer_norm_fwd", "bfloat16", 16384, 32768),
        ("layer_norm", "triton.looped", "bfloat16", 16384, 12288),
        ("layer_norm", "triton.looped", "bfloat16", 16384, 16384),
        ("layer_norm", "torch_compile.inductor", "bfloat16", 16384, 16384),
        ("rms_norm", "tilelang.fragment", "bfloat16", 16384, 8192),
        ("rms_norm", "triton.looped", "bfloat16", 16384, 8192),
        ("rms_norm", "torch_compile.inductor", "bfloat16", 16384, 8192),
        ("rms_norm", "triton.rowwise", "bfloat16", 64, 4096),
        ("rms_norm", "liger.fused", "bfloat16", 64, 4096),
        ("rms_norm", "tilelang.splitk", "bfloat16", 64, 4096),
        ("layer_norm", "triton.rowwise", "bfloat16", 64, 4096),
        ("layer_norm", "liger.fused", "bfloat16", 64, 4096),
        ("layer_norm", "tilelang.layer_norm_fwd", "bfloat16", 64, 4096),
    ],
}


def label(case) -> str:
    op, kernel, dtype, m, n = case
    return f"{op} {kernel} {dtype} {m}x{n}"


def run(cases) -> None:
    import torch

    from impls import registry
    from impls.base import DEFAULT_EPS, UnsupportedCase, spec_of

    registry.load_all([str(Path(__file__).resolve().parents[1] / "examples" / "liger_backend.py")])
    for case in cases:
        op, name, dtype, m, n = case
        dt = getattr(torch, dtype)
        x = torch.randn(m, n, device="cuda", dtype=dt)
        kernel = registry.get(op, *name.split("."))
        w = torch.randn(n, device="cuda", dtype=dt)
        b = torch.randn(n, device="cuda", dtype=dt) if op == "layer_norm" else None
        eps = DEFAULT_EPS[op]
        try:
            kernel.prepare(spec_of(op, x, "cuda", w, b))
            out = kernel(x, w, b, eps)
        except UnsupportedCase as exc:
            print(f"# {label(case)}: skipped: {exc}", file=sys.stderr, flush=True)
            continue
        fn = kernel.bench_callable(x, w, b, eps, out)
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push(label(case))
        torch.cuda.cudart().cudaProfilerStart()
        fn()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
        torch.cuda.nvtx.range_pop()
        print(f"# profiled {label(case)}", file=sys.stderr, flush=True)
        del x
        torch.cuda.empty_cache()


def summarize(paths) -> str:
    """One markdown table of the ncu CSVs (raw page): a row per profiled kernel."""
    rows = []
    for path in paths:
        lines = [ln for ln in Path(path).read_text().splitlines() if ln.startswith('"')]
        if not lines:
            continue
        reader = csv.DictReader(lines)
        units = next(reader)  # ncu's second line gives each column's unit
        for rec in reader:
            rows.append((rec, units))
    head = ["kernel"] + list(METRICS.values())
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for rec, units in rows:
        cells = [rec.get("Kernel Name", "?")]
        for metric in METRICS:
            value, unit = rec.get(metric, ""), units.get(metric, "")
            try:
                v = float(value.replace(",", ""))
            except ValueError:
                cells.append(value)
                continue
            scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1, "usecond": 1, "ms": 1e3, "msecond": 1e3,
                     "byte": 1e-6, "Kbyte": 1e-3, "Mbyte": 1, "Gbyte": 1e3}.get(unit, 1)
            cells.append(f"{v * scale:,.1f}" if scale != 1 or "." in value else f"{v:,.0f}")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--group", choices=sorted(GROUPS), help="run this group's cases (under ncu)")
    p.add_argument("--metrics", action="store_true", help="print the metric list for ncu --metrics")
    p.add_argument("--summarize", nargs="+", metavar="CSV", help="a markdown table of ncu's CSV output")
    args = p.parse_args(argv)
    if args.metrics:
        print(",".join(METRICS))
    elif args.summarize:
        print(summarize(args.summarize))
    elif args.group:
        run(GROUPS[args.group])
    else:
        p.error("give --group, --metrics or --summarize")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
