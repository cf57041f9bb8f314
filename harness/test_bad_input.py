"""Every selected kernel refuses bad input with an error that names the problem, before any
backend code runs, and handles the edge inputs the interface accepts (empty batch, 3-D).

The valid calls these checks make themselves (the warm-up before a bad call, the edge inputs) use
what the kernel declares: a dtype of ``NormKernel.dtypes`` (float32 where declared), rows of at
least ``min_n``, the full affine form. Where the kernel still cannot run them (``unsupported``, or
``UnsupportedCase`` from the call) the check is skipped with the kernel's reason: it judges what
the kernel does, not an assumption of the harness. The bad inputs themselves stay as they are.
"""
import pytest
import torch

from harness.running.run import STATE
from harness.judging.runner import device_for
from impls import callpath
from impls.base import SUPPORTED_DTYPES, NormInputError, UnsupportedCase, dtype_name, spec_of

N = 64


def _x(device, dtype=torch.float32, shape=(4, N)):
    return torch.randn(shape, device=device).to(dtype)


# name -> (builds (x, weight, bias, eps) on a device, pattern the error must match, ops it applies to)
BAD_INPUTS = {
    "int_dtype": (lambda d: (torch.ones(4, N, dtype=torch.int32, device=d), None, None, 1e-5), r"dtype int32", None),
    "float64_dtype": (lambda d: (_x(d, torch.float64), None, None, 1e-5), r"dtype float64", None),
    "weight_wrong_length": (lambda d: (_x(d), torch.ones(N + 1, device=d), None, 1e-5), r"weight has shape \(65,\)", None),
    "weight_wrong_device": (lambda d: (_x(d), torch.ones(N, device="meta"), None, 1e-5), r"weight is on meta", None),
    "weight_wrong_dtype": (lambda d: (_x(d), torch.ones(N, device=d, dtype=torch.float16), None, 1e-5), r"weight has dtype float16", None),
    "bias_for_rms_norm": (lambda d: (_x(d), None, torch.zeros(N, device=d), 1e-5), r"rms_norm takes no bias", "rms_norm"),
    "bias_wrong_length": (lambda d: (_x(d), None, torch.zeros(N - 1, device=d), 1e-5), r"bias has shape \(63,\)", "layer_norm"),
    "last_dim_not_contiguous": (lambda d: (_x(d, shape=(N, 4)).t(), None, None, 1e-5), r"last dimension is not contiguous", None),
    "zero_length_rows": (lambda d: (_x(d, shape=(4, 0)), None, None, 1e-5), r"N must be at least 1", None),
    "negative_eps": (lambda d: (_x(d), None, None, -1e-5), r"eps must be finite and >= 0, got -1e-05", None),
    "nan_eps": (lambda d: (_x(d), None, None, float("nan")), r"eps must be finite and >= 0, got nan", None),
    "eps_not_a_number": (lambda d: (_x(d), None, None, "1e-5"), r"eps must be a number", None),
}


def _runnable(kernel) -> str:
    why = kernel.unavailable()
    if why:
        pytest.skip(why)
    return device_for(kernel)


def pytest_generate_tests(metafunc):
    if "kernel_bad" in metafunc.fixturenames:
        pairs = [(k, bad, cache) for k in metafunc.config.stash[STATE].kernels
                 for bad, (_, _, op) in sorted(BAD_INPUTS.items()) if op in (None, k.op) for cache in ("cold", "warm")]
        metafunc.parametrize("kernel_bad", pairs, ids=[f"{k.op}-{k.name}-{bad}-{cache}" for k, bad, cache in pairs])


def _valid_n(kernel) -> int:
    """The shortest row the edge-input checks may call the kernel at (a long-row kernel refuses N)."""
    return max(N, kernel.min_n)


def valid_dtype(kernel) -> torch.dtype:
    """The dtype of the valid calls these checks build: float32 where the kernel declares it,
    else the first it declares (FlashInfer's RMSNorm: float16)."""
    declared = [d for d in SUPPORTED_DTYPES if d in kernel.dtypes]
    return torch.float32 if torch.float32 in declared or not declared else declared[0]


