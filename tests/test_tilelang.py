"""The TileLang backend: registration, capability answers, the compile cache, and the three
pitfalls of the chapter (reduce_sum's clear flag, padding in the denominator, layout conflicts).

Without a CUDA device the kernels cannot run: each pitfall is then checked in the generated CUDA
source, and the executing half is skipped with that reason. With a device both halves run.
"""
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.judging import runner
from harness.judging.cases import Case
from impls import registry
from impls.base import NormSpec, cuda_present
from impls.tilelang import compiler
from impls.tilelang.plan import choose_vec, make_plan

ROOT = Path(__file__).resolve().parents[1]
HAS_CUDA = cuda_present()
NO_GPU = "no CUDA device: the kernel cannot execute here (checked in its source above)"


def _need_compiler():
    tl, why = compiler.tilelang_module()
    if tl is None:
        pytest.skip(why)
    if compiler.nvcc_path() is None:
        pytest.skip("nvcc not found: TileLang cannot compile CUDA kernels here")


def _kernel(op, variant):
    registry.load_builtins()
    return registry.get(op, "tilelang", variant)


def _spec(op="rms_norm", n=4000, rows=3, dtype=torch.bfloat16, stride=None):
    return NormSpec(op=op, dtype=dtype, rows=rows, n=n, row_stride=stride or n, device="cuda",
                    has_weight=True, has_bias=op == "layer_norm")


def _source(variant, n, dtype=torch.bfloat16, weight=True):
    plan = make_plan(variant, dtype, n, weight, weight and variant == "layer_norm_fwd", choose_vec(dtype, n))
    return compiler.compile_plan(plan, compiler.SM90).source()


# -- registration and capability ----------------------------------------------------------------
def test_registry_lists_the_six_kernels():
    registry.load_builtins()
    names = {(k.op, k.variant) for k in registry.kernels(["tilelang"])}
    assert names == {("rms_norm", "naive_row_per_block"), ("rms_norm", "fragment"), ("rms_norm", "splitk"),
                     ("layer_norm", "layer_norm_fwd"), ("rms_norm", "cluster"), ("layer_norm", "layer_norm_cluster")}


def test_import_is_cheap_and_does_not_import_tilelang():
    code = "import sys, impls.tilelang; assert 'tilelang' not in sys.modules, 'tilelang imported eagerly'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_few_rows_get_the_decode_plan_and_many_rows_the_bandwidth_plan():
    from impls.tilelang.plan import DECODE_MAX_ROWS, DECODE_TUNED

    for (variant, itemsize, n), threads in DECODE_TUNED.items():
        dtype = torch.bfloat16 if itemsize == 2 else torch.float32
        vec, bias = choose_vec(dtype, n), variant == "layer_norm_fwd"
        few = make_plan(variant, dtype, n, True, bias, vec, m=1)
        assert few.threads_per_row == threads and few.rows_per_block == 1
        assert make_plan(variant, dtype, n, True, bias, vec, m=DECODE_MAX_ROWS) == few
        many = make_plan(variant, dtype, n, True, bias, vec, m=DECODE_MAX_ROWS + 1)
        assert many == make_plan(variant, dtype, n, True, bias, vec)  # M unknown: the bandwidth plan
    # the kernel plans with its rows: 1 x 8192 bf16 gets the decode plan, 16384 x 8192 the other
    kernel = _kernel("rms_norm", "fragment")
    x1, y1 = torch.empty(1, 8192, dtype=torch.bfloat16), torch.empty(1, 8192, dtype=torch.bfloat16)
    assert kernel._launch_plan(x1, y1, None).threads_per_row == DECODE_TUNED[("fragment", 2, 8192)]
    xm = torch.empty(DECODE_MAX_ROWS + 1, 8192, dtype=torch.bfloat16)
    assert kernel._launch_plan(xm, xm, None) == make_plan("fragment", torch.bfloat16, 8192, False, False, 8)


def test_rows_beyond_register_capacity_are_refused_with_the_kernel_that_takes_them():
    why = _kernel("rms_norm", "fragment").unsupported(_spec(n=100000))
    assert why == "N=100000 exceeds tilelang.fragment's register capacity (max 32768); tilelang.splitk covers it"
    splitk = _kernel("rms_norm", "splitk")
    assert splitk.max_n is None and "exceeds" not in (splitk.unsupported(_spec(n=262144)) or "")


