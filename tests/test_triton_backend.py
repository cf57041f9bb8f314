"""The Triton backend's own contract: variant choice, launch heuristic, range limits, and the
interpreter's bfloat16 rounding matching the GPU's."""
import pytest
import torch

import impls.triton as tri
from impls.base import UnsupportedCase
from impls.reference import reference
from impls.triton.settings import (DECODE_MAX_ROWS, LOOPED_MAX_BLOCK, LOOPED_MAXNREG, LOOPED_TUNED, LOOPED_TUNED_FLOAT16,
                                   ROWWISE_ONE_ROW, SPLIT_MAX, SPLIT_MAX_BLOCK, LaunchConfig, launch_config,
                                   looped_block, split_config)
from impls.gpu_limits import next_pow2

pytestmark = pytest.mark.skipif(tri.availability() is not None, reason=f"triton cannot run: {tri.availability()}")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("n", [1, 7, 769, 4000, 4096, 5120, 8192, 16384, 32768, 65536, 65537, 262144])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("looped", [False, True])
def test_launch_config_covers_the_row(n, dtype, looped):
    for op in ("rms_norm", "layer_norm"):
        cfg = launch_config(n, dtype, looped, op)
        assert cfg.block_n & (cfg.block_n - 1) == 0 and 1 <= cfg.rows <= 64
        assert cfg.num_warps in (1, 2, 4, 8, 16, 32)
        assert cfg.rows * cfg.block_n >= 32 * cfg.num_warps  # no idle threads
        if looped:
            assert cfg.block_n <= max(LOOPED_MAX_BLOCK, next_pow2(n))
        else:
            assert cfg.block_n >= n  # one tile holds the whole row


def test_float16_table_comes_first_and_only_for_float16():
    for (op, n), entry in LOOPED_TUNED_FLOAT16.items():
        assert launch_config(n, torch.float16, True, op) == LaunchConfig(*entry)
        bf16 = LOOPED_TUNED.get((op, 2, n))
        if bf16:
            assert launch_config(n, torch.bfloat16, True, op) == LaunchConfig(*bf16)


def test_decode_rule_applies_to_few_long_rows_only():
    few = launch_config(4096, torch.bfloat16, False, "rms_norm", m=DECODE_MAX_ROWS)
    many = launch_config(4096, torch.bfloat16, False, "rms_norm", m=DECODE_MAX_ROWS + 1)
    assert few.w_first and few.rows == 1 and few.num_warps >= many.num_warps
    assert not many.w_first and many == launch_config(4096, torch.bfloat16, False, "rms_norm")
    assert not launch_config(256, torch.bfloat16, False, "rms_norm", m=8).w_first  # short rows share programs
    assert not launch_config(4096, torch.bfloat16, True, "rms_norm", m=8).w_first  # looped: no such rule


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_weight_first_changes_the_order_of_loads_not_the_result(op):
    """W_FIRST moves the weight and bias loads before the reduction; y, mean and rstd must be
    bit-identical to the other order."""
    from impls import registry

    kernel = registry.get(op, "triton", "rowwise")
    x = torch.randn(3, 1000, device=DEVICE, dtype=torch.bfloat16) + 2
    w, b = torch.randn(1000, device=DEVICE, dtype=x.dtype), torch.randn(1000, device=DEVICE, dtype=x.dtype)
    bias = b if op == "layer_norm" else None
    outs = []
    for first in (False, True):
        out = kernel.allocate(x)
        kernel._forward(x, w, bias, 1e-6, out, LaunchConfig(block_n=1024, rows=1, num_warps=4, w_first=first))
        outs.append(out)
    for name in kernel.outputs:
        assert torch.equal(getattr(outs[0], name), getattr(outs[1], name)), name


