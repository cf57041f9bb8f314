"""Stand-ins for the peers' libraries (Liger-Kernel, QuACK, FlashInfer, apex's extension) with
their public functions' signatures: each call is logged with what it was given (every tensor's
shape, strides, dtype, bytes and whose storage it is), and it returns or writes tensors made
from its arguments, the same for the same arguments. tests/test_repro_peer_calls.py runs a
plug-in's call and its repro's on them and compares the logs and the outputs."""
from __future__ import annotations

import types

import torch

LOG: list = []


def _made(t: torch.Tensor, dtype=None) -> torch.Tensor:
    """A fresh contiguous tensor computed from ``t`` (what a kernel returns)."""
    return (t.float() * 0.5 + 0.25).to(dtype or t.dtype).contiguous()


def _stat(t: torch.Tensor) -> torch.Tensor:
    return t.float().sum(-1) * 0.125


def logged(fn):
    def call(*args, **kwargs):
        LOG.append((fn.__name__, args, kwargs))
        return fn(*args, **kwargs)

    call.__name__ = fn.__name__
    return call


# -- Liger-Kernel 0.8.5: liger_kernel.ops.{rms_norm, layer_norm, fused_add_rms_norm, utils}
@logged
def rms_norm_forward(X, W, eps, offset, casting_mode, row_mode):
    return _made(X), X, _stat(X), 1024, 4, 1


@logged
def rms_norm_backward(dY, X, W, RSTD, offset, casting_mode, BLOCK_SIZE, num_warps, in_place, row_mode):
    return _made(dY), None if W is None else _made(W)


@logged
def layer_norm_forward(X, W, B, eps):
    return _made(X), X, _stat(X), _stat(X) + 1, 1024, 4


@logged
def layer_norm_backward(dY, X, W, B, Mean, RSTD):
    return _made(dY), _made(W), _made(B)


@logged
def fused_add_rms_norm_forward(X, R, W, eps, offset, casting_mode):
    return _made(X), _made(R, X.dtype), _stat(X), 1024, 4, 2, 1


@logged
def fused_add_rms_norm_backward(dY, dS_out, S, W, RSTD, offset, casting_mode, BLOCK_SIZE, num_warps, num_stages,
                                in_place):
    return _made(dY), _made(dS_out), _made(W)


@logged
def calculate_settings(n):
    return 1024, 4


# -- QuACK 0.6.5: quack.rmsnorm
@logged
def rmsnorm_fwd(x, weight=None, bias=None, residual=None, out_dtype=None, residual_dtype=None, eps=1e-6,
                store_rstd=False, weight_offset=0.0):
    r_out = x if residual is None else _made(residual)
    return _made(x), r_out, _stat(x) if store_rstd else None


@logged
def rmsnorm_bwd(x, weight, dout, rstd, dresidual_out=None, has_bias=False, has_residual=False, weight_offset=0.0):
    dres = _made(dout) if has_residual else None
    return _made(dout), None if weight is None else _made(weight, torch.float32), None, dres


@logged
def layernorm_fwd(x, weight, bias=None, eps=1e-6, return_rstd=False, return_mean=False):
    return _made(x), _stat(x), _stat(x) + 1


@logged
def layernorm_bwd(x, weight, dy, rstd, mean, has_bias=False):
    return _made(dy), _made(weight), _made(weight) + 1 if has_bias else None


@logged
def rmsnorm_fwd_tuned(x, weight, out, bias, rstd, mean, eps=1e-6, is_layernorm=False, per_head=False):
    out.copy_(_made(x))
    rstd.copy_(_stat(x))
    if mean is not None:
        mean.copy_(_stat(x) + 1)


# -- FlashInfer 0.7.2.post1: flashinfer.norm
@logged
def rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None):
    return _made(input)


@logged
def layernorm(input, gemma, beta, eps=1e-6):
    return _made(input)


def _in_place(input, residual):
    residual.copy_(_made(residual) + input.to(residual.dtype))
    input.copy_(_made(residual, input.dtype))


@logged
def fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None):
    _in_place(input, residual)


@logged
def gemma_fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None):
    _in_place(input, residual)


@logged
def fused_add_rmsnorm_quant(out, input, residual, weight, scale, eps=1e-6, enable_pdl=None):
    residual.copy_(_made(residual) + input.to(residual.dtype))
    out.copy_(_made(residual, torch.float32).to(out.dtype))