def test_layer_norm_takes_any_n_beyond_the_register_capacity_in_its_two_pass_plan():
    from impls.tilelang.plan import FRAGMENT_MAX_N

    ln = _kernel("layer_norm", "layer_norm_fwd")
    assert ln.max_n is None and "exceeds" not in (ln.unsupported(_spec("layer_norm", n=262143)) or "")
    assert make_plan("layer_norm_fwd", torch.bfloat16, FRAGMENT_MAX_N, True, True, 8).variant == "layer_norm_fwd"
    for n in (FRAGMENT_MAX_N + 1, 65537, 262144):
        assert make_plan("layer_norm_fwd", torch.float32, n, True, True, choose_vec(torch.float32, n)).variant \
            == "layer_norm_long"


def test_more_than_2_31_elements_are_not_refused():
    """The flat lengths are bound as int64 (the skip for x beyond 2**31 - 1 elements is gone);
    only M beyond int32 is refused."""
    for op, variant in (("rms_norm", "fragment"), ("rms_norm", "splitk"), ("rms_norm", "naive_row_per_block"),
                        ("layer_norm", "layer_norm_fwd")):
        kernel = _kernel(op, variant)
        why = kernel.unsupported(_spec(op, n=4096, rows=2**19 + 1)) or ""
        assert "int32" not in why and "spans" not in why, why
        assert "int32" in (kernel.unsupported(_spec(op, n=1, rows=2**31)) or "")


@pytest.mark.parametrize("op,variant", [("rms_norm", "fragment"), ("rms_norm", "splitk"),
                                        ("rms_norm", "naive_row_per_block"), ("layer_norm", "layer_norm_fwd"),
                                        ("layer_norm", "layer_norm_long")])
def test_lengths_and_row_offsets_are_64_bit(op, variant):
    """The host binds x's and y's flat lengths as int64 and every global access of x and y adds
    a row offset computed in int64 (blockIdx cast first), so rows past 2**31 elements are reached."""
    _need_compiler()
    n = 100000 if variant == "layer_norm_long" else 4000
    plan = make_plan("layer_norm_fwd" if op == "layer_norm" else variant, torch.bfloat16, n, True,
                     op == "layer_norm", 8 if variant != "naive_row_per_block" else 1)
    assert plan.variant == variant
    compiled = compiler.compile_plan(plan, compiler.SM90)
    host = compiled.host_source()
    assert re.search(r"int64_t LX = ", host) and re.search(r"int64_t LY = ", host)
    body = compiled.source()
    body = body[body.index("main_kernel("):]
    accesses = [line for line in body.splitlines() if re.search(r"\b(X \+|X\[|Y \+|Y\[)", line)]
    assert accesses
    for line in accesses:
        assert "((int64_t)((int)blockIdx.x))" in line, f"{variant}: a row offset not in int64: {line.strip()}"


def test_long_layer_norm_divides_by_n_and_guards_its_padding():
    _need_compiler()
    src = _source("layer_norm_fwd", 100000)
    body = src[src.index("main_kernel("):]
    assert "/*1.000000e+05*/" in body, "the variance must divide by N = 100000"
    # the last segment's count is what is left of the row (100000 - 12 x 8192), never the segment
    assert "100000 - max((s * 8192), 91808)" in body
    for line in _unguarded_accesses(body):
        pytest.fail(f"layer_norm_long: global access of x or y outside any if: {line}")


@pytest.mark.skipif(HAS_CUDA, reason="a CUDA device is present: the kernels run here")
def test_without_a_gpu_every_case_is_skipped_as_compiled_not_executed():
    if compiler.tilelang_module()[0] is None:
        pytest.skip("tilelang not importable")
    reason = "compiled for sm_90, not executed: no CUDA device"
    for op, variant in (("rms_norm", "fragment"), ("rms_norm", "splitk"), ("rms_norm", "naive_row_per_block"),
                        ("layer_norm", "layer_norm_fwd")):
        kernel = _kernel(op, variant)
        assert kernel.availability() == reason
        result = runner.check(kernel, Case(op=op, dtype="bfloat16", shape=(3, 4000)))
        assert result.skipped == reason and not result.ok  # skipped, never passed


def test_missing_tilelang_is_named_with_the_install_command(monkeypatch):
    monkeypatch.setattr(compiler, "tilelang_module", lambda: (None, "tilelang not importable: ImportError: x; "
                                                                    + compiler.INSTALL_HINT))
    why = _kernel("rms_norm", "fragment").unsupported(_spec())
    assert why.startswith("tilelang not importable: ImportError") and "pip install 'normdiff[tilelang]'" in why


