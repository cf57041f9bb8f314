"""A call's types and its validation: what every kernel's call is checked against before any
backend code runs (impls.base's NormKernel.validated_call), and the rows view a kernel is given.

Bad input is refused here with an error that names the problem (dtype, shape, device, eps)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

OPS: tuple[str, ...] = ("rms_norm", "layer_norm")
SUPPORTED_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16)


class NormInputError(ValueError):
    """Input the interface refuses: wrong dtype, shape, device or eps."""


@dataclass(frozen=True)
class NormOutputs:
    """y has the input's shape and dtype; mean and rstd are float32 with the leading shape."""

    y: torch.Tensor
    mean: torch.Tensor | None = None
    rstd: torch.Tensor | None = None

    def fields(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in (("y", self.y), ("mean", self.mean), ("rstd", self.rstd)) if v is not None}


@dataclass
class NormGrads:
    """What a backward pass writes: dx (x's shape and dtype) always; dw and db (N, in the
    parameter's dtype) where the forward had weight and bias."""

    dx: torch.Tensor
    dw: torch.Tensor | None = None
    db: torch.Tensor | None = None

    def fields(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in (("dx", self.dx), ("dw", self.dw), ("db", self.db)) if v is not None}


@dataclass(frozen=True)
class NormSpec:
    """What a kernel needs to know to say whether it can run a problem, without the tensors."""

    op: str
    dtype: torch.dtype
    rows: int  # M, all leading dimensions collapsed
    n: int  # N, the normalised (last) dimension
    row_stride: int  # elements between the starts of consecutive rows of x
    device: str  # "cpu", "cuda", ...
    has_weight: bool
    has_bias: bool


@dataclass(frozen=True)
class ReproCall:
    """How a kernel is called outside the harness, for a standalone repro (harness.repro): the
    lines that import its library, and the bodies of the kernel's ``_forward`` and ``_backward``
    (with their arguments' names) written on that library's public API. ``source``: code of the
    plug-in the call needs (a ``@triton.jit`` kernel), copied into the repro. ``requires``: what to
    install for ``imports`` (a pip line), which the repro prints, exiting 2, where they fail;
    ``note``: why the call is what it is (a kernel called through normdiff says why)."""

    imports: str
    forward: str
    backward: str | None = None
    source: str = ""
    requires: str = ""
    note: str = ""


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# -- validation ---------------------------------------------------------------------------------
def validate_inputs(op: str, x, weight, bias, eps) -> None:
    if op not in OPS:
        raise NormInputError(f"unknown op {op!r}; expected one of {OPS}")
    if not isinstance(x, torch.Tensor):
        raise NormInputError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in SUPPORTED_DTYPES:
        names = ", ".join(dtype_name(d) for d in SUPPORTED_DTYPES)
        raise NormInputError(f"x has dtype {dtype_name(x.dtype)}, which is not supported; expected one of {names}")
    if x.dim() < 1:
        raise NormInputError("x must have at least one dimension (the normalised one)")
    n = x.shape[-1]
    if n == 0:
        raise NormInputError("x's last (normalised) dimension has size 0; N must be at least 1")
    if x.stride(-1) != 1 and x.numel() > 0 and n > 1:
        raise NormInputError(
            f"x's last dimension is not contiguous (stride {x.stride(-1)}); call .contiguous() first"
        )
    for label, t in (("weight", weight), ("bias", bias)):
        if t is None:
            continue
        if op == "rms_norm" and label == "bias":
            raise NormInputError("rms_norm takes no bias; pass bias=None")
        if not isinstance(t, torch.Tensor):
            raise NormInputError(f"{label} must be a torch.Tensor or None, got {type(t).__name__}")
        if t.shape != (n,):
            raise NormInputError(f"{label} has shape {tuple(t.shape)}; expected ({n},) to match x's last dimension")
        if t.device != x.device:
            raise NormInputError(f"{label} is on {t.device} but x is on {x.device}")
        if t.dtype != x.dtype:
            raise NormInputError(f"{label} has dtype {dtype_name(t.dtype)} but x has {dtype_name(x.dtype)}")
        if t.stride(0) != 1 and n > 1:
            raise NormInputError(f"{label} is not contiguous (stride {t.stride(0)})")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise NormInputError(f"eps must be a number, got {type(eps).__name__}")
    if not math.isfinite(eps) or eps < 0:
        raise NormInputError(f"eps must be finite and >= 0, got {eps}")


def rows_view(t: torch.Tensor, label: str, allow_copy: bool) -> torch.Tensor:
    """View t (..., N) as 2-D rows (M, N) with one row stride. Copies x only when it must."""
    n = t.shape[-1]
    m = t.numel() // n if n else 0
    if t.dim() == 1:
        return t.view(1, n)
    if m <= 1:
        return t.reshape(m, n) if m == 0 else t.as_strided((1, n), (max(n, t.stride(-2)), 1))
    # Leading dimensions collapse into one row stride when each is packed on the next.
    sizes, strides = t.shape[:-1], t.stride()[:-1]
    ok = all(strides[i] == strides[i + 1] * sizes[i + 1] or sizes[i] == 1 for i in range(len(sizes) - 1))
    if ok and strides[-1] >= n:
        return t.as_strided((m, n), (strides[-1], 1))
    if allow_copy:
        return t.reshape(m, n).contiguous()
    raise NormInputError(f"{label}'s leading dimensions cannot be viewed as rows with one stride")


def spec_of(op: str, x2: torch.Tensor, device: str, weight, bias) -> NormSpec:
    return NormSpec(
        op=op,
        dtype=x2.dtype,
        rows=x2.shape[0],
        n=x2.shape[1],
        row_stride=x2.stride(0),
        device=device,
        has_weight=weight is not None,
        has_bias=bias is not None,
    )


def check_out(kernel, out: NormOutputs, x: torch.Tensor) -> None:
    """Outputs a caller gives (``out=``) must be what ``kernel`` writes, in x's shape and dtype."""
    if out.y.shape != x.shape or out.y.dtype != x.dtype or out.y.device != x.device:
        raise NormInputError(
            f"out.y must be {dtype_name(x.dtype)} {tuple(x.shape)} on {x.device}, "
            f"got {dtype_name(out.y.dtype)} {tuple(out.y.shape)} on {out.y.device}"
        )
    if out.y.stride(-1) != 1 and x.shape[-1] > 1:
        raise NormInputError("out.y's last dimension must be contiguous")
    for name in ("mean", "rstd"):
        t = getattr(out, name)
        if name in kernel.outputs and t is None:
            raise NormInputError(f"{kernel.name} writes {name}; out.{name} must be given")
        if t is None:
            continue
        if t.shape != x.shape[:-1] or t.dtype != torch.float32 or not t.is_contiguous():
            raise NormInputError(
                f"out.{name} must be a contiguous float32 tensor of shape {tuple(x.shape[:-1])}, "
                f"got {dtype_name(t.dtype)} {tuple(t.shape)}"
            )
