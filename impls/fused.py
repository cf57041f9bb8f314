"""The fused norms LLM stacks call: a residual add before the norm (``add_rms_norm``,
``add_layer_norm``), Gemma's ``(1 + w)`` weight (``weight_offset``) and an fp8 output with a
per-tensor scale, behind one interface like the plain norms' (impls.base).

A fused kernel is a kernel of the fused family (``FusedNormKernel``: impls.contract's declarations
and a call of its own): its op is one of
``FUSED_OPS`` (the add ops, and rms_norm or layer_norm with an offset or an fp8 output), its call
takes the residual and the call's parameters, and it declares what the harness's oracle and guards
must follow:

- ``writes``: the write conventions it supports (``WRITES``): new outputs; y into x's storage and
  ``residual_out`` into residual's (in place); or y into a given buffer and ``residual_out`` into
  residual's.
- ``stats_on``: whether its statistics (and the normalised row) are taken on the float32 sum
  x + residual or on that sum rounded to ``residual_out``'s dtype.
- ``residual_out_dtype``: the dtype of residual_out for given x and residual dtypes.
- ``weight_offsets``, ``out_dtypes``: the offsets (0, or 1 for Gemma) and fp8 outputs it takes.
- ``scale_convention``: "divide" (y / scale: the scale an fp8 tensor is dequantised with) or
  "multiply" (y * scale); ``fp8_nan``: what a NaN becomes in its fp8 output.

The call validates everything (``validate_fused``) and refuses bad input with NormInputError
before any backend code runs, as the plain norms' does; a kernel writes ``_forward`` on 2-D rows.
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import ClassVar

import torch

from impls.base import DEFAULT_EPS
from impls.contract import KernelContract, UnsupportedCase
from impls.fused_validation import check_out_tensor as _check_out
# The family's ops, fp8 dtypes and write conventions are defined with the validation that holds
# calls to them; they are part of this interface.
from impls.fused_validation import ADD_OPS, BASE_OP, FP8_DTYPES, FUSED_OPS, WRITES  # noqa: F401
from impls.fused_validation import overlaps, validate_fused  # noqa: F401  (part of this interface)
from impls.inputs import NormInputError, NormSpec, dtype_name, rows_view

STATS_ON = ("float32_sum", "rounded_sum")
SCALE_CONVENTIONS = ("divide", "multiply")
FP8_NAN = ("nan", "max", "-max")

for _op, _base in BASE_OP.items():
    DEFAULT_EPS.setdefault(_op, DEFAULT_EPS[_base])


@dataclass(frozen=True)
class FusedOutputs:
    """y (x's shape; x's dtype or the fp8 dtype asked for); residual_out = x + residual (the add
    ops); mean and rstd float32 with the leading shape, where the kernel writes them."""

    y: torch.Tensor
    residual_out: torch.Tensor | None = None
    mean: torch.Tensor | None = None
    rstd: torch.Tensor | None = None

    def fields(self) -> dict[str, torch.Tensor]:
        named = (("y", self.y), ("residual_out", self.residual_out), ("mean", self.mean), ("rstd", self.rstd))
        return {k: v for k, v in named if v is not None}


@dataclass
class FusedGrads:
    """The backward's gradients: dx (x's dtype), dresidual (residual's dtype, the add ops), dw and
    db (the parameters' dtype)."""

    dx: torch.Tensor
    dresidual: torch.Tensor | None = None
    dw: torch.Tensor | None = None
    db: torch.Tensor | None = None

    def fields(self) -> dict[str, torch.Tensor]:
        named = (("dx", self.dx), ("dresidual", self.dresidual), ("dw", self.dw), ("db", self.db))
        return {k: v for k, v in named if v is not None}


@dataclass(frozen=True)
class FusedParams:
    """A call's parameters beyond the plain norm's: the weight's offset, the output's dtype (None:
    x's), the fp8 scale in the kernel's own convention, and the write convention."""

    weight_offset: float = 0.0
    out_dtype: torch.dtype | None = None
    scale: float | None = None
    write: str = "new"


@dataclass(frozen=True)
class FusedSpec(NormSpec):
    """A fused problem, without the tensors: the plain spec and the call's choices."""

    residual_dtype: torch.dtype | None = None
    weight_offset: float = 0.0
    out_dtype: torch.dtype | None = None
    write: str = "new"


def fp8_max(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).max)


def float32(v: float) -> float:
    """v rounded to float32 (to nearest), infinite beyond its range."""
    try:
        return struct.unpack("f", struct.pack("f", v))[0]
    except OverflowError:
        return math.copysign(math.inf, v)


def float32_reciprocal(scale: float) -> float:
    """1 / scale in float32, correctly rounded: the float64 quotient of 1 and the float32 scale,
    rounded to float32 (rounding twice is harmless for a quotient where the first precision, 53
    bits, is at least 2 x 24 + 2). What a kernel that multiplies an fp8 y by the reciprocal of its
    scale is given: a Python float, not a tensor (a tensor division costs a call microseconds)."""
    s = float32(float(scale))
    return math.inf if s == 0.0 else float32(1.0 / s)


def spec_of_fused(op: str, x2: torch.Tensor, device: str, weight, bias, residual_dtype, params: FusedParams) -> FusedSpec:
    return FusedSpec(op=op, dtype=x2.dtype, rows=x2.shape[0], n=x2.shape[1], row_stride=x2.stride(0), device=device,
                     has_weight=weight is not None, has_bias=bias is not None, residual_dtype=residual_dtype,
                     weight_offset=float(params.weight_offset), out_dtype=params.out_dtype, write=params.write)


class FusedNormKernel(KernelContract):
    """Base class of the fused family. Subclasses set the declarations and write ``_forward``
    (and ``_backward`` where they have one)."""

    family: ClassVar[str] = "fused"
    outputs: ClassVar[tuple[str, ...]] = ("y", "residual_out")
    writes: ClassVar[tuple[str, ...]] = ("new",)
    stats_on: ClassVar[str] = "float32_sum"
    weight_offsets: ClassVar[tuple[float, ...]] = (0.0,)
    # Output dtypes besides x's (None): fp8 formats.
    out_dtypes: ClassVar[tuple[torch.dtype | None, ...]] = (None,)
    scale_convention: ClassVar[str] = "divide"
    fp8_nan: ClassVar[str] = "nan"
    # Residual dtypes accepted: "same" (x's) and/or dtype names ("float32").
    residual_dtypes: ClassVar[tuple[str, ...]] = ("same",)
    # Where each declaration comes from (a peer's source file and line), for the report.
    source: ClassVar[str] = ""

    def residual_out_dtype(self, x_dtype: torch.dtype, residual_dtype: torch.dtype) -> torch.dtype:
        """residual_out's dtype: by default the residual's (the stream keeps its precision)."""
        return residual_dtype

    def declaration(self) -> dict:
        """What the harness follows for this kernel, as the report shows it."""
        return {"writes": list(self.writes), "stats_on": self.stats_on,
                "weight_offsets": list(self.weight_offsets),
                "out_dtypes": [dtype_name(d) if d is not None else "x's" for d in self.out_dtypes],
                "scale_convention": self.scale_convention, "fp8_nan": self.fp8_nan,
                "residual_dtypes": list(self.residual_dtypes), "source": self.source}

    def unsupported(self, spec: NormSpec) -> str | None:
        reason = super().unsupported(spec)
        if reason or not isinstance(spec, FusedSpec):
            return reason
        return self.declared_limits(spec)

    def declared_limits(self, spec: FusedSpec) -> str | None:
        """Why the fused declarations (writes, offsets, output and residual dtypes) rule ``spec``
        out, or None: what the kernel says it cannot do, wherever it runs."""
        if spec.dtype not in self.dtypes:
            return f"{self.name} does not support dtype {dtype_name(spec.dtype)}"
        if spec.write not in self.writes:
            return f"{self.name} does not write {spec.write!r} (writes {', '.join(self.writes)})"
        if spec.weight_offset not in self.weight_offsets:
            return f"{self.name} takes no weight offset {spec.weight_offset:g} (takes {', '.join(f'{o:g}' for o in self.weight_offsets)})"
        if spec.out_dtype not in self.out_dtypes:
            names = ", ".join("x's dtype" if d is None else dtype_name(d) for d in self.out_dtypes)
            got = "x's dtype" if spec.out_dtype is None else dtype_name(spec.out_dtype)
            return f"{self.name} does not output {got} (outputs {names})"
        if spec.op in ADD_OPS and spec.residual_dtype is not None:
            same = spec.residual_dtype == spec.dtype
            if not (same and "same" in self.residual_dtypes) and dtype_name(spec.residual_dtype) not in self.residual_dtypes:
                return (f"{self.name} takes no {dtype_name(spec.residual_dtype)} residual with {dtype_name(spec.dtype)} x "
                        f"(takes {', '.join(self.residual_dtypes)})")
            out_dtype = self.residual_out_dtype(spec.dtype, spec.residual_dtype)
            if spec.write != "new" and out_dtype != spec.residual_dtype:
                return (f"{self.name} writes residual_out in {dtype_name(out_dtype)}, which cannot go into the "
                        f"{dtype_name(spec.residual_dtype)} residual's storage (write={spec.write!r})")
        return None

    # -- the call -----------------------------------------------------------------------------
    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None, weight=None, bias=None,
                 eps: float | None = None, *, weight_offset: float = 0.0, out_dtype: torch.dtype | None = None,
                 scale: float | None = None, write: str = "new", out: FusedOutputs | None = None) -> FusedOutputs:
        params = FusedParams(weight_offset, out_dtype, scale, write)
        return self.validated_call(x, residual, weight, bias, eps, params, out)

    def validated_call(self, x, residual=None, weight=None, bias=None, eps=None, params: FusedParams = FusedParams(),
                       out: FusedOutputs | None = None) -> FusedOutputs:
        eps = DEFAULT_EPS[self.op] if eps is None else eps
        validate_fused(self.op, x, residual, weight, bias, eps, params)
        writes_inputs = params.write != "new"
        x2 = rows_view(x, "x", allow_copy=params.write != "in_place")
        r2 = None if residual is None else rows_view(residual, "residual", allow_copy=not writes_inputs)
        spec = spec_of_fused(self.op, x2, x.device.type, weight, bias, None if residual is None else residual.dtype, params)
        reason = self.unsupported(spec)
        if reason:
            raise UnsupportedCase(reason)
        out = self._outputs(x, residual, params, out)
        if x2.shape[0] == 0:
            return out
        out2 = FusedOutputs(
            y=x2 if params.write == "in_place" else rows_view(out.y, "out.y", allow_copy=False),
            residual_out=r2 if writes_inputs else (None if out.residual_out is None else
                                                   rows_view(out.residual_out, "out.residual_out", allow_copy=False)),
            mean=None if out.mean is None else out.mean.view(-1),
            rstd=None if out.rstd is None else out.rstd.view(-1),
        )
        self._forward(x2, r2, weight, bias, float(eps), params, out2)
        return out

    def _outputs(self, x, residual, params: FusedParams, out: FusedOutputs | None) -> FusedOutputs:
        """The call's outputs: the caller's (checked) or fresh ones, with x's or residual's
        storage where the write convention puts y or residual_out there."""
        lead = x.shape[:-1]
        y_dtype = params.out_dtype or x.dtype
        r_dtype = None if residual is None else self.residual_out_dtype(x.dtype, residual.dtype)
        stat = lambda: torch.empty(lead, dtype=torch.float32, device=x.device)  # noqa: E731
        if out is None:
            y = x if params.write == "in_place" else torch.empty(x.shape, dtype=y_dtype, device=x.device)
            r_out = None
            if residual is not None:
                r_out = residual if params.write != "new" else torch.empty(x.shape, dtype=r_dtype, device=x.device)
            return FusedOutputs(y=y, residual_out=r_out, mean=stat() if "mean" in self.outputs else None,
                                rstd=stat() if "rstd" in self.outputs else None)
        if params.write != "in_place":
            _check_out("out.y", out.y, x.shape, y_dtype, x.device)
        if residual is not None and params.write == "new":
            _check_out("out.residual_out", out.residual_out, x.shape, r_dtype, x.device)
        for name in ("mean", "rstd"):
            t = getattr(out, name)
            if name in self.outputs and t is None:
                raise NormInputError(f"{self.name} writes {name}; out.{name} must be given")
            if t is not None:
                _check_out(f"out.{name}", t, lead, torch.float32, x.device, whole=True)
        return FusedOutputs(y=x if params.write == "in_place" else out.y,
                            residual_out=(residual if params.write != "new" else out.residual_out),
                            mean=out.mean, rstd=out.rstd)

    def _forward(self, x, residual, weight, bias, eps: float, params: FusedParams, out: FusedOutputs) -> None:
        """Write y, residual_out and the statistics for 2-D rows. Under write='in_place', out.y is
        x and out.residual_out is residual (each read before it is written); under 'out_y',
        out.residual_out is residual."""
        raise NotImplementedError

    # -- the backward -------------------------------------------------------------------------
    @property
    def has_backward(self) -> bool:
        return type(self)._backward is not FusedNormKernel._backward

    def backward_unsupported(self, spec: NormSpec) -> str | None:
        if isinstance(spec, FusedSpec) and spec.out_dtype is not None:
            return f"{self.name}: no backward through an fp8 output"
        return super().backward_unsupported(spec)

    def backward(self, x: torch.Tensor, residual, weight, bias, dy: torch.Tensor, saved: FusedOutputs,
                 eps: float | None = None, *, d_residual_out: torch.Tensor | None = None,
                 weight_offset: float = 0.0, out: FusedGrads | None = None) -> FusedGrads:
        """dx, dresidual, dw and db for the forward call that gave ``saved`` (its residual_out and
        statistics): dy is y's gradient, d_residual_out residual_out's (None: zero)."""
        if not self.has_backward:
            raise UnsupportedCase(f"{self.name} has no backward")
        eps = DEFAULT_EPS[self.op] if eps is None else eps
        # The backward writes only its gradients: any convention the kernel declares describes it.
        write = "new" if "new" in self.writes or self.op not in ADD_OPS else self.writes[0]
        params = FusedParams(weight_offset=weight_offset, write=write)
        validate_fused(self.op, x, residual, weight, bias, eps, params)
        for label, g, like in (("dy", dy, x), ("d_residual_out", d_residual_out, saved.residual_out)):
            if g is None:
                continue
            if like is None or g.shape != like.shape or g.dtype != like.dtype or g.device != like.device:
                want = "x" if label == "dy" else "residual_out"
                raise NormInputError(f"{label} must match {want}: got {tuple(g.shape)} {dtype_name(g.dtype)} on {g.device}")
        if self.op in ADD_OPS and saved.residual_out is None:
            raise NormInputError(f"{self.name}'s backward needs the forward's residual_out")
        for name in self.outputs:
            if name in ("mean", "rstd") and getattr(saved, name) is None:
                raise NormInputError(f"{self.name}'s backward needs the forward's saved {name}")
        x2 = rows_view(x, "x", allow_copy=True)
        spec = spec_of_fused(self.op, x2, x.device.type, weight, bias, None if residual is None else residual.dtype, params)
        reason = self.backward_unsupported(spec)
        if reason:
            raise UnsupportedCase(reason)
        if out is None:
            out = FusedGrads(dx=torch.empty_like(x), dresidual=None if residual is None else torch.empty_like(residual),
                             dw=None if weight is None else torch.empty_like(weight),
                             db=None if bias is None else torch.empty_like(bias))
        if not x2.shape[0]:
            for t in (out.dw, out.db):
                if t is not None:
                    t.zero_()
            return out
        src = saved.residual_out if self.op in ADD_OPS else x
        rows = lambda t, label, copy=True: None if t is None else rows_view(t, label, allow_copy=copy)  # noqa: E731
        grads = FusedGrads(dx=rows(out.dx, "out.dx", False), dresidual=rows(out.dresidual, "out.dresidual", False),
                           dw=out.dw, db=out.db)
        stats = FusedOutputs(y=rows(src, "residual_out"), mean=None if saved.mean is None else saved.mean.reshape(-1),
                             rstd=None if saved.rstd is None else saved.rstd.reshape(-1))
        self._backward(stats.y, weight, bias, rows(dy, "dy"), rows(d_residual_out, "d_residual_out"), stats,
                       float(eps), float(weight_offset), grads)
        return out

    def _backward(self, src, weight, bias, dy, d_residual_out, saved: FusedOutputs, eps: float,
                  weight_offset: float, out: FusedGrads) -> None:
        """Write dx (and dresidual, dw, db where given) for 2-D rows: ``src`` is what was
        normalised (x, or the forward's residual_out), ``saved`` holds its mean and rstd."""
        raise NotImplementedError



def is_fused(kernel) -> bool:
    return isinstance(kernel, FusedNormKernel)
