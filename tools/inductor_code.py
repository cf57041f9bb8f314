"""What Inductor generates for the torch_compile backend: the Triton source and launch settings
of its kernels at a few benchmark shapes, for comparing with the project's own kernels
(docs/perf-notes.md). Needs a GPU.

    python tools/inductor_code.py --shapes rms_norm:16384x8192,layer_norm:16384x16384 --out DIR

Writes DIR/<op>-<dtype>-<M>x<N>.py per shape: the compiled module's source as Inductor wrote it
(kernels, their autotuned configs, the launch calls), through the same entry point the
benchmarks time (impls/torch_compile.py).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch._inductor.utils import run_and_get_code  # noqa: E402

from harness.cases import DTYPES  # noqa: E402
from impls import registry  # noqa: E402
from impls.base import DEFAULT_EPS  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="rms_norm:16384x8192,layer_norm:16384x16384")
    p.add_argument("--dtype", default="bfloat16", choices=tuple(DTYPES))
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    registry.load_all()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dt = DTYPES[args.dtype]
    for item in args.shapes.split(","):
        op, shape = item.split(":")
        m, n = (int(v) for v in shape.split("x"))
        kernel = registry.get(op, "torch_compile", "inductor")
        x = torch.randn(m, n, device="cuda", dtype=dt)
        w = torch.randn(n, device="cuda", dtype=dt)
        b = torch.randn(n, device="cuda", dtype=dt) if op == "layer_norm" else None
        _, sources = run_and_get_code(lambda: kernel(x, w, b, DEFAULT_EPS[op]))  # noqa: B023
        path = out / f"{op}-{args.dtype}-{m}x{n}.py"
        path.write_text("\n\n# ---- next module ----\n\n".join(sources))
        print(f"{path}: {len(sources)} module(s), {sum(len(s) for s in sources)} characters", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
