"""A case's inputs, drawn bit for bit from its id: x (``make_x``: the case's distribution), the
weight and bias (``make_inputs``) and a backward case's dy (``make_dy``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from harness.judging.cases import Case


@dataclass
class Inputs:
    x: torch.Tensor
    weight: torch.Tensor | None
    bias: torch.Tensor | None
    eps: float
    storage: torch.Tensor  # x with the padding between its rows

    def tensors(self) -> dict[str, torch.Tensor]:
        named = {"x": self.storage, "weight": self.weight, "bias": self.bias}
        return {k: v for k, v in named.items() if v is not None}


def make_inputs(case: Case, device: str | torch.device = "cpu") -> Inputs:
    """Deterministic inputs for a case, drawn on ``device`` from a seed derived from the case id
    (the same bits on every run on the same kind of device)."""
    gen = torch.Generator(device=device).manual_seed(case.seed)
    dtype = case.torch_dtype
    lead, n = case.shape[:-1], case.n
    storage = make_x(case.dist, (*lead, n + case.row_pad), dtype, gen)
    x = storage[..., :n]
    weight = bias = None
    if case.has_weight:  # weights away from one, some negative: an ignored weight shows
        weight = (1.0 + 0.5 * torch.randn(n, generator=gen, device=gen.device)).to(dtype)
    if case.has_bias:
        bias = (0.5 * torch.randn(n, generator=gen, device=gen.device)).to(dtype)
    return Inputs(x=x, weight=weight, bias=bias, eps=case.eps_value, storage=storage)


def make_dy(case: Case, device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """The gradient of y for a backward case: (dy, its storage), dy with x's shape, dtype and row
    stride (strided rows in both), from the case's dy_seed.

    - "normal": standard normal;
    - "outliers": one row (the middle one) 100 times larger, and every 97th element 10 times:
      a row dw and db must not drop, and row sums a large element must not swamp (float16's
      range holds them, and dw over them);
    - "zeros": about half the elements exactly zero, and the first row and column all zero
      (dw and db of that column are exactly zero)."""
    gen = torch.Generator(device=device).manual_seed(case.dy_seed)
    lead, n = case.shape[:-1], case.n
    dy = torch.randn((*lead, n + case.row_pad), generator=gen, dtype=torch.float64, device=gen.device)
    flat = dy.view(-1, n + case.row_pad)
    if case.dy_dist == "outliers":
        flat.view(-1)[::97] *= 10
        flat[flat.shape[0] // 2] *= 100
    elif case.dy_dist == "zeros":
        flat.mul_(torch.rand(flat.shape, generator=gen, dtype=torch.float64, device=gen.device) < 0.5)
        flat[0] = 0
        flat[:, 0] = 0
    elif case.dy_dist != "normal":
        raise ValueError(f"unknown dy distribution {case.dy_dist!r}")
    storage = dy.to(case.torch_dtype)
    return storage[..., :n], storage


# A "normal" x larger than this is drawn in row chunks (its float64 draw would take GBs); every
# catalogue case but the HUGE_CASES is within it, so their bits do not depend on the chunking.
DRAW_CHUNK_ELEMENTS = 2**27


def make_x(dist: str, shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    finfo = torch.finfo(dtype)
    dev = gen.device
    if dist == "normal" and math.prod(shape) > DRAW_CHUNK_ELEMENTS:
        x = torch.empty(shape, dtype=dtype, device=dev)
        flat = x.view(-1, shape[-1])
        step = max(1, DRAW_CHUNK_ELEMENTS // shape[-1])
        for start in range(0, flat.shape[0], step):
            part = flat[start:start + step]
            part.copy_(torch.randn(part.shape, generator=gen, dtype=torch.float64, device=dev))
        return x
    normal = lambda: torch.randn(shape, generator=gen, dtype=torch.float64, device=dev)  # noqa: E731
    if dist == "normal":
        x = normal()
    elif dist == "offset":  # mean and scale vary per row
        lead = (*shape[:-1], 1)
        x = normal() * torch.rand(lead, generator=gen, dtype=torch.float64, device=dev) * 4 + torch.randn(
            lead, generator=gen, dtype=torch.float64, device=dev
        ) * 3
    elif dist == "large_mean":
        # mean 1e4 and a spread of a few ulps at that magnitude: E[x^2]-E[x]^2 cancels.
        x = 1e4 + normal() * max(1.0, 1e4 * finfo.eps)
    elif dist == "constant":  # variance exactly zero; each row its own value
        x = torch.randn((*shape[:-1], 1), generator=gen, dtype=torch.float64, device=dev).expand(shape).clone() * 2
    elif dist == "tiny":  # squares underflow a half-precision accumulator
        x = normal() * (1e-4 if dtype == torch.float16 else 1e-12)
    elif dist == "huge":  # squares overflow a half-precision accumulator, not a float32 one
        x = normal() * (1e4 if dtype == torch.float16 else 1e12)
    elif dist == "outlier_first":  # the row's first element far out: a shift by x[row, 0] then
        # leaves E[s^2] - E[s]^2 to cancel (a cheap guard against large means, wrong here)
        x = normal()
        x[..., 0] = 8 * shape[-1] ** 0.5
    elif dist == "nan_row":  # one NaN in one row: that row's outputs are NaN, no other row's
        x = normal()
        flat = x.view(-1, shape[-1])
        flat[flat.shape[0] // 2, shape[-1] // 3] = float("nan")
    else:
        raise ValueError(f"unknown distribution {dist!r}")
    return x.to(dtype)
