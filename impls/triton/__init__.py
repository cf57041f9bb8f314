"""The Triton backend: RMSNorm and LayerNorm, each as a rowwise and a looped kernel.

Without a CUDA device the kernels run under Triton's interpreter on CPU tensors. The
interpreter is chosen through TRITON_INTERPRET, which triton reads when a kernel is decorated;
it is set here only while triton is not yet imported, so a process that already uses triton
keeps its mode (and availability() then says why these kernels cannot run without a GPU).
triton itself is imported on first use, so this package imports, and its kernels register
(shown as skipped with the reason), where triton is missing.
"""
from __future__ import annotations

import os
import sys

from impls.base import DEFAULT_EPS
from impls.triton import _launch

if not _launch.cuda_present() and "triton" not in sys.modules:
    os.environ["TRITON_INTERPRET"] = "1"

# Importing the modules registers their kernels. The dispatch functions below then take over
# the package attributes rms_norm and layer_norm; the modules stay importable by full name
# (from impls.triton.rms_norm import ...).
from impls.triton import dispatch, layer_norm, rms_norm  # noqa: E402,F401
from impls.triton._launch import choose_variant  # noqa: E402

__all__ = ["availability", "note", "choose_variant", "rms_norm", "layer_norm"]


def availability() -> str | None:
    """None when the Triton kernels can run in this process, else why not."""
    return _launch.state().reason


def note() -> str:
    return _launch.note()


# The entry points' kernels, looked up once: the registry's lookup scans every kernel, and these
# calls are meant to cost one launch (impls.native). A warm call goes straight to the kernel's
# native table (``NormKernel.__call__`` does the same first thing), one Python frame fewer.
_ENTRY: dict = {}


def _kernel(op: str, batch_invariant: bool):
    k = _ENTRY[(op, batch_invariant)] = dispatch._variant(op, "invariant" if batch_invariant else "auto")
    return k


def rms_norm(x, weight=None, eps: float = DEFAULT_EPS["rms_norm"], out=None, batch_invariant: bool = False):
    """RMSNorm over the last dimension; returns NormOutputs(y, rstd=...). The variant and launch
    setting follow N, dtype and the row count M; ``batch_invariant=True`` makes the choice as for
    many rows at every M, so a row's bits never depend on how many rows share the call."""
    k = _ENTRY.get(("rms_norm", batch_invariant)) or _kernel("rms_norm", batch_invariant)
    if out is None:
        calls = k._calls
        table = calls and calls.native  # the kernel's call path (impls.callpath)
        if table is not None:
            got = table(x, weight, None, eps)  # None: not a recorded signature, or eps to judge
            if got is not None:
                return got
    return k(x, weight, None, eps, out)


def layer_norm(x, weight=None, bias=None, eps: float = DEFAULT_EPS["layer_norm"], out=None, batch_invariant: bool = False):
    """LayerNorm over the last dimension; returns NormOutputs(y, mean=..., rstd=...).
    ``batch_invariant`` as for rms_norm."""
    k = _ENTRY.get(("layer_norm", batch_invariant)) or _kernel("layer_norm", batch_invariant)
    if out is None:
        calls = k._calls
        table = calls and calls.native
        if table is not None:
            got = table(x, weight, bias, eps)
            if got is not None:
                return got
    return k(x, weight, bias, eps, out)
