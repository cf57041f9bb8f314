"""The public package normdiff: its modules train a tiny model as torch's nn.RMSNorm and
nn.LayerNorm do, eagerly and under torch.compile (fullgraph, Inductor). On a machine without a
GPU the kernel that runs is triton.invariant under Triton's interpreter (kernel="auto"; eager
PyTorch where triton is missing, which the test names)."""
import pytest
import torch
from torch import nn

import normdiff
from normdiff._kernels import kernel_for

STEPS, M, N = 3, 12, 33  # N odd: a padded tile in the Triton kernels


def _model(norm: nn.Module) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, N), norm, nn.GELU(), nn.Linear(N, 8))
    with torch.no_grad():  # non-trivial affine parameters, the same in both models
        for p in norm.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def _train(model: nn.Module, compiled: bool) -> list[float]:
    g = torch.Generator().manual_seed(1)
    x, target = torch.randn(2, M // 2, 16, generator=g), torch.randn(2, M // 2, 8, generator=g)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    run = torch.compile(model, fullgraph=True) if compiled else model
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = nn.functional.mse_loss(run(x), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


PAIRS = {
    "rms_norm": (lambda: normdiff.RMSNorm(N, eps=1e-6), lambda: nn.RMSNorm(N, eps=1e-6)),
    "layer_norm": (lambda: normdiff.LayerNorm(N, eps=1e-5), lambda: nn.LayerNorm(N, eps=1e-5)),
}


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_training_matches_torch_modules(op, compiled, record_property):
    record_property("kernel", kernel_for(op, "auto").name)
    ours, theirs = (_model(make()) for make in PAIRS[op])
    got, want = _train(ours, compiled), _train(theirs, False)
    assert got == pytest.approx(want, rel=1e-5, abs=1e-6)
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)


def test_functions_and_ops_give_the_same_gradients():
    x = torch.randn(5, N, requires_grad=True)
    w, b = (torch.randn(N, requires_grad=True) for _ in range(2))
    grads = []
    for f in (lambda: normdiff.LayerNormFunction.apply(x, w, b, 1e-5, "auto"),
              lambda: normdiff.layer_norm(x, w, b, 1e-5)):
        grads.append(torch.autograd.grad(f().square().sum(), (x, w, b)))
    for a, c in zip(*grads):
        assert torch.equal(a, c)
    y = normdiff.RMSNormFunction.apply(x, None, 1e-6, "auto")
    torch.testing.assert_close(y, nn.functional.rms_norm(x, (N,), eps=1e-6), rtol=1e-5, atol=1e-6)


def test_an_unknown_kernel_is_refused_with_the_reason():
    with pytest.raises(RuntimeError, match="no rms_norm kernel"):
        normdiff.rms_norm(torch.randn(2, 4), kernel="nosuch.kernel")
