"""The host fast path (impls.fastpath): a second call of a signature skips validation and planning,
gives the validated call's bits, and never serves a call whose signature differs."""
import pytest
import torch

import impls.triton as triton_api
from impls import base, callpath, registry
from impls.base import NormInputError, rows_view
from impls.triton._fast import lean_plan

registry.load_all()


def _kernels():
    out = []
    for op in ("rms_norm", "layer_norm"):
        for name in ("torch.eager", "triton.looped", "triton.rowwise", "triton.auto", "triton.invariant"):
            backend, variant = name.split(".")
            k = registry.get(op, backend, variant)
            if k.unavailable() is None:
                out.append(k)
    return out


KERNELS = _kernels()


DEVICE = "cuda" if torch.cuda.is_available() and not triton_api.availability() and \
    "cuda" in registry.get("rms_norm", "triton", "looped").devices else "cpu"


def _inputs(op, shape=(5, 100), weight=True, bias=True, dtype=torch.float32, stride_pad=0):
    """On the GPU where Triton compiles (the fast path's compiled launch), else on the CPU."""
    n = shape[-1]
    x = torch.randn(*shape[:-1], n + stride_pad, dtype=dtype, device=DEVICE)[..., :n]
    w = torch.randn(n, dtype=dtype, device=DEVICE) if weight else None
    b = torch.randn(n, dtype=dtype, device=DEVICE) if bias and op == "layer_norm" else None
    return x, w, b


def _equal(a, b):
    return all(torch.equal(s, t) for s, t in zip(a.fields().values(), b.fields().values())) and \
        a.fields().keys() == b.fields().keys()


@pytest.fixture
def no_validation(monkeypatch):
    """Makes any validated call fail, so a call that passes took the fast path."""
    def refuse(*args, **kwargs):
        raise AssertionError("validated")
    return lambda: monkeypatch.setattr(base, "validate_inputs", refuse)


@pytest.mark.parametrize("target", KERNELS, ids=lambda k: f"{k.op}-{k.name}")
@pytest.mark.parametrize("layout", ["contiguous", "strided", "3d", "noaffine"])
def test_second_call_takes_the_plan_and_gives_the_same_bits(target, layout, no_validation):
    kernel = target
    shape = (2, 3, 33) if layout == "3d" else (5, 100)
    x, w, b = _inputs(kernel.op, shape, weight=layout != "noaffine", bias=layout != "noaffine",
                      stride_pad=7 if layout == "strided" else 0)
    first = kernel(x, w, b, 1e-5, out=kernel.allocate(x))  # validated; leaves the plan
    no_validation()
    second = kernel(x, w, b, 1e-5)
    assert _equal(first, second)
    assert second.y.shape == x.shape and second.y.is_contiguous()
    for stat in kernel.outputs[1:]:
        assert getattr(second, stat).shape == x.shape[:-1]
    storages = {t.untyped_storage().data_ptr() for t in second.fields().values()}
    assert len(storages) == len(second.fields())  # no output aliases another (custom ops refuse that)


@pytest.mark.parametrize("target", KERNELS[:1] + [k for k in KERNELS if k.name == "triton.auto"],
                         ids=lambda k: f"{k.op}-{k.name}")
def test_another_signature_is_validated(target, no_validation):
    kernel = target
    callpath.forget(kernel)  # plans of earlier tests would serve these signatures
    x, w, b = _inputs(kernel.op)
    kernel(x, w, b, 1e-5)
    no_validation()
    others = [
        (x.to(torch.float16), w.half(), None if b is None else b.half()),  # dtype
        (x[:, 1:].contiguous(), w[1:], None if b is None else b[1:]),  # N
        (x[1:], w, b),  # M
        (x, None, b),  # no weight
        (torch.randn(5, 101, device=DEVICE)[:, 1:], w, b),  # 4 bytes off 16-byte alignment
    ]
    for args in others:
        with pytest.raises(AssertionError, match="validated"):
            kernel(*args, 1e-5)