def test_one_row_kernel_runs_at_decode_and_where_it_measured_faster_only():
    for op in ("rms_norm", "layer_norm"):
        for dtype in (torch.bfloat16, torch.float32):
            assert launch_config(4096, dtype, False, op, m=64).one_row  # decode
    for op, itemsize, n in ROWWISE_ONE_ROW:
        dtype = torch.bfloat16 if itemsize == 2 else torch.float32
        cfg = launch_config(n, dtype, False, op, m=16384)
        assert cfg.one_row and cfg.rows == 1
        assert not launch_config(n, dtype, True, op, m=16384).one_row  # looped: never
    # slower there (docs/perf-notes.md, items 26 and 31): the [1, BLOCK_N] tile kernel
    assert not launch_config(16384, torch.bfloat16, False, "layer_norm", m=16384).one_row
    assert not launch_config(5120, torch.float16, False, "layer_norm", m=16384).one_row
    assert not launch_config(1000, torch.bfloat16, False, "layer_norm", m=16384).one_row  # 2 rows a program


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("w_first", [False, True])
def test_one_row_kernel_agrees_with_the_tile_kernel(op, dtype, w_first):
    """The 1-D kernel (one row per program) computes what the [1, BLOCK_N] tile kernel computes,
    on strided rows whose length is not the tile's."""
    from impls import registry

    kernel = registry.get(op, "triton", "rowwise")
    x = (torch.randn(5, 1200, device=DEVICE, dtype=dtype) * 2 + 3)[:, 100:1100]  # row stride 1200
    w, b = torch.randn(1000, device=DEVICE, dtype=dtype), torch.randn(1000, device=DEVICE, dtype=dtype)
    bias = b if op == "layer_norm" else None
    outs = []
    for one_row in (False, True):
        out = kernel.allocate(x)
        kernel._forward(x, w, bias, 1e-6, out,
                        LaunchConfig(block_n=1024, rows=1, num_warps=4, w_first=w_first, one_row=one_row))
        outs.append(out)
    for name in kernel.outputs:
        torch.testing.assert_close(getattr(outs[1], name), getattr(outs[0], name), msg=name)
    ref = reference(op, x, w, bias, 1e-6)
    torch.testing.assert_close(outs[1].y.double(), ref.y, atol=0.05 if dtype != torch.float32 else 1e-5, rtol=0.02)


def test_register_caps_are_set_where_measured_and_dropped_under_the_interpreter():
    for (op, itemsize, n), regs in LOOPED_MAXNREG.items():
        for dtype in (torch.bfloat16, torch.float16):
            assert launch_config(n, dtype, True, op).maxnreg == regs
        assert launch_config(n, torch.float32, True, op).maxnreg is None
    from impls import registry

    kernel = registry.get("layer_norm", "triton", "looped")
    x = torch.randn(2, 3000, device=DEVICE) + 5
    w, b = torch.randn(3000, device=DEVICE), torch.randn(3000, device=DEVICE)
    out = kernel.allocate(x)
    kernel._forward(x, w, b, 1e-5, out, LaunchConfig(block_n=1024, rows=1, num_warps=4, maxnreg=32))
    torch.testing.assert_close(out.y.double(), reference("layer_norm", x, w, b, 1e-5).y, atol=1e-5, rtol=1e-5)