# -- one compilation per (kernel, dtype, N, affine, vec), not per M ------------------------------
def test_compile_cache_is_per_plan_not_per_rows():
    _need_compiler()
    kernel = _kernel("rms_norm", "fragment")
    before = compiler.COMPILE_COUNT
    kernel.prepare(_spec(n=1000, rows=3, dtype=torch.float16))
    kernel.prepare(_spec(n=1000, rows=1025, dtype=torch.float16))
    kernel.prepare(_spec(n=1000, rows=17, dtype=torch.float16, stride=1064))  # strided rows: same vec
    assert compiler.COMPILE_COUNT - before <= 1
    # The launch plan of a call does not depend on M either (CPU tensors suffice to plan).
    plans = set()
    for m in (1, 3, 1025):
        x = torch.zeros(m, 1000, dtype=torch.float16)
        y = torch.empty(m, 1016, dtype=torch.float16)[:, :1000]  # the harness's guarded y: stride N + 16
        plans.add(kernel._launch_plan(x, y, torch.ones(1000, dtype=torch.float16)))
    assert len(plans) == 1


# -- pitfall 1: T.reduce_sum(..., clear=False) accumulates onto the destination -------------------
def _reduce_program(clear: bool):
    import tilelang.language as T

    @T.prim_func
    def main(X: T.Tensor((4, 128), "float32"), Y: T.Tensor((4,), "float32")):
        with T.Kernel(1, threads=128) as bx:
            a = T.alloc_fragment((4, 128), "float32")
            s = T.alloc_fragment((4,), "float32")
            T.copy(X, a)
            for i in T.Parallel(4):
                s[i] = 7.0
            T.reduce_sum(a, s, dim=1, clear=clear)
            T.copy(s, Y)

    return main


@pytest.mark.parametrize("clear", [True, False])
def test_reduce_sum_clear_flag(clear):
    _need_compiler()
    plan = make_plan("fragment", torch.float32, 128, False, False, 4)
    kernel = compiler.compile_program(_reduce_program(clear), plan, compiler.default_target(), what="reduce_sum probe")
    src = kernel.get_kernel_source()
    body = src[src.index("main_kernel("):]
    seven = body.index("s[0] = 0x1.cp+2f")  # the destination's initial 7.0
    after = body[seven:]
    zeroes_dst = re.search(r"\bs\[0\] = 0x0p\+0f", after) is not None
    adds_onto_dst = re.search(r"\bs\[0\] = \(s\[0\] \+ s_clear\[0\]\)", after) is not None
    if clear:
        assert zeroes_dst and not adds_onto_dst, "clear=True must overwrite the destination"
    else:
        assert not zeroes_dst and adds_onto_dst, "clear=False must add the reduction onto the destination"
    if not HAS_CUDA:
        pytest.skip(NO_GPU)
    x = torch.arange(512, dtype=torch.float32, device="cuda").view(4, 128) / 64
    y = torch.empty(4, device="cuda")
    kernel(x, y)
    expected = x.double().sum(1) + (0 if clear else 7)
    torch.testing.assert_close(y.double(), expected, rtol=1e-6, atol=1e-4)


# -- pitfall 2: padding never enters the denominator ---------------------------------------------
@pytest.mark.parametrize("variant", ["fragment", "splitk", "naive_row_per_block", "layer_norm_fwd"])
def test_padded_lanes_are_guarded_and_n_is_the_divisor(variant):
    _need_compiler()
    plan = make_plan(variant, torch.bfloat16, 4000, True, variant == "layer_norm_fwd", 8)
    assert plan.padded % 4000 or variant == "naive_row_per_block"  # the row really is padded
    src = _source(variant, 4000)
    body = src[src.index("main_kernel("):]
    assert "/*4.000000e+03*/" in body, "the mean must divide by N = 4000"
    assert "/*4.096000e+03*/" not in body and "/*8.192000e+03*/" not in body, "divided by the padded length"
    # Every global load of x and store of y sits inside an if block (of any depth).
    for line in _unguarded_accesses(body):
        pytest.fail(f"{variant}: global access of x or y outside any if: {line}")


