"""The Triton entry points users call (``rms_norm`` and ``layer_norm``, the package's
``impls.triton.rms_norm`` / ``layer_norm``), and the same dispatch as kernels of their own, so the
harness checks and times what users call:

- ``triton.auto``: the variant by op, N and dtype (settings.DISPATCH), rowwise with its decode
  setting for few rows. Batch-variant: a row's bits can change when M crosses DECODE_MAX_ROWS.
- ``triton.invariant`` (``batch_invariant=True``): the same choice made as for many rows whatever
  M is, so one plan serves every M and a row's bits never depend on the rest of the batch.
"""
from __future__ import annotations

import functools

from impls import registry
from impls.base import DEFAULT_EPS, NormOutputs
from impls.registry import register
from impls.triton._launch import TritonKernel, choose_variant
from impls.triton.settings import DECODE_MAX_ROWS, LaunchConfig


class _Dispatch(TritonKernel):
    invariant: bool = False
    entry_point = True

    def user_call(self, x, weight, bias, eps):
        # As a user writes it: the flag passed only where it is set.
        if self.op == "rms_norm":
            if self.invariant:
                return ("impls.triton.rms_norm(x, weight, eps, batch_invariant=True)",
                        lambda: rms_norm(x, weight, eps, batch_invariant=True))
            return "impls.triton.rms_norm(x, weight, eps)", lambda: rms_norm(x, weight, eps)
        if self.invariant:
            return ("impls.triton.layer_norm(x, weight, bias, eps, batch_invariant=True)",
                    lambda: layer_norm(x, weight, bias, eps, batch_invariant=True))
        return "impls.triton.layer_norm(x, weight, bias, eps)", lambda: layer_norm(x, weight, bias, eps)

    def target(self, n: int, dtype, m: int | None) -> tuple[TritonKernel, LaunchConfig | None]:
        """The registered variant a call on M rows of N runs, and the launch setting it is given
        (None: the variant's own for M)."""
        kernel = _variant(self.op, choose_variant(self.op, n, dtype, None if self.invariant else m))
        return kernel, (kernel.config(n, dtype, None) if self.invariant else None)  # invariant: as for many rows

    def unsupported(self, spec) -> str | None:
        return self.target(spec.n, spec.dtype, spec.rows)[0].unsupported(spec)

    def compile_key(self, spec, cfg=None):
        kernel, own = self.target(spec.n, spec.dtype, spec.rows)
        return kernel.compile_key(spec, cfg or own)

    def fast_plan(self, x, x2, weight, bias, spec, cfg=None):
        kernel, own = self.target(spec.n, spec.dtype, spec.rows)
        return kernel.fast_plan(x, x2, weight, bias, spec, cfg or own)

    def m_thresholds(self, spec) -> tuple[int, ...]:
        return () if self.invariant else (DECODE_MAX_ROWS,)

    def _forward(self, x, weight, bias, eps, out: NormOutputs, cfg=None) -> None:
        m, n = x.shape
        kernel, own = self.target(n, x.dtype, m)
        kernel._forward(x, weight, bias, eps, out, cfg or own)


@functools.cache
def _variant(op: str, variant: str) -> TritonKernel:
    """A registered Triton variant (looked up once: calls go through here)."""
    return registry.get(op, "triton", variant)


class _Auto(_Dispatch):
    variant = "auto"
    batch_invariant = False
    pdl = True  # at few rows it runs rowwise, which launches with PDL there
    pdl_max_rows = DECODE_MAX_ROWS


class _Invariant(_Dispatch):
    variant = "invariant"
    invariant = True
    batch_invariant = True


@register
class TritonRMSNormAuto(_Auto):
    op, outputs = "rms_norm", ("y", "rstd")


@register
class TritonRMSNormInvariant(_Invariant):
    op, outputs = "rms_norm", ("y", "rstd")


@register
class TritonLayerNormAuto(_Auto):
    op, outputs = "layer_norm", ("y", "mean", "rstd")


@register
class TritonLayerNormInvariant(_Invariant):
    op, outputs = "layer_norm", ("y", "mean", "rstd")


# The entry points' kernels, looked up once: the registry's lookup scans every kernel, and these
# calls are meant to cost one launch (impls.native). A warm call goes straight to the kernel's
# native table (``NormKernel.__call__`` does the same first thing), one Python frame fewer.
_ENTRY: dict = {}


def _kernel(op: str, batch_invariant: bool):
    k = _ENTRY[(op, batch_invariant)] = _variant(op, "invariant" if batch_invariant else "auto")
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
