"""The TileLang backend: RMSNorm (naive_row_per_block, fragment, splitk) and LayerNorm
(layer_norm_fwd), for float32, float16 and bfloat16, on CUDA devices.

tilelang is imported on first use only, so this package imports (and its kernels register,
shown as skipped with the reason) where tilelang is missing. Without a CUDA device the kernels
still compile for sm_90 (harness/test_offline_compile.py, through offline_builds), but none is executed.

Each kernel has ``prepare(spec)``, which compiles ahead of a timed region. One compilation per
(kernel, dtype, N, affine flags, vector width); M and the row strides are runtime values.
``python -m impls.tilelang.source --variant fragment --dtype bfloat16 --n 4000`` prints the
generated CUDA source (``--ptxas`` adds registers, shared memory and spills).
"""
from __future__ import annotations

from impls.tilelang import fused, layer_norm, long_rows, rms_norm  # noqa: F401  (importing registers the kernels)
from impls.tilelang.compiler import availability  # noqa: F401

VARIANTS = ("naive_row_per_block", "fragment", "splitk", "layer_norm_fwd", "cluster", "layer_norm_cluster")