def _unguarded_accesses(body: str) -> list[str]:
    """Lines of a kernel body that touch X or Y while no enclosing block is an ``if``/``else``."""
    stack, bad = [], []
    for line in body.splitlines()[1:]:  # after the signature line
        text = line.strip()
        guarded = any(stack) or text.startswith("if (")
        if re.search(r"\b(X \+|X\[|Y \+|Y\[)", text) and not guarded:
            bad.append(text)
        for ch in text:
            if ch == "{":
                stack.append(text.startswith(("if (", "} else", "else")))
            elif ch == "}" and stack:
                stack.pop()
    return bad


def test_guard_check_finds_an_unguarded_store():
    body = "void k() {\n  for (int i = 0; i < 2; ++i) {\n    if (i < 1) {\n      X[i] = 0;\n    }\n    Y[i] = 1;\n  }\n}"
    assert _unguarded_accesses(body) == ["Y[i] = 1;"]


@pytest.mark.parametrize("op,variant", [("rms_norm", "fragment"), ("rms_norm", "splitk"),
                                        ("rms_norm", "naive_row_per_block"), ("layer_norm", "layer_norm_fwd")])
def test_padded_row_of_ones_executed(op, variant):
    if not HAS_CUDA:
        pytest.skip(NO_GPU)
    kernel = _kernel(op, variant)
    eps = 0.1
    x = torch.ones(5, 4000, dtype=torch.bfloat16, device="cuda")
    out = kernel(x, None, None, eps)
    if op == "rms_norm":
        torch.testing.assert_close(out.rstd, torch.full((5,), (1 + eps) ** -0.5, device="cuda"))
    else:
        torch.testing.assert_close(out.mean, torch.ones(5, device="cuda"))
        torch.testing.assert_close(out.rstd, torch.full((5,), eps ** -0.5, device="cuda"))


# -- pitfall 3: a layout conflict is a clear error, not a crash -----------------------------------
def _conflicting_program():
    import tilelang.language as T

    @T.prim_func
    def main(X: T.Tensor((4, 128), "float32"), Y: T.Tensor((4,), "float32")):
        with T.Kernel(1, threads=128) as bx:
            a = T.alloc_fragment((4, 128), "float32")
            s = T.alloc_fragment((4,), "float32")
            # The source spreads each row over all 128 threads; the destination puts row i on
            # thread 32 i only: no reduction lowers between them.
            T.annotate_layout({
                a: T.Fragment((4, 128), forward_thread_fn=lambda i, j: j, forward_index_fn=lambda i, j: i),
                s: T.Fragment((4,), forward_thread_fn=lambda i: i * 32, forward_index_fn=lambda i: 0),
            })
            T.copy(X, a)
            T.reduce_sum(a, s, dim=1)
            T.copy(s, Y)

    return main


def _plain_fragment_program(n: int):
    """The chapter's fragment kernel without padding: a row of N in a fragment as is."""
    import tilelang.language as T

    @T.prim_func
    def main(X: T.Tensor((8, n), "bfloat16"), Y: T.Tensor((8,), "float32")):
        with T.Kernel(8, threads=256) as bx:
            a = T.alloc_fragment((1, n), "bfloat16")
            s = T.alloc_fragment((1,), "float32")
            T.copy(X[bx:bx + 1, :], a)
            T.reduce_sum(a, s, dim=1)
            T.copy(s, Y[bx:bx + 1])

    return main


@pytest.mark.parametrize("program", ["reduce_conflict", "unpadded_n4000"])
def test_layout_failure_is_a_clear_error(program):
    _need_compiler()
    plan = make_plan("fragment", torch.bfloat16, 4000, True, False, 8)
    prog = _conflicting_program() if program == "reduce_conflict" else _plain_fragment_program(4000)
    with pytest.raises(compiler.TileLangCompileError) as info:
        compiler.compile_program(prog, plan, compiler.SM90)
    msg = str(info.value)
    assert msg.startswith("tilelang.fragment bfloat16 N=4000"), msg  # names kernel, dtype and N
    assert "layout" in msg and "tilelang.splitk" in msg  # says what failed and what to use


def test_source_command_prints_cuda():
    _need_compiler()
    out = subprocess.run(
        [sys.executable, "-m", "impls.tilelang.source", "--variant", "fragment", "--dtype", "bfloat16", "--n", "4000",
         "--no-weight"], capture_output=True, text=True, cwd=ROOT, check=True,
    ).stdout
    assert "__global__" in out and "tilelang.fragment bfloat16 N=4000 (no affine" in out
