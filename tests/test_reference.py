"""The float64 oracle, forward and backward: the backward's analytic formulas against
torch.autograd of the forward in float64, and that autograd against finite differences
(torch.autograd.gradcheck)."""
import pytest
import torch

from impls.reference import reference, reference_backward

CASES = [("rms_norm", (5, 33), True, False), ("rms_norm", (4, 17), False, False), ("rms_norm", (2, 3, 40), True, False),
         ("layer_norm", (5, 33), True, True), ("layer_norm", (4, 17), True, False), ("layer_norm", (4, 17), False, True),
         ("layer_norm", (3, 9), False, False), ("layer_norm", (2, 3, 40), True, True)]


def _inputs(shape, has_w, has_b, dtype=torch.float64, offset=0.0):
    g = torch.Generator().manual_seed(sum(shape))
    x = (torch.randn(shape, generator=g, dtype=torch.float64) + offset).to(dtype)
    dy = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    n = shape[-1]
    w = (1 + 0.5 * torch.randn(n, generator=g, dtype=torch.float64)).to(dtype) if has_w else None
    b = (0.5 * torch.randn(n, generator=g, dtype=torch.float64)).to(dtype) if has_b else None
    return x, dy, w, b


def _autograd(op, x, dy, w, b, eps):
    leaves = [t.double().detach().requires_grad_() if t is not None else None for t in (x, w, b)]
    y = reference(op, leaves[0], leaves[1], leaves[2], eps).y
    grads = torch.autograd.grad(y, [t for t in leaves if t is not None], dy.double())
    it = iter(grads)
    return [next(it) if t is not None else None for t in leaves]


@pytest.mark.parametrize("op,shape,has_w,has_b", CASES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_backward_formulas_match_autograd_in_float64(op, shape, has_w, has_b, dtype):
    x, dy, w, b = _inputs(shape, has_w, has_b, dtype, offset=3.0 if op == "layer_norm" else 0.0)
    got = reference_backward(op, x, dy, w, b, 1e-5)
    dx, dw, db = _autograd(op, x, dy, w, b, 1e-5)
    torch.testing.assert_close(got.dx, dx, rtol=1e-10, atol=1e-12)
    for mine, theirs in ((got.dw, dw), (got.db, db)):
        assert (mine is None) == (theirs is None)
        if mine is not None:
            torch.testing.assert_close(mine, theirs, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_the_forward_oracle_passes_gradcheck(op):
    x, _, w, b = _inputs((3, 11), True, op == "layer_norm")
    args = [t.requires_grad_() for t in (x, w) + ((b,) if b is not None else ())]
    assert torch.autograd.gradcheck(lambda *a: reference(op, *a, eps=1e-5).y, args)


def test_the_mean_term_matters():
    """Dropping LayerNorm's mean term (a classic backward bug) moves dx far beyond rounding."""
    x, dy, w, b = _inputs((4, 64), True, True, offset=2.0)
    good = reference_backward("layer_norm", x, dy, w, b, 1e-5)
    rms_like = reference_backward("rms_norm", x - x.mean(-1, keepdim=True), dy, w, None, 1e-5)
    assert (good.dx - rms_like.dx).abs().max() > 1e-3
