"""Time the Triton backward's launch settings against a copy kernel in the same process (CUDA).

For each op and shape (bfloat16, full affine): the setting backward_config gives ("default") and
the CANDIDATES for that N (less the default), each checked against the float64 oracle first (relative L2
error of dx on sample rows, of dw and db over all rows), then timed as the benchmarks time
(harness.benchmarks.timing.gpu_time_ms: settled, cold L2) and written as % of the copy bandwidth, with bytes
as the benchmark counts them (timing.bytes_moved_backward). The default setting is also checked
bitwise: two calls give the same bits, and dx of the first rows alone equals theirs in the batch.

    python -m tools.bwd_probe --out "$OUT"            # about a minute on an H200

Writes bwd_probe.json and bwd_probe.txt under --out. A candidate is (rows per program, rows per
tile, warps[, maxnreg[, stages]]) as impls.triton.settings.BWD_SETTINGS holds the backward rows of
impls/triton/tuned_h200.toml.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

SHAPES = ((65536, 1024), (32768, 2048), (16384, 4096), (16384, 8192))
# Rows per program against wave quantisation (programs = M / block_m over blocks per SM x 132),
# tile shape, a register cap (0: none) and stages (>= 2: tiles ahead by Triton's software pipeline
# into shared memory, which frees the registers the one-tile-ahead form holds; ptxas for sm_90 at
# 1024: LayerNorm 4 warps and 3 stages, 64 registers, where 2 warps in registers took 125).
CANDIDATES = {
    1024: [(64, 1, 2), (64, 1, 2, 0, 3), (64, 1, 4, 0, 3), (64, 2, 4, 0, 3), (32, 1, 4, 0, 3), (64, 1, 8, 0, 3),
           (128, 2, 4, 0, 3), (64, 1, 4, 48, 3), (64, 2, 4, 64, 3), (64, 1, 2, 0, 2), (64, 1, 4, 0, 4)],
    2048: [(64, 1, 4), (64, 1, 8, 64), (64, 1, 4, 0, 3), (64, 1, 8, 0, 3), (32, 1, 4, 0, 3), (64, 2, 8, 0, 3)],
    4096: [(64, 1, 8), (64, 1, 16, 64), (64, 1, 8, 0, 3), (64, 1, 16, 0, 3), (32, 1, 8, 0, 3)],
    8192: [(128, 1, 16), (128, 1, 16, 0, 3), (64, 1, 16, 0, 3), (128, 1, 16, 0, 4)],
}
# The final dw/db reduction's columns per program, on the default row setting: at N = 1024 the
# default (REDUCE_MIN_N = 16) runs 64 programs on 132 SMs over 2048 partial rows.
# 8 and 32 columns measured no faster than 16 for RMSNorm, 1.3-1.5 points faster for LayerNorm
# (perf-notes item 45, on the register form): again on the staged rows, with db's partials too.
REDUCE_CANDIDATES: dict = {1024: [8, 32, 64], 2048: [8, 32]}
BUDGET_S = 240  # candidates are left out once this much time has gone


class _Untimed(Exception):
    pass


def _errors(op, x, w, b, dy, grads, eps, sample) -> dict:
    from impls.reference import reference_backward

    want = reference_backward(op, x, dy, w, b, eps)
    rows = reference_backward(op, x[sample], dy[sample], w, b, eps)
    out = {}
    for name, got, ref in (("dx", grads.dx[sample], rows.dx), ("dw", grads.dw, want.dw), ("db", grads.db, want.db)):
        if got is not None and ref is not None:
            out[name] = float(torch.linalg.vector_norm(got.double() - ref) / torch.linalg.vector_norm(ref))
    return out


def _inputs(op: str, m: int, n: int, dev: str, kernel):
    """x, w, b, dy of one shape (bfloat16, full affine) and the forward's saved statistics."""
    from harness.benchmarks.bench_backward import draw_dy
    from impls.base import DEFAULT_EPS, NormOutputs

    dtype = torch.bfloat16
    layer = op == "layer_norm"
    g = torch.Generator(device=dev).manual_seed(m + n)
    x = (torch.randn(m, n, generator=g, device=dev) + (1.0 if layer else 0.0)).to(dtype)
    w = (1 + 0.1 * torch.randn(n, generator=g, device=dev)).to(dtype)
    b = (0.1 * torch.randn(n, generator=g, device=dev)).to(dtype) if layer else None
    dy = draw_dy(x)
    fwd = kernel(x, w, b, DEFAULT_EPS[op])
    saved = NormOutputs(y=fwd.y, mean=None if fwd.mean is None else fwd.mean.view(-1), rstd=fwd.rstd.view(-1))
    return x, w, b, dy, saved


