"""The fused ops of the public package: normdiff.add_rms_norm / add_layer_norm (new outputs and in
place), their modules and Functions, held to the float64 oracle (impls.reference) forward and to
torch.autograd in float64 backward; Gemma's offset, the fp8 output, torch.compile (fullgraph) of
both write forms, and the refusals. Without a GPU the kernel is triton.fused under Triton's
interpreter: the shapes are small."""
import pytest
import torch
from torch import nn

import normdiff
from impls.inputs import NormInputError
from impls.reference import reference_fused
from impls.torch_fused import quantize_fp8
from impls.fused import FusedParams
from normdiff._kernels import kernel_for

SHAPE = (2, 3, 33)  # leading dimensions and an odd N: a padded tile
EPS = {"add_rms_norm": 1e-6, "add_layer_norm": 1e-5}
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


def _inputs(dtype=torch.float32, residual_dtype=None, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(SHAPE, generator=g).to(dtype)
    r = torch.randn(SHAPE, generator=g).to(residual_dtype or dtype)
    w = (1 + 0.1 * torch.randn(SHAPE[-1], generator=g)).to(dtype)
    b = (0.1 * torch.randn(SHAPE[-1], generator=g)).to(dtype) if bias else None
    return x, r, w, b


def _call(op, x, r, w, b, **kw):
    if op == "add_rms_norm":
        return normdiff.add_rms_norm(x, r, w, EPS[op], **kw)
    return normdiff.add_layer_norm(x, r, w, b, EPS[op], **kw)


def test_auto_runs_the_fused_kernel_and_says_so(record_property):
    for op in ("add_rms_norm", "add_layer_norm"):
        name = normdiff.kernel_name(op)
        record_property(op, name)
        assert name in ("triton.fused", "torch.fused") and name == kernel_for(op, "auto").name
    with pytest.raises(RuntimeError, match="fused-family kernel"):
        normdiff.rms_norm(torch.randn(2, 4), kernel="triton.fused")
    with pytest.raises(RuntimeError, match="no add_rms_norm kernel for 'triton.invariant'"):
        normdiff.add_rms_norm(torch.randn(2, 4), torch.randn(2, 4), kernel="triton.invariant")


@pytest.mark.parametrize("dtype,residual_dtype", [(torch.float32, None), (torch.bfloat16, None),
                                                  (torch.bfloat16, torch.float32)], ids=["f32", "bf16", "bf16+f32res"])
@pytest.mark.parametrize("op", ["add_rms_norm", "add_layer_norm"])
def test_new_and_in_place_match_the_oracle(op, dtype, residual_dtype):
    x, r, w, b = _inputs(dtype, residual_dtype)
    ref, _ = reference_fused(op, x, r, w, b if op == "add_layer_norm" else None, EPS[op])
    y, r_out = _call(op, x, r, w, b)
    assert y.dtype == dtype and r_out.dtype == r.dtype and y.shape == x.shape
    torch.testing.assert_close(y.double(), ref.y, **TOL[dtype])
    torch.testing.assert_close(r_out, ref.residual_out.to(r.dtype), rtol=0, atol=0)
    xi, ri = x.clone(), r.clone()
    got = _call(op, xi, ri, w, b, write="in_place")
    assert got[0] is xi and got[1] is ri
    assert torch.equal(xi, y) and torch.equal(ri, r_out)  # the same kernel, written in place


def test_gemma_offset_and_its_module():
    x, r, w, _ = _inputs()
    ref, _ = reference_fused("add_rms_norm", x, r, w, None, 1e-6, weight_offset=1.0)
    y, _ = normdiff.add_rms_norm(x, r, w, 1e-6, weight_offset=1.0)
    torch.testing.assert_close(y.double(), ref.y, rtol=1e-5, atol=1e-5)
    m = normdiff.FusedAddRMSNorm(SHAPE[-1], eps=1e-6, weight_offset=1.0)
    assert torch.equal(m.weight, torch.zeros(SHAPE[-1])) and "weight_offset=1" in repr(m)
    y, r_out = m(x, r)
    torch.testing.assert_close(y, nn.functional.rms_norm(x + r, (SHAPE[-1],), eps=1e-6), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_output_and_no_backward_through_it(fp8):
    x, r, w, _ = _inputs()
    scale = 0.05  # large enough that some values saturate
    y, r_out = normdiff.add_rms_norm(x, r, w, 1e-6, out_dtype=fp8, scale=scale)
    ref, _ = reference_fused("add_rms_norm", x, r, w, None, 1e-6)
    want = quantize_fp8(ref.y.float(), FusedParams(out_dtype=fp8, scale=scale))
    assert y.dtype == fp8 and r_out.dtype == x.dtype
    step = 2.0 ** -(3 if fp8 == torch.float8_e4m3fn else 2)  # one unit in the last place, relative
    torch.testing.assert_close(y.float(), want.float(), rtol=step, atol=0)
    with pytest.raises(NormInputError, match="fp8 output has no backward"):
        normdiff.add_rms_norm(x, r, w.requires_grad_(), out_dtype=fp8, scale=scale)
    with torch.no_grad():
        assert torch.equal(normdiff.add_rms_norm(x, r, w, 1e-6, out_dtype=fp8, scale=scale)[0].float(), y.float())


def _autograd64(op, x, r, w, b, dy, dro):
    """Gradients of sum(y * dy + residual_out * dro) by torch.autograd in float64."""
    leaves = [t.detach().double().requires_grad_() for t in (x, r, w) + ((b,) if b is not None else ())]
    s = leaves[0] + leaves[1]
    n = (SHAPE[-1],)
    if op == "add_rms_norm":
        y = nn.functional.rms_norm(s, n, leaves[2], eps=EPS[op])
    else:
        y = nn.functional.layer_norm(s, n, leaves[2], leaves[3] if b is not None else None, eps=EPS[op])
    return torch.autograd.grad((y * dy.double()).sum() + (s * dro.double()).sum(), leaves)


@pytest.mark.parametrize("use", ["both", "y", "residual_out"])
@pytest.mark.parametrize("op", ["add_rms_norm", "add_layer_norm"])
def test_gradients_match_autograd_in_float64(op, use):
    x, r, w, b = (t.requires_grad_() if t is not None else None for t in _inputs(bias=op == "add_layer_norm"))
    g = torch.Generator().manual_seed(2)
    dy, dro = torch.randn(SHAPE, generator=g), torch.randn(SHAPE, generator=g)
    dy, dro = (dy if use != "residual_out" else 0 * dy), (dro if use != "y" else 0 * dro)
    y, r_out = _call(op, x, r, w, b)
    loss = {"y": (y * dy).sum(), "residual_out": (r_out * dro).sum(), "both": (y * dy + r_out * dro).sum()}[use]
    leaves = [t for t in (x, r, w, b) if t is not None]
    got = torch.autograd.grad(loss, leaves, allow_unused=use == "residual_out")
    for name, a, want in zip("x residual weight bias".split(), got, _autograd64(op, x, r, w, b, dy, dro)):
        a = torch.zeros_like(want) if a is None else a.double()
        torch.testing.assert_close(a, want, rtol=1e-4, atol=1e-4, msg=name)


def test_functions_and_modules_give_the_ops_gradients():
    x, r, w, b = (t.requires_grad_() for t in _inputs())
    runs = {"op": lambda: normdiff.add_layer_norm(x, r, w, b, 1e-5),
            "function": lambda: normdiff.AddLayerNormFunction.apply(x, r, w, b, 1e-5, "auto")}
    m = normdiff.FusedAddLayerNorm(SHAPE[-1], eps=1e-5)
    with torch.no_grad():
        m.weight.copy_(w), m.bias.copy_(b)
    grads = {}
    for name, f in runs.items():
        y, r_out = f()
        grads[name] = torch.autograd.grad((y.square() + r_out).sum(), (x, r, w, b))
    y, r_out = m(x, r)
    grads["module"] = torch.autograd.grad((y.square() + r_out).sum(), (x, r, m.weight, m.bias))
    for name in ("function", "module"):
        for a, c in zip(grads["op"], grads[name]):
            assert torch.equal(a, c), name
    y, r_out = normdiff.AddRMSNormFunction.apply(x, r, w, 1e-6, 0.0, "auto")
    assert torch.equal(y, normdiff.add_rms_norm(x, r, w, 1e-6)[0])


@pytest.mark.parametrize("op", ["add_rms_norm", "add_layer_norm"])
def test_compiled_fullgraph_both_forms(op):
    x, r, w, b = _inputs()
    want = _call(op, x, r, w, b)

    def new(x, r, w, b):
        y, r_out = _call(op, x, r, w, b)
        return y * 2, r_out

    y2, r_out = torch.compile(new, backend="aot_eager", fullgraph=True)(x, r, w, b)
    assert torch.equal(y2, want[0] * 2) and torch.equal(r_out, want[1])
    xi, ri = x.clone(), r.clone()
    in_place = torch.compile(lambda *a: _call(op, *a, write="in_place"), backend="aot_eager", fullgraph=True)
    in_place(xi, ri, w, b)
    assert torch.equal(xi, want[0]) and torch.equal(ri, want[1])
    leaves = [t.clone().requires_grad_() for t in (x, r, w, b)]
    y2, r_out = torch.compile(new, backend="aot_eager", fullgraph=True)(*leaves)
    got = torch.autograd.grad((y2 + r_out).sum(), leaves if op == "add_layer_norm" else leaves[:3])
    y, r_out = _call(op, *leaves)
    eager = torch.autograd.grad((2 * y + r_out).sum(), leaves if op == "add_layer_norm" else leaves[:3])
    for a, c in zip(got, eager):
        torch.testing.assert_close(a, c, rtol=1e-6, atol=1e-6)
    with pytest.raises(Exception, match="has no backward, and an input requires grad"):
        in_place(*leaves)  # Dynamo reports the NormInputError in its own exception under fullgraph


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_eager_torch_kernels_backward_inside_the_custom_ops(compiled):
    """torch.fused / torch.eager (the fallback where Triton cannot run) take their backward by
    torch.autograd inside the backward op, whose impl runs below autograd's dispatch keys."""
    x, r, w, _ = (t.requires_grad_() if t is not None else None for t in _inputs(bias=False))
    grads = {}
    for kernel in ("torch", "auto"):
        fused = lambda *a: normdiff.add_rms_norm(*a, 1e-6, kernel=f"{kernel}.fused" if kernel == "torch" else kernel)
        plain = lambda a, c: normdiff.rms_norm(a, c, 1e-6, kernel="torch.eager" if kernel == "torch" else kernel)
        if compiled:
            fused, plain = (torch.compile(f, backend="aot_eager", fullgraph=True) for f in (fused, plain))
        y, r_out = fused(x, r, w)
        grads[kernel] = torch.autograd.grad((y.square() + r_out + plain(x, w)).sum(), (x, r, w))
    for a, c in zip(grads["torch"], grads["auto"]):
        torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-5)


def _bad_calls():
    x, r, w, _ = _inputs()
    buf = torch.randn(2 * SHAPE[-1] + 4)
    return [
        (lambda: normdiff.add_rms_norm(x, r[..., :8], w), "residual has shape"),
        (lambda: normdiff.add_rms_norm(x, r.to(torch.int32), w), "residual has dtype int32"),
        (lambda: normdiff.add_rms_norm(x.double(), r, w), "x has dtype float64"),
        (lambda: normdiff.add_rms_norm(x, r, w[:8]), "weight has shape"),
        (lambda: normdiff.add_rms_norm(buf[:SHAPE[-1]], buf[4:SHAPE[-1] + 4], w), "overlap"),
        (lambda: normdiff.add_rms_norm(x, r, None, weight_offset=1.0), "weight_offset applies to a weight"),
        (lambda: normdiff.add_rms_norm(x, r, w, out_dtype=torch.float8_e4m3fn), "needs scale"),
        (lambda: normdiff.add_rms_norm(x, r, w, out_dtype=torch.float8_e4m3fn, scale=-1.0), "needs scale"),
        (lambda: normdiff.add_rms_norm(x, r, w, out_dtype=torch.float16, scale=1.0), "out_dtype"),
        (lambda: normdiff.add_rms_norm(x, r, w, out_dtype=torch.float8_e4m3fn, scale=1.0, write="in_place"),
         "fp8 y cannot be written into x"),
        (lambda: normdiff.add_rms_norm(x, r, w, write="out_y"), "writes 'new' or 'in_place'"),
        (lambda: normdiff.add_layer_norm(x, r, w, eps=-1.0), "eps"),
        (lambda: normdiff.add_rms_norm(x, r, w.requires_grad_(), write="in_place"), "requires grad"),
    ]


@pytest.mark.parametrize("case", range(len(_bad_calls())))
def test_bad_input_is_refused_with_the_reason(case):
    call, match = _bad_calls()[case]
    with pytest.raises(NormInputError, match=match):
        call()