@logged
def gemma_rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None):
    out.copy_(_made(input))
    return out


@logged
def rmsnorm_quant(out, input, weight, scale, eps=1e-6, enable_pdl=None):
    out.copy_(_made(input, torch.float32).to(out.dtype))


@logged
def layernorm_quant(out, input, gamma, beta, scale, eps=1e-6):
    out.copy_(_made(input, torch.float32).to(out.dtype))


# -- apex: fused_layer_norm_cuda
@logged
def rms_forward(x, shape, eps):
    return [_made(x), _stat(x)]


@logged
def rms_forward_affine(x, shape, weight, eps):
    return [_made(x), _stat(x)]


@logged
def forward(x, shape, eps):
    return [_made(x), _stat(x) + 1, _stat(x)]


@logged
def forward_affine(x, shape, weight, bias, eps):
    return [_made(x), _stat(x) + 1, _stat(x)]


@logged
def rms_backward(dy, invvar, x, shape, eps, memory_efficient):
    return _made(dy)


@logged
def rms_backward_affine(dy, invvar, x, shape, weight, eps, memory_efficient):
    return [_made(dy), _made(weight)]


@logged
def backward(dy, mean, invvar, x, shape, eps, memory_efficient):
    return _made(dy)


@logged
def backward_affine(dy, mean, invvar, x, shape, weight, bias, eps, memory_efficient):
    return [_made(dy), _made(weight), _made(bias)]


CASTING = {"llama": 0, "gemma": 1, "none": 2}
MODULES = {
    "liger_kernel": {}, "liger_kernel.ops": {},
    "liger_kernel.ops.rms_norm": dict(rms_norm_forward=rms_norm_forward, rms_norm_backward=rms_norm_backward,
                                      _str_to_casting_mode=CASTING),
    "liger_kernel.ops.layer_norm": dict(layer_norm_forward=layer_norm_forward, layer_norm_backward=layer_norm_backward),
    "liger_kernel.ops.fused_add_rms_norm": dict(fused_add_rms_norm_forward=fused_add_rms_norm_forward,
                                                fused_add_rms_norm_backward=fused_add_rms_norm_backward,
                                                _str_to_casting_mode=CASTING),
    "liger_kernel.ops.utils": dict(calculate_settings=calculate_settings),
    "quack": {},
    "quack.rmsnorm": dict(rmsnorm_fwd=rmsnorm_fwd, rmsnorm_bwd=rmsnorm_bwd, layernorm_fwd=layernorm_fwd,
                          layernorm_bwd=layernorm_bwd, rmsnorm_fwd_tuned=rmsnorm_fwd_tuned),
    "flashinfer": {},
    "flashinfer.norm": dict(rmsnorm=rmsnorm, layernorm=layernorm, fused_add_rmsnorm=fused_add_rmsnorm,
                            gemma_fused_add_rmsnorm=gemma_fused_add_rmsnorm,
                            fused_add_rmsnorm_quant=fused_add_rmsnorm_quant, gemma_rmsnorm=gemma_rmsnorm,
                            rmsnorm_quant=rmsnorm_quant, layernorm_quant=layernorm_quant),
    "fused_layer_norm_cuda": dict(rms_forward=rms_forward, rms_forward_affine=rms_forward_affine, forward=forward,
                                  forward_affine=forward_affine, rms_backward=rms_backward,
                                  rms_backward_affine=rms_backward_affine, backward=backward,
                                  backward_affine=backward_affine),
}


def modules() -> dict[str, types.ModuleType]:
    """Fresh module objects by dotted name, with functions of their own (a call may set attributes
    on one: QuACK's tuned entry point is an Autotuner). ``quack.rmsnorm`` as an attribute is the
    function, as in QuACK (its module is reached through sys.modules)."""
    made = {}
    for name, attrs in MODULES.items():
        made[name] = types.ModuleType(name)
        for key, value in attrs.items():
            setattr(made[name], key, _own(value) if callable(value) else value)
    for name, mod in made.items():
        parent, _, leaf = name.rpartition(".")
        if parent:
            setattr(made[parent], leaf, mod)
    made["quack"].rmsnorm = _own(rmsnorm_fwd)
    return made


def _own(call):
    def again(*args, **kwargs):
        return call(*args, **kwargs)

    again.__name__ = call.__name__
    return again
