"""Whether the Triton kernels can run in this process, and how: triton imported on first use
(``state``), compiled on a GPU or run under its interpreter on CPU tensors (``DEVICES``)."""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from functools import lru_cache

import torch

from impls.base import cuda_present


def interpret_requested() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


# Kernels run on CPU tensors under the interpreter, on CUDA tensors when compiled.
DEVICES: tuple[str, ...] = ("cuda",) if cuda_present() and not interpret_requested() else ("cpu",)


@dataclass(frozen=True)
class TritonState:
    triton: object | None  # the module, when importable
    kernels: object | None  # impls.triton._kernels, when it loaded
    interpreted: bool
    reason: str | None  # why the backend cannot run here, else None


@lru_cache(maxsize=1)
def state() -> TritonState:
    try:
        triton = importlib.import_module("triton")
    except Exception as exc:
        return TritonState(None, None, False, f"triton not importable: {type(exc).__name__}: {exc}")
    try:
        kernels = importlib.import_module("impls.triton._kernels")
    except Exception as exc:
        return TritonState(triton, None, False, f"triton kernels failed to load: {type(exc).__name__}: {exc}")
    # The mode is fixed when the kernels are decorated; read it from what the decorator returned.
    interpreted = type(kernels.rms_norm_rowwise).__name__ == "InterpretedFunction"
    reason = None
    if not interpreted and not cuda_present():
        reason = (
            "no CUDA device, and triton was imported before impls.triton without TRITON_INTERPRET=1, "
            "so the kernels cannot run; set TRITON_INTERPRET=1 before triton is first imported"
        )
    elif interpreted != ("cpu" in DEVICES):
        reason = "TRITON_INTERPRET changed between importing impls.triton and loading its kernels"
    return TritonState(triton, kernels, interpreted, reason)


def note() -> str:
    s = state()
    if s.triton is None:
        return s.reason or ""
    version = f"triton {getattr(s.triton, '__version__', '?')}"
    if s.interpreted:
        why = "TRITON_INTERPRET=1" if cuda_present() else "no GPU"
        return f"{version}, running under the interpreter ({why})"
    if cuda_present():
        return f"{version} on {torch.cuda.get_device_name()}"
    return version