def _config(setting, n: int, op: str):
    """The launch setting of a candidate: None (the default), ("reduce_n", columns) (the default
    rows, another reduction) or a BWD_SETTINGS-like tuple."""
    from impls.triton.settings import REDUCE_TILE, backward_config

    if setting is not None and setting[0] == "reduce_n":
        return dataclasses.replace(backward_config(n, torch.bfloat16, op), reduce_n=setting[1],
                                   reduce_parts=max(1, REDUCE_TILE // setting[1]))
    return backward_config(n, torch.bfloat16, op, setting=setting)


def _bitwise(k, x, w, b, dy, saved, eps, grads, cfg, fn) -> dict:
    """The default setting's bits: two calls agree, and dx of the first rows alone equals theirs
    in the batch."""
    from impls.base import NormGrads, NormOutputs

    first = {t: v.clone() for t, v in grads.fields().items()}
    fn()
    out = {"deterministic": all(torch.equal(v, getattr(grads, t)) for t, v in first.items())}
    part = NormGrads(torch.empty_like(x[:1000]), torch.empty_like(w), None if b is None else torch.empty_like(b))
    k._backward(x[:1000], w, b, dy[:1000], NormOutputs(y=x[:1000], mean=None if saved.mean is None
                else saved.mean[:1000], rstd=saved.rstd[:1000]), eps, part, cfg)
    out["dx_batch_invariant"] = torch.equal(part.dx, first["dx"][:1000])
    return out


def _measure(k, op, inputs, setting, cfg, tools, ceiling, smoke: bool) -> dict:
    """One setting: checked against the oracle (and bitwise, the default), then timed."""
    from harness.benchmarks import timing
    from harness.benchmarks.bench_forward import sample_rows
    from impls.base import DEFAULT_EPS, NormGrads

    x, w, b, dy, saved = inputs
    (m, n), eps = x.shape, DEFAULT_EPS[op]
    grads = NormGrads(torch.empty_like(x), torch.empty_like(w), None if b is None else torch.empty_like(b))
    fn = lambda: k._backward(x, w, b, dy, saved, eps, grads, cfg)  # noqa: E731
    row = dict(op=op, m=m, n=n, setting="default" if setting is None else list(setting), block_m=cfg.block_m,
               rows=cfg.rows, warps=cfg.num_warps, maxnreg=cfg.maxnreg, stages=cfg.stages)
    try:
        fn()
        if not smoke:
            torch.cuda.synchronize()
        row["rel_l2"] = _errors(op, x, w, b, dy, grads, eps, sample_rows(m, n, x.device.type))
        if setting is None:
            row.update(_bitwise(k, x, w, b, dy, saved, eps, grads, cfg, fn))
        if smoke:
            raise RuntimeError("not timed (smoke)") if row["rel_l2"]["dx"] > 0.05 else _Untimed()
        ms = timing.gpu_time_ms(fn, tools)
        nbytes = timing.bytes_moved_backward(m, n, x.dtype, True, b is not None, 2 if b is not None else 1)
        row.update(us=ms * 1e3, pct_of_copy=100 * nbytes / (ms * 1e-3) / 1e9 / ceiling)
    except _Untimed:
        pass
    except Exception as exc:  # a candidate that fails to compile or launch is reported, not fatal
        row["error"] = f"{type(exc).__name__}: {exc}"[:300]
    return row


def _line(row: dict, cfg) -> str:
    errs = " ".join(f"{a}={v:.2e}" for a, v in row.get("rel_l2", {}).items())
    flags = "".join(f" {f}={row[f]}" for f in ("deterministic", "dx_batch_invariant") if f in row)
    return (f"{row['op']:<10} {row['m']:>6}x{row['n']:<5} {str(row['setting']):<24} bm={cfg.block_m:<4} "
            f"programs={-(-row['m'] // cfg.block_m):<5} rows={cfg.rows} "
            f"warps={cfg.num_warps:<2} cap={cfg.maxnreg} stages={cfg.stages} "
            + (f"{row['us']:8.1f} us {row['pct_of_copy']:5.1f}% of copy" if "us" in row else row.get("error", ""))
            + f"  rel_l2 {errs}{flags}")


def _full(setting: tuple) -> tuple:
    """A setting with its optional fields (maxnreg, stages) written out, as BWD_SETTINGS holds it."""
    return tuple(setting) + (0, 0)[len(setting) - 3:]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--ops", default="rms_norm,layer_norm")
    p.add_argument("--no-candidates", action="store_true", help="the default setting only")
    p.add_argument("--smoke", action="store_true",
                   help="CPU (interpreter), tiny shapes, nothing timed: the script's own test")
    args = p.parse_args(argv)
    dev = "cpu" if args.smoke else "cuda"
    shapes = ((1100, 1024), (40, 8192)) if args.smoke else SHAPES
    from harness.benchmarks import timing
    from impls import registry
    from impls.triton.settings import BWD_SETTINGS

    registry.load_builtins()
    t0 = time.perf_counter()
    tools = None if args.smoke else timing.GpuTools(dev)
    ceiling, how = (1.0, "not timed") if args.smoke else timing.copy_ceiling_gbps(dev, tools)
    name = "cpu" if args.smoke else torch.cuda.get_device_name()
    rows_out, lines = [], [f"copy: {ceiling:.0f} GB/s ({how}); {name}"]
    # The defaults of every shape first, then the candidates (the ones the time budget may cut).
    jobs = [(phase, op, shape) for phase in ("default", "candidates") for op in args.ops.split(",")
            for shape in shapes if phase == "default" or not args.no_candidates]
    for phase, op, (m, n) in jobs:
        k = registry.get(op, "triton", "invariant")
        inputs = _inputs(op, m, n, dev, k)
        default = BWD_SETTINGS.get((op, 2, n))
        settings = [None] if phase == "default" else [c for c in CANDIDATES.get(n, []) if _full(c) != default]
        settings += [] if phase == "default" else [("reduce_n", r) for r in REDUCE_CANDIDATES.get(n, [])]
        for setting in settings:
            if setting is not None and time.perf_counter() - t0 > BUDGET_S:
                lines.append(f"{op} {m}x{n} {setting}: left out (time budget)")
                continue
            cfg = _config(setting, n, op)
            rows_out.append(_measure(k, op, inputs, setting, cfg, tools, ceiling, args.smoke))
            lines.append(_line(rows_out[-1], cfg))
            print(lines[-1], flush=True)
    lines.append(f"total {time.perf_counter() - t0:.0f} s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bwd_probe.json").write_text(json.dumps(dict(ceiling_gbps=ceiling, rows=rows_out), indent=1))
    (out / "bwd_probe.txt").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
