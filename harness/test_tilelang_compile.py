"""TileLang kernels compile for sm_90 on any machine with tilelang and nvcc, GPU or not.

Every kernel variant is compiled over representative shapes (padded N, odd N, long rows,
the capacity edge, affine and not); each compile's ptxas numbers (registers, shared memory,
spills) go to the report's "compiled" section. Without a CUDA device nothing here runs a
kernel: the report says "compiled, not executed" and the differential cases are skipped.
About 55 specializations: around 2.5 minutes on 2 CPU cores with a cold TileLang cache,
seconds with a warm one.
"""
import time

import pytest
import torch

from harness.run import STATE

from impls.base import cuda_present, dtype_name

# (variant, dtype, N, affine, M): affine is "weight" / "none" for RMSNorm, "weight_bias" / "weight" / "bias" /
# "none" for LayerNorm; M None (many rows) except for the decode plans (few rows, DECODE_TUNED).
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
VARIANTS = ("naive_row_per_block", "fragment", "splitk", "layer_norm_fwd")


def _full(variant: str) -> str:
    return "weight_bias" if variant == "layer_norm_fwd" else "weight"


def _shapes() -> list[tuple[str, torch.dtype, int, str, int | None]]:
    from impls.tilelang.plan import DECODE_TUNED

    shapes = []
    for v in VARIANTS:
        for dt in DTYPES:
            for n in (4096, 4000, 769):  # a power of two; padded (vec 8 fits); odd (scalar accesses)
                shapes.append((v, dt, n, _full(v)))
        shapes.append((v, torch.bfloat16, 4000, "none"))
    for dt in DTYPES:
        for n in (65536, 100000):  # long rows, the last segment padded
            shapes.append(("splitk", dt, n, "weight"))
    for v in ("fragment", "layer_norm_fwd"):  # the register-capacity edge
        shapes.append((v, torch.bfloat16, 32768, _full(v)))
    shapes.append(("layer_norm_fwd", torch.bfloat16, 4000, "weight"))
    shapes.append(("layer_norm_fwd", torch.bfloat16, 4000, "bias"))  # every affine combination
    shapes = [s + (None,) for s in shapes]
    for variant, itemsize, n in DECODE_TUNED:
        shapes.append((variant, torch.bfloat16 if itemsize == 2 else torch.float32, n, _full(variant), 1))
    return shapes


SHAPES = _shapes()


def pytest_generate_tests(metafunc):
    """One check per shape of each selected TileLang kernel (none when tilelang is not selected:
    the plugin then deselects the empty set, it is not a skip)."""
    if "compile_case" not in metafunc.fixturenames:
        return
    selected = {k.variant: k for k in metafunc.config.stash[STATE].kernels if k.backend == "tilelang"}
    params = [(selected[v], d, n, a, m) for v, d, n, a, m in SHAPES if v in selected]
    metafunc.parametrize("compile_case", params, ids=[
        f"{k.variant}-{dtype_name(d)}-{n}-{a}" + ("-decode" if m else "") for k, d, n, a, m in params])


def test_compiles_for_sm90(compile_case, harness_state, request):
    kernel, dtype, n, affine, m = compile_case
    variant = kernel.variant
    from impls.tilelang import compiler
    from impls.tilelang.plan import choose_vec, make_plan

    tl, why = compiler.tilelang_module()
    if tl is None:
        pytest.skip(why)
    if compiler.nvcc_path() is None:
        pytest.skip("nvcc not found (CUDA_HOME or PATH): TileLang cannot compile CUDA kernels here")
    has_weight, has_bias = affine in ("weight", "weight_bias"), affine in ("weight_bias", "bias")
    plan = make_plan(variant, dtype, n, has_weight, has_bias, choose_vec(dtype, n), m=m)
    t0 = time.perf_counter()
    compiled = compiler.compile_plan(plan, compiler.SM90)
    seconds = time.perf_counter() - t0
    report = compiler.ptxas_report(compiled)
    request.node.user_properties.append(("normdiff_compiled", {
        "backend": "tilelang", "kernel": f"tilelang.{variant}", "dtype": dtype_name(dtype), "n": n,
        "affine": affine, "vec": plan.vec, "threads": plan.threads, "seconds": round(seconds, 2),
        "executed": cuda_present() and compiler.default_target() == compiler.SM90,
        **report.to_dict(),
    }))
    assert report.sass_arch == "sm_90", f"the cubin is not sm_90 SASS (ELF says {report.sass_arch})"
    assert report.registers is not None and report.registers <= 255
    # A spill means the plan holds more of the row in registers than fits: the capacity is wrong.
    assert report.spill_stores == 0 and report.spill_loads == 0, report
