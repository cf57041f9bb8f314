"""The fused call's validation (impls.fused): everything about a call that does not depend on the
kernel, refused with NormInputError naming the problem before any backend code runs; and whether
x and residual overlap in memory (adjacent views of one buffer are fine, overlapping ones not).
The family's ops, fp8 dtypes and write conventions are defined here (impls.fused re-exports them)."""
from __future__ import annotations

import math

import torch

from impls.inputs import SUPPORTED_DTYPES, NormInputError, dtype_name, rows_view, validate_inputs

ADD_OPS: tuple[str, ...] = ("add_rms_norm", "add_layer_norm")
# The plain norm each op normalises with.
BASE_OP = {"add_rms_norm": "rms_norm", "add_layer_norm": "layer_norm", "rms_norm": "rms_norm",
           "layer_norm": "layer_norm"}
FUSED_OPS: tuple[str, ...] = ADD_OPS + ("rms_norm", "layer_norm")
FP8_DTYPES: tuple[torch.dtype, ...] = (torch.float8_e4m3fn, torch.float8_e5m2)
# new: fresh y and residual_out; in_place: y into x, residual_out into residual; out_y: y into the
# caller's buffer (``out.y``), residual_out into residual. x and residual not written are unchanged.
WRITES: tuple[str, ...] = ("new", "in_place", "out_y")


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors share an element of memory (exact for rows of one stride; otherwise
    by marking the elements of their common byte range)."""
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device:
        return False
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False

    def span(t):
        lo = t.data_ptr() + sum((s - 1) * st for s, st in zip(t.shape, t.stride()) if st < 0) * t.element_size()
        hi = t.data_ptr() + (sum((s - 1) * st for s, st in zip(t.shape, t.stride()) if st > 0) + 1) * t.element_size()
        return lo, hi

    (a0, a1), (b0, b1) = span(a), span(b)
    if a1 <= b0 or b1 <= a0:
        return False
    ra, rb = _rows(a), _rows(b)
    if ra is not None and rb is not None and a.element_size() == b.element_size():
        (pa, sa, na, ma), (pb, sb, nb, mb) = ra, rb
        size = a.element_size()
        stride = sa if ma > 1 else sb
        if (pb - pa) % size == 0 and (ma == 1 or mb == 1 or sa == sb):
            # Row i of a covers [i s, i s + na), row j of b [d + j s, d + j s + nb) (elements from
            # a's start): they meet for some k = i - j in [-(mb - 1), ma - 1] with
            # k s < d + nb and d < k s + na.
            d = (pb - pa) // size
            k_lo = max(math.floor((d - na) / stride) + 1, -(mb - 1))
            k_hi = min(math.ceil((d + nb) / stride) - 1, ma - 1)
            return k_lo <= k_hi
    # Different layouts: mark a's elements on a byte map of the common range, then look at b's.
    base = min(a0, b0)
    marks = torch.zeros(max(a1, b1) - base, dtype=torch.bool, device=a.device)
    offs = _byte_offsets(a) - base
    for k in range(a.element_size()):
        marks[offs + k] = True
    offs = _byte_offsets(b) - base
    return bool(any(marks[offs + k].any() for k in range(b.element_size())))


def _rows(t: torch.Tensor):
    """(data_ptr, row stride, N, M) where t's elements are M rows of N contiguous elements with
    one row stride, else None."""
    n = t.shape[-1]
    if t.stride(-1) != 1 and n > 1:
        return None
    try:
        r = rows_view(t, "t", allow_copy=False)
    except NormInputError:
        return None
    return t.data_ptr(), (r.stride(0) if r.shape[0] > 1 else n), n, r.shape[0]


def _byte_offsets(t: torch.Tensor) -> torch.Tensor:
    index = torch.zeros((), dtype=torch.int64, device=t.device)
    for size, stride in zip(t.shape, t.stride()):
        index = index.unsqueeze(-1) + torch.arange(size, device=t.device) * stride
    return t.data_ptr() + index.reshape(-1) * t.element_size()


def validate_fused(op: str, x, residual, weight, bias, eps, params) -> None:
    """Everything about a fused call that does not depend on the kernel; NormInputError names
    what is wrong."""
    if op not in FUSED_OPS:
        raise NormInputError(f"unknown fused op {op!r}; expected one of {FUSED_OPS}")
    validate_inputs(BASE_OP[op], x, weight, bias, eps)
    if op in ADD_OPS:
        if not isinstance(residual, torch.Tensor):
            raise NormInputError(f"{op} needs residual, a torch.Tensor of x's shape; got {type(residual).__name__}")
        if residual.shape != x.shape:
            raise NormInputError(f"residual has shape {tuple(residual.shape)}; expected x's {tuple(x.shape)}")
        if residual.device != x.device:
            raise NormInputError(f"residual is on {residual.device} but x is on {x.device}")
        if residual.dtype not in SUPPORTED_DTYPES:
            names = ", ".join(dtype_name(d) for d in SUPPORTED_DTYPES)
            raise NormInputError(f"residual has dtype {dtype_name(residual.dtype)}; expected one of {names}")
        if residual.stride(-1) != 1 and residual.numel() > 0 and x.shape[-1] > 1:
            raise NormInputError(f"residual's last dimension is not contiguous (stride {residual.stride(-1)})")
        if overlaps(x, residual):
            raise NormInputError("x and residual overlap in memory: they may be adjacent views of one buffer, "
                                 "never overlapping ones")
    elif residual is not None:
        raise NormInputError(f"{op} takes no residual; pass residual=None (or call add_{op})")
    offset = params.weight_offset
    if isinstance(offset, bool) or not isinstance(offset, (int, float)) or not math.isfinite(offset):
        raise NormInputError(f"weight_offset must be a finite number, got {offset!r}")
    if offset and BASE_OP[op] != "rms_norm":
        raise NormInputError(f"weight_offset is a parameter of the RMSNorm ops; {op} takes none")
    if offset and weight is None:
        raise NormInputError("weight_offset applies to a weight; pass one (the offset of Gemma's (1 + w))")
    if params.out_dtype is not None:
        if params.out_dtype not in FP8_DTYPES:
            names = ", ".join(dtype_name(d) for d in FP8_DTYPES)
            raise NormInputError(f"out_dtype {params.out_dtype} is not supported; expected None (x's dtype) or "
                                 f"one of {names}")
        s = params.scale
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or s <= 0:
            raise NormInputError(f"an fp8 output needs scale, a finite number > 0; got {s!r}")
        if op == "add_layer_norm":
            raise NormInputError("fp8 output is offered for rms_norm, add_rms_norm and layer_norm; not add_layer_norm")
        if params.write == "in_place":
            raise NormInputError("an fp8 y cannot be written into x's storage (write='in_place'); use 'out_y' or 'new'")
    elif params.scale is not None:
        raise NormInputError("scale is the fp8 output's; pass out_dtype too, or no scale")
    if params.write not in WRITES:
        raise NormInputError(f"write must be one of {WRITES}, got {params.write!r}")
    if op not in ADD_OPS and params.write != "new":
        raise NormInputError(f"write={params.write!r} is a convention of the add ops; {op} writes new outputs "
                             "(into out= where given)")


def check_out_tensor(label: str, t, shape, dtype, device, whole: bool = False) -> None:
    if not isinstance(t, torch.Tensor):
        raise NormInputError(f"{label} must be a tensor of shape {tuple(shape)}")
    if t.shape != shape or t.dtype != dtype or t.device != device:
        raise NormInputError(f"{label} must be {dtype_name(dtype)} {tuple(shape)} on {device}, "
                             f"got {dtype_name(t.dtype)} {tuple(t.shape)} on {t.device}")
    if whole and not t.is_contiguous():
        raise NormInputError(f"{label} must be contiguous")
    if not whole and t.dim() and t.stride(-1) != 1 and t.shape[-1] > 1:
        raise NormInputError(f"{label}'s last dimension must be contiguous")