def test_eps_is_checked_on_every_call():
    kernel = registry.get("layer_norm", "torch", "eager")
    x, w, b = _inputs("layer_norm")
    kernel(x, w, b, 1e-5)
    kernel(x, w, b, 1e-5)
    for eps, pattern in ((-1e-5, "eps must be finite"), (float("inf"), "eps must be finite"), ("1", "a number")):
        with pytest.raises(NormInputError, match=pattern):
            kernel(x, w, b, eps)
    assert _equal(kernel(x, w, b, 1e-3), kernel(x, w, b, 1e-3, out=kernel.allocate(x)))  # eps is not baked in


def test_a_copied_x_leaves_no_plan():
    """Rows that cannot be viewed with one stride are copied by the validated call: no plan."""
    kernel = registry.get("rms_norm", "torch", "eager")
    x = torch.randn(4, 6, 16, device=DEVICE).transpose(0, 1)  # leading dimensions not packed
    callpath.forget(kernel)
    kernel(x, None, None, 1e-6)
    assert not callpath.state(kernel)["signatures"]


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize("variant", ["looped", "rowwise"])
def test_triton_replayed_launch_matches_the_jit_call(op, variant):
    """The Triton plan's argument list rebuilt from a recorded launch (on the GPU it goes to the
    compiled kernel's launcher; under the interpreter through the JIT call) gives the same bits."""
    kernel = registry.get(op, "triton", variant)
    if kernel.unavailable():
        pytest.skip(kernel.unavailable())
    for shape, weight, bias, pad in (((5, 100), True, True, 0), ((3, 7), True, False, 0), ((1, 129), False, False, 0),
                                     ((2, 4, 33), False, True, 0), ((6, 40), True, True, 9)):
        x, w, b = _inputs(op, shape, weight, bias, stride_pad=pad)
        plan = lean_plan(kernel, x, rows_view(x, "x", allow_copy=True), w, b, None)
        assert plan is not None
        want = kernel(x, w, b, 1e-5, out=kernel.allocate(x))
        for _ in range(3):  # the first call compiles or finds the kernel; the later ones replay it
            assert _equal(plan(x, w, b, 1e-5), want)


def test_public_entry_points_plan_per_batch_invariance_flag():
    x, w, b = _inputs("layer_norm", (4, 64))
    for flag in (False, True):
        want = triton_api.layer_norm(x, w, b, out=None, batch_invariant=flag)
        assert _equal(triton_api.layer_norm(x, w, b, batch_invariant=flag), want)
    assert callpath.state(registry.get("layer_norm", "triton", "invariant"))["signatures"]


def _tensors_held(fn, depth=0):
    """Tensors a plan's closure keeps alive (through lists, tuples and nested closures)."""
    found = []
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:
            continue
        items = value if isinstance(value, (list, tuple)) else [value]
        for v in items:
            if isinstance(v, torch.Tensor):
                found.append(v)
            elif callable(v) and depth < 2 and getattr(v, "__closure__", None):
                found += _tensors_held(v, depth + 1)
    return found


@pytest.mark.parametrize("target", KERNELS, ids=lambda k: f"{k.op}-{k.name}")
def test_a_plan_keeps_no_call_tensors_alive(target):
    """A plan holds no tensor of the call that made it (its inputs, or the outputs its launch was
    recorded with): on the H200 at 27152d6 the recorded outputs stayed in Triton's plans, one set
    per signature, and the GPU ran out of memory."""
    kernel = target
    callpath.forget(kernel)
    x, w, b = _inputs(kernel.op, (64, 256))
    kernel(x, w, b, 1e-5)
    (plan,) = callpath.plans(kernel)
    assert not [t for t in _tensors_held(plan) if t.numel() > 1]


@pytest.mark.parametrize("variant", ["looped", "rowwise"])
def test_triton_replayed_launch_keeps_no_recorded_tensor(variant):
    kernel = registry.get("layer_norm", "triton", variant)
    if kernel.unavailable():
        pytest.skip(kernel.unavailable())
    x, w, b = _inputs("layer_norm", (64, 256))
    plan = lean_plan(kernel, x, rows_view(x, "x", allow_copy=True), w, b, None)
    assert not [t for t in _tensors_held(plan) if t.numel() > 1]
