"""Why is torch.compile faster than triton.looped at RMSNorm 8192-32768? A probe, run on a GPU:

    python tools/static_shape_probe.py --json probe.json

Inductor's kernel for these shapes (tools/inductor_code.py) is a looped two-pass reduction like
triton.looped, but compiled for one static shape. This times a copy of the looped RMSNorm whose
differences from Inductor's kernel can be switched on one at a time:
- ``static``: N a compile-time constant (one compilation per N, as Inductor and the TileLang
  kernels have it), so the chunk count is known;
- ``unmasked``: no masks on loads and stores (N a multiple of the chunk, one row per program);
- ``forward``: the second pass in chunk order (triton.looped runs it in reverse);
- ``w_last``: the weight loaded with ``evict_last``.
Each at triton.looped's tabled setting and at Inductor's (chunks of 2048, 16 warps), next to
triton.looped itself and torch.compile in the same process, each checked against float64.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import _session

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from harness import timing  # noqa: E402
from harness.bench import bandwidth_rows  # noqa: E402
from harness.cases import DTYPES  # noqa: E402
from impls import registry  # noqa: E402
from impls.base import DEFAULT_EPS, spec_of  # noqa: E402

SHAPES = (("bfloat16", 8192), ("bfloat16", 12288), ("bfloat16", 32768), ("float32", 4096), ("float32", 8192))
VARIANTS = {  # name: (static, unmasked, forward, w_last)
    "probe": (False, False, False, False),
    "static": (True, False, False, False),
    "static+unmasked": (True, True, False, False),
    "static+unmasked+forward": (True, True, True, False),
    "static+forward+w_last": (True, False, True, True),
}


@triton.jit
def _rms_looped_probe(X, W, Y, RSTD, N_RUN, stride, eps, N_STATIC: tl.constexpr, BLOCK_N: tl.constexpr,
                      UNMASKED: tl.constexpr, FORWARD: tl.constexpr, W_LAST: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    if N_STATIC > 0:
        n = N_STATIC
    else:
        n = N_RUN
    chunks = tl.cdiv(n, BLOCK_N)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for c in tl.range(0, chunks):
        cols = c * BLOCK_N + tl.arange(0, BLOCK_N)
        if UNMASKED:
            x = tl.load(X + row * stride + cols, eviction_policy="evict_last").to(tl.float32)
        else:
            x = tl.load(X + row * stride + cols, mask=cols < n, other=0.0, eviction_policy="evict_last").to(tl.float32)
        acc += x * x
    rstd = tl.rsqrt(tl.sum(acc, axis=0) / n + eps)
    for c in tl.range(0, chunks):
        if FORWARD:
            cc = c
        else:
            cc = chunks - 1 - c
        cols = cc * BLOCK_N + tl.arange(0, BLOCK_N)
        if UNMASKED:
            x = tl.load(X + row * stride + cols, eviction_policy="evict_first").to(tl.float32)
            if W_LAST:
                w = tl.load(W + cols, eviction_policy="evict_last").to(tl.float32)
            else:
                w = tl.load(W + cols).to(tl.float32)
            tl.store(Y + row * stride + cols, (x * rstd * w).to(Y.dtype.element_ty))
        else:
            m = cols < n
            x = tl.load(X + row * stride + cols, mask=m, other=0.0, eviction_policy="evict_first").to(tl.float32)
            if W_LAST:
                w = tl.load(W + cols, mask=m, other=0.0, eviction_policy="evict_last").to(tl.float32)
            else:
                w = tl.load(W + cols, mask=m, other=0.0).to(tl.float32)
            tl.store(Y + row * stride + cols, (x * rstd * w).to(Y.dtype.element_ty), mask=m)
    tl.store(RSTD + row, rstd)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json")
    args = p.parse_args(argv)
    tools, ceiling = _session.start()
    eps = DEFAULT_EPS["rms_norm"]
    looped = registry.get("rms_norm", "triton", "looped")
    compiled = registry.get("rms_norm", "torch_compile", "inductor")
    results = []
    for dtype, n in SHAPES:
        dt = DTYPES[dtype]
        m = bandwidth_rows(n)
        x = torch.randn(m, n, device="cuda", dtype=dt)
        w = torch.randn(n, device="cuda", dtype=dt)
        ref = (x[:64].double() * torch.rsqrt(x[:64].double().pow(2).mean(1, keepdim=True) + eps) * w.double())
        nbytes = timing.bytes_moved(m, n, dt, True, False, 1)

        def record(name, setting, fn, y):
            fn()
            torch.cuda.synchronize()
            err = (y[:64].double() - ref).abs().max().item()
            ok = err <= 8 * torch.finfo(dt).eps * ref.abs().max().item()
            ms = timing.gpu_time_ms(fn, tools, rounds=20, warmup=3)
            pct = 100 * nbytes / ms / 1e6 / ceiling
            results.append(dict(dtype=dtype, n=n, m=m, kernel=name, setting=setting, us=ms * 1e3, pct=pct, correct=ok))
            print(f"{dtype:<8} {m:>6}x{n:<6} {name:<26} {setting:<18} {ms * 1e3:8.1f} us {pct:6.1f}%"
                  + ("" if ok else f"  WRONG ({err:.3g})"), flush=True)

        for kernel, name in ((looped, "triton.looped"), (compiled, "torch_compile.inductor")):
            kernel.prepare(spec_of("rms_norm", x, "cuda", w, None))
            out = kernel(x, w, None, eps)
            record(name, "its own", kernel.bench_callable(x, w, None, eps, out), out.y)
        cfg = looped.config(n, dt)
        y = torch.empty_like(x)
        rstd = torch.empty(m, device="cuda")
        for setting, (block, warps) in (("table", (cfg.block_n, cfg.num_warps)), ("inductor-like", (2048, 16))):
            for name, (static, unmasked, forward, w_last) in VARIANTS.items():
                def fn(block=block, warps=warps, static=static, unmasked=unmasked, forward=forward, w_last=w_last):
                    _rms_looped_probe[(m,)](x, w, y, rstd, n, x.stride(0), eps, N_STATIC=n if static else 0,
                                            BLOCK_N=block, UNMASKED=unmasked, FORWARD=forward, W_LAST=w_last,
                                            num_warps=warps)
                record(name, f"{setting} {block}x{warps}w", fn, y)
    if args.json:
        _session.write_json(args.json, ceiling, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
