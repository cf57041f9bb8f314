"""Which of the project's kernels the public ops run, looked up once per (op, name).

Without a GPU, importing normdiff makes the project's Triton kernels run under Triton's
interpreter whatever the caller imported first (``impls.triton.use_interpreter``): a script's
``import torch`` / ``import triton`` before ``import normdiff`` does not send ``kernel="auto"``
to eager PyTorch. Where Triton cannot run here, "auto" runs eager PyTorch and warns once,
naming the kernel that ran and why the other did not.
"""
from __future__ import annotations

import functools
import warnings

import impls.triton
from impls import registry

# "auto": the Triton kernel users call with batch_invariant=True where Triton runs here (on the
# GPU compiled, on the CPU under its interpreter), else eager PyTorch.
AUTO_ORDER = ("triton.invariant", "torch.eager")

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
    names = AUTO_ORDER if name == "auto" else (name,)
    reasons = []
    for full in names:
        backend, _, variant = full.partition(".")
        try:
            k = registry.get(op, backend, variant or None)
        except Exception as exc:  # noqa: BLE001 (unknown name: say so with the others)
            reasons.append(f"{full}: {exc}")
            continue
        why = k.unavailable() or (None if k.has_backward else "no backward")
        if why is None:
            if reasons:
                warnings.warn(f"normdiff.{op}(kernel={name!r}) runs {k.name} here, not {names[0]}: "
                              + "; ".join(reasons), KernelFallbackWarning, stacklevel=2)
            return k
        reasons.append(f"{full}: {why}")
    raise RuntimeError(f"no {op} kernel for {name!r} runs here: " + "; ".join(reasons))


def kernel_name(op: str = "rms_norm", kernel: str = "auto") -> str:
    """The "backend.variant" that ``normdiff.<op>(..., kernel=kernel)`` runs in this process
    (e.g. "triton.invariant"); raises RuntimeError where none can run, as the call would."""
    return kernel_for(op, kernel).name