def _valid_inputs(kernel, device, shape) -> tuple:
    """(x, weight, bias) of a valid call of ``shape`` in a dtype the kernel declares; skips with
    the kernel's own reason where it cannot run them."""
    dtype = valid_dtype(kernel)
    x = _x(device, dtype, shape)
    w, b = _affine(kernel, device, shape[-1], dtype)
    reason = kernel.unsupported(spec_of(kernel.op, x.reshape(-1, shape[-1]), device, w, b))
    if reason:
        pytest.skip(f"{kernel.name} cannot run the valid {dtype_name(dtype)} call {tuple(shape)}: {reason}")
    return x, w, b


def _valid_call(kernel, x, w, b):
    """The kernel on a valid call; UnsupportedCase from it is a skip with its reason."""
    try:
        return kernel(x, w, b, 1e-5)
    except UnsupportedCase as exc:
        pytest.skip(f"{kernel.name} refused the valid {dtype_name(x.dtype)} call {tuple(x.shape)}: {exc}")


def _warm(kernel, x, weight, bias, device) -> None:
    """Leave host fast-path plans (impls.fastpath) for the signatures nearest a bad call's: its own
    tensors where the interface accepts them, and the plain valid call (in a declared dtype)."""
    for args in ((x, weight, bias), (x, None, None)):
        for _ in range(2):  # the second call runs the plan the first left
            try:
                kernel(*args, 1e-5)
            except (NormInputError, UnsupportedCase, TypeError):
                break
    valid = _valid_inputs(kernel, device, (4, _valid_n(kernel)))
    for _ in range(2):
        _valid_call(kernel, *valid)
    assert callpath.state(kernel)["signatures"], f"{kernel.name}: valid calls left no plan behind"


@pytest.mark.needs("small")
def test_rejects_bad_input(kernel_bad):
    """Refused with the error that names the problem, also once valid calls of nearby signatures
    have left their plans behind (warm): the fast path never accepts what validation refuses."""
    kernel, bad, cache = kernel_bad
    make, pattern, _ = BAD_INPUTS[bad]
    device = _runnable(kernel)
    x, weight, bias, eps = make(device)
    if cache == "warm":
        _warm(kernel, x, weight, bias, device)
    with pytest.raises(NormInputError, match=pattern):
        kernel(x, weight, bias, eps)


def _affine(kernel, device, n=N, dtype=torch.float32):
    """Weight (and bias for LayerNorm): every backend takes the full affine form (some take
    no other, e.g. apex's and Liger's LayerNorm), and these checks are about shapes."""
    w = torch.ones(n, device=device, dtype=dtype)
    return w, (torch.zeros_like(w) if kernel.op == "layer_norm" else None)


@pytest.mark.needs("small")
def test_empty_batch_returns_empty_outputs(kernel):
    device = _runnable(kernel)
    x, w, b = _valid_inputs(kernel, device, (2, 0, _valid_n(kernel)))
    n = x.shape[-1]
    out = _valid_call(kernel, x, w, b)
    assert out.y.shape == (2, 0, n)
    for name in ("mean", "rstd"):
        stat = getattr(out, name)
        assert (stat is None) == (name not in kernel.outputs)
        assert stat is None or (stat.shape == (2, 0) and stat.dtype == torch.float32)


@pytest.mark.needs("small")
def test_output_shapes_follow_input(kernel):
    device = _runnable(kernel)
    x, w, b = _valid_inputs(kernel, device, (2, 3, _valid_n(kernel)))
    out = _valid_call(kernel, x, w, b)
    assert out.y.shape == x.shape and out.y.dtype == x.dtype
    for name in kernel.outputs[1:]:
        stat = getattr(out, name)
        assert stat.shape == (2, 3) and stat.dtype == torch.float32, name
