"""Which of the project's kernels the public ops run, looked up once per (op, name).

Without a GPU, importing normdiff makes the project's Triton kernels run under Triton's
interpreter whatever the caller imported first (``impls.triton.use_interpreter``): a script's
``import torch`` / ``import triton`` before ``import normdiff`` does not send ``kernel="auto"``
to eager PyTorch. Where Triton cannot run here, "auto" runs eager PyTorch and warns once,
naming the kernel that ran and why the other did not.
"""
from __future__ import annotations

import contextlib
import functools
import warnings

import torch

import impls.triton
from impls import registry

# "auto": the Triton kernel users call with batch_invariant=True where Triton runs here (on the
# GPU compiled, on the CPU under its interpreter), else eager PyTorch; for the fused ops
# (normdiff.add_rms_norm, add_layer_norm) the project's fused Triton kernel, else eager PyTorch's
# fused composition.
AUTO_ORDER = ("triton.invariant", "torch.eager")
FUSED_AUTO_ORDER = ("triton.fused", "torch.fused")
FUSED_OPS = ("add_rms_norm", "add_layer_norm")

# Why Triton's interpreter could not be turned on in this process (None: it was, or a GPU runs
# the kernels compiled).
INTERPRETER_REFUSED = impls.triton.use_interpreter()


class KernelFallbackWarning(UserWarning):
    """kernel="auto" runs another kernel than the one the documentation names first."""


@functools.cache
def kernel_for(op: str, name: str):
    """The registered kernel ``name`` ("backend.variant", or "auto") of ``op`` that can run here,
    with a backward; raises RuntimeError saying why not. "auto" that cannot run its first choice
    warns (once per op) with the kernel that runs instead and why."""
    registry.load_builtins()
    fused = op in FUSED_OPS
    names = (FUSED_AUTO_ORDER if fused else AUTO_ORDER) if name == "auto" else (name,)
    reasons = []
    for full in names:
        backend, _, variant = full.partition(".")
        try:
            k = registry.get(op, backend, variant or None)
        except Exception as exc:  # noqa: BLE001 (unknown name: say so with the others)
            reasons.append(f"{full}: {exc}")
            continue
        why = _family_mismatch(k, fused) or k.unavailable() or (None if k.has_backward else "no backward")
        if why is None:
            if reasons:
                warnings.warn(f"normdiff.{op}(kernel={name!r}) runs {k.name} here, not {names[0]}: "
                              + "; ".join(reasons), KernelFallbackWarning, stacklevel=2)
            return k
        reasons.append(f"{full}: {why}")
    raise RuntimeError(f"no {op} kernel for {name!r} runs here: " + "; ".join(reasons))


@contextlib.contextmanager
def autograd_inside_op():
    """Autograd's dispatch keys back on inside a custom op's impl (which runs with them
    excluded): the eager-PyTorch kernels' backward is torch.autograd of their forward."""
    excluded = torch._C._dispatch_tls_local_exclude_set().remove(torch._C.DispatchKey.AutogradFunctionality)
    with torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), excluded):
        yield


def _family_mismatch(k, fused: bool) -> str | None:
    """Why ``k`` is not what the op calls: the plain ops call plain kernels (x, weight, bias), the
    fused ops fused ones (x, residual, ...)."""
    if (getattr(k, "family", "plain") == "fused") == fused:
        return None
    if fused:
        return "a plain norm kernel, not a fused one"
    return "a fused-family kernel (weight offset, fp8 output), not a plain one"


def kernel_name(op: str = "rms_norm", kernel: str = "auto") -> str:
    """The "backend.variant" that ``normdiff.<op>(..., kernel=kernel)`` runs in this process
    (e.g. "triton.invariant"); raises RuntimeError where none can run, as the call would."""
    return kernel_for(op, kernel).name