def test_looped_chunks_cover_non_power_of_two_rows_with_little_padding():
    """5120 = 5 x 1024 and 12288 = 3 x 4096 (or 6 x 2048) columns: no chunk of mostly masked lanes."""
    for n in (5120, 12288, 20480, 3 * 8192):
        block = looped_block(n, 2)
        assert (-(-n // block)) * block - n <= n // 16, (n, block)


def test_variant_is_chosen_by_op_n_and_dtype():
    split = "split" if DEVICE == "cuda" else "looped"  # split runs on a GPU only
    assert tri.choose_variant("rms_norm", 2048, torch.bfloat16) == "looped"
    assert tri.choose_variant("rms_norm", 4096, torch.bfloat16) == "rowwise"
    assert tri.choose_variant("rms_norm", 4097, torch.float16) == "looped"
    assert tri.choose_variant("rms_norm", 32768, torch.float32) == "rowwise"
    assert tri.choose_variant("rms_norm", 65536, torch.float32) == split
    assert tri.choose_variant("layer_norm", 1024, torch.bfloat16) == "looped"
    assert tri.choose_variant("layer_norm", 2048, torch.bfloat16) == "rowwise"
    assert tri.choose_variant("layer_norm", 5120, torch.bfloat16) == "rowwise"
    assert tri.choose_variant("layer_norm", 8192, torch.float16) == "rowwise"
    assert tri.choose_variant("layer_norm", 12288, torch.float16) == "looped"
    assert tri.choose_variant("layer_norm", 8192, torch.float32) == "looped"
    assert tri.choose_variant("layer_norm", 12288, torch.float32) == "rowwise"
    assert tri.choose_variant("layer_norm", 65536, torch.float32) == split
    # few rows (decode): rowwise, whatever the table says for many
    assert tri.choose_variant("layer_norm", 8192, torch.bfloat16, m=64) == "rowwise"
    assert tri.choose_variant("rms_norm", 8192, torch.bfloat16, m=64) == "rowwise"
    assert tri.choose_variant("rms_norm", 8192, torch.bfloat16, m=DECODE_MAX_ROWS + 1) == "looped"
    assert tri.choose_variant("layer_norm", 16384, torch.bfloat16, m=1) == "looped"
    # past either variant's limit: looped, which takes any N
    assert tri.choose_variant("rms_norm", SPLIT_MAX * SPLIT_MAX_BLOCK + 1, torch.float32) == "looped"
    assert tri.choose_variant("layer_norm", SPLIT_MAX * SPLIT_MAX_BLOCK + 1, torch.float32) == "looped"


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_every_n_gets_a_variant_that_takes_it(op, dtype):
    from impls import registry

    for n in (1, 7, 1024, 2048, 4000, 4096, 5120, 8192, 12288, 32768, 32769, 65536, 262144, 2**21):
        kernel = registry.get(op, "triton", tri.choose_variant(op, n, dtype))
        assert kernel.max_n is None or n <= kernel.max_n, (op, n, kernel.name)


def test_rowwise_refuses_rows_longer_than_one_tile():
    from impls import registry

    kernel = registry.get("rms_norm", "triton", "rowwise")
    with pytest.raises(UnsupportedCase, match="N=65537 exceeds triton.rowwise's limit of 65536"):
        kernel(torch.randn(1, 65537, device=DEVICE))


@pytest.mark.parametrize("n", [1000, 70000])
def test_dispatch_functions_match_the_oracle(n):
    x = torch.randn(2, n, device=DEVICE, dtype=torch.float32) + 3
    w = torch.randn(n, device=DEVICE)
    b = torch.randn(n, device=DEVICE)
    out = tri.layer_norm(x, w, b, eps=1e-5)
    ref = reference("layer_norm", x, w, b, 1e-5)
    torch.testing.assert_close(out.y.double(), ref.y, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.mean.double(), ref.mean, rtol=1e-6, atol=1e-6)
    out = tri.rms_norm(x, w, eps=1e-6)
    torch.testing.assert_close(out.rstd.double(), reference("rms_norm", x, w, None, 1e-6).rstd, rtol=1e-6, atol=0)


def test_bfloat16_output_is_rounded_to_nearest_even():
    """y rounded to nearest from the float32 result (as the GPU does), not truncated (as the
    interpreter's plain cast does): truncation would agree on only about half the elements."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4000, generator=gen).to(torch.bfloat16).to(DEVICE)
    w = (1 + 0.5 * torch.randn(4000, generator=gen)).to(torch.bfloat16).to(DEVICE)
    out = tri.rms_norm(x, w, eps=1e-6)
    y32 = x.float() * out.rstd[:, None] * w.float()  # the kernel's float32 result, up to rounding
    nearest = (out.y == y32.to(torch.bfloat16)).float().mean().item()
    assert nearest > 0.999, nearest


# -- the split variant ------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 7, 769, 4000, 5120, 12288, 65537, 100000, 262144, SPLIT_MAX * SPLIT_MAX_BLOCK])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_split_config_covers_the_row_within_the_limits(n, dtype):
    for op in ("rms_norm", "layer_norm"):
        cfg = split_config(n, dtype, op)
        splits = -(-n // cfg.block_n)
        assert cfg.block_n & (cfg.block_n - 1) == 0 and cfg.block_n <= SPLIT_MAX_BLOCK
        assert 1 <= splits <= SPLIT_MAX and splits * cfg.block_n >= n
        assert 2 <= cfg.num_warps <= 32 and cfg.block_n >= 32 * cfg.num_warps  # no idle threads


def test_split_is_refused_under_the_interpreter_and_beyond_its_limit():
    from impls import registry
    from impls.base import NormSpec

    kernel = registry.get("rms_norm", "triton", "split")
    spec = NormSpec("rms_norm", torch.float32, 4, SPLIT_MAX * SPLIT_MAX_BLOCK + 1, SPLIT_MAX * SPLIT_MAX_BLOCK + 1,
                    DEVICE, True, False)
    why = kernel.unsupported(spec)
    if DEVICE == "cpu":
        assert "interpreter" in why  # its programs wait on each other: cannot run one at a time
    else:
        assert f"exceeds triton.split's limit of {SPLIT_MAX * SPLIT_MAX_BLOCK}" in why


@pytest.mark.skipif(DEVICE != "cuda", reason="the split kernels run on a GPU only")
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_split_leaves_its_workspace_zero_and_repeats_bit_for_bit(op):
    """More rows than groups (each group loops), several launches on two streams: every launch
    must start from zeroed exchange words, or a stale tag would let a program read an old partial."""
    from impls import registry
    from impls.triton._split import _WORKSPACE

    kernel = registry.get(op, "triton", "split")
    x = torch.randn(3000, 20000, device="cuda", dtype=torch.bfloat16) * 3 + 100
    w = torch.randn(20000, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(20000, device="cuda", dtype=torch.bfloat16) if op == "layer_norm" else None
    first = kernel(x, w, b)
    side = torch.cuda.Stream()
    for stream in (torch.cuda.current_stream(), side, torch.cuda.current_stream()):
        with torch.cuda.stream(stream):
            again = kernel(x, w, b)
        stream.synchronize()
        for name, t in first.fields().items():
            assert torch.equal(t, again.fields()[name]), name
    for words, done in _WORKSPACE.values():
        assert not words.any() and not done.any()
    ref = reference(op, x, w, b, 1e-6 if op == "rms_norm" else 1e-5)
    torch.testing.assert_close(first.y.float(), ref.y.float(), atol=0.05, rtol=0.02)
