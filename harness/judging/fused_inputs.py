"""A fused case's inputs, drawn bit for bit from its id, inside canaried buffers.

x and residual live in buffers with poisoned canaries before and after them (and, for strided
rows, padding between rows): a kernel that writes in place may write the views its convention
names and nothing else. ``fresh()`` gives a copy with the same layout, so a check that writes its
inputs never hands the next kernel changed ones.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.judging.guards import HEAD, POISON_BITS, TAIL, bits_of
from harness.judging.inputs import make_dy, make_x
from impls.fused import ADD_OPS, BASE_OP, fp8_max


@dataclass
class Placed:
    """A view's place in a buffer: shape, strides and offset in elements."""

    buffer: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int


@dataclass
class FusedInputs:
    buffers: dict[str, torch.Tensor]  # 1-D whole allocations, canaries included
    places: dict[str, Placed]  # "x", "residual": where each view lies
    weight: torch.Tensor | None
    bias: torch.Tensor | None
    eps: float
    scale: float | None  # y / scale (the oracle's convention)

    def view(self, name: str) -> torch.Tensor | None:
        p = self.places.get(name)
        return None if p is None else self.buffers[p.buffer].as_strided(p.shape, p.stride, p.offset)

    @property
    def x(self) -> torch.Tensor:
        return self.view("x")

    @property
    def residual(self) -> torch.Tensor | None:
        return self.view("residual")

    def fresh(self) -> FusedInputs:
        """A copy in new buffers with the same layout (for a call that writes its inputs)."""
        return FusedInputs({k: b.clone() for k, b in self.buffers.items()}, self.places, self.weight, self.bias,
                           self.eps, self.scale)

    def parameters(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in (("weight", self.weight), ("bias", self.bias)) if v is not None}


def _poisoned(size: int, dtype: torch.dtype, device) -> torch.Tensor:
    buffer = torch.empty(size, dtype=dtype, device=device)
    bits_of(buffer).fill_(POISON_BITS[dtype])
    return buffer


def _residual_dist(dist: str) -> str:
    return {"nan_row": "normal", "fp8_max": "constant", "sum_rounds": "normal"}.get(dist, dist)


def make_fused_inputs(case, device: str | torch.device = "cpu") -> FusedInputs:
    """Deterministic inputs for a FusedCase: x from the case's distribution, the residual from its
    own seed (constant rows stay constant, a NaN stays in x), weight and bias as the case says."""
    gen = torch.Generator(device=device).manual_seed(case.seed)
    dtype, lead, n, pad = case.torch_dtype, case.shape[:-1], case.n, case.row_pad
    x_dist = {"fp8_max": "constant", "sum_rounds": "normal"}.get(case.dist, case.dist)
    x_vals = make_x(x_dist, (*lead, n), dtype, gen)
    residual_vals = None
    if case.op in ADD_OPS:
        rgen = torch.Generator(device=device).manual_seed(case.seed ^ 0x5EED)
        residual_vals = make_x(_residual_dist(case.dist), (*lead, n), case.residual_torch_dtype, rgen)
        if case.dist == "sum_rounds":
            # x of magnitude ~64 and residual 0.1 with x's sign: rounded to a 16-bit residual_out,
            # x + residual is x wherever its ulp is 0.25 or more, so statistics taken on the
            # rounded sum differ from those on the float32 sum by ~0.1% in rstd.
            x_vals = (x_vals.double() * 64).to(dtype)
            residual_vals = (0.1 * torch.sign(x_vals.double())).to(case.residual_torch_dtype)
    rows = 1
    for s in lead:
        rows *= s
    places: dict[str, Placed] = {}
    buffers: dict[str, torch.Tensor] = {}

    def place(name: str, buffer: str, col0: int, row_stride: int, values: torch.Tensor) -> None:
        stride, acc = [], 1
        for i, s in enumerate(reversed(case.shape)):
            stride.append(acc)
            acc *= row_stride if i == 0 else s
        p = Placed(buffer, tuple(case.shape), tuple(reversed(stride)), HEAD + col0)
        places[name] = p
        buffers[buffer].as_strided(p.shape, p.stride, p.offset).copy_(values)

    if case.adjacent:  # rows [x | residual | padding] of one buffer
        row_stride = 2 * n + pad
        buffers["x+residual"] = _poisoned(HEAD + rows * row_stride + TAIL, dtype, device)
        place("x", "x+residual", 0, row_stride, x_vals)
        place("residual", "x+residual", n, row_stride, residual_vals)
    else:
        buffers["x"] = _poisoned(HEAD + rows * (n + pad) + TAIL, dtype, device)
        place("x", "x", 0, n + pad, x_vals)
        if residual_vals is not None:
            rdtype = case.residual_torch_dtype
            buffers["residual"] = _poisoned(HEAD + rows * (n + pad) + TAIL, rdtype, device)
            place("residual", "residual", 0, n + pad, residual_vals)
    weight = bias = None
    if case.has_weight:
        if case.weight_dist == "small":  # |w| in [0.6, 1) * 2**-8, both signs
            mag = (0.6 + 0.4 * torch.rand(n, generator=gen, device=gen.device, dtype=torch.float64)) * 2.0**-8
            sign = torch.where(torch.rand(n, generator=gen, device=gen.device) < 0.5, -1.0, 1.0).double()
            weight = (mag * sign).to(dtype)
        elif case.weight_offset:  # Gemma stores w near 0; the model's weight is 1 + w
            weight = (0.5 * torch.randn(n, generator=gen, device=gen.device)).to(dtype)
        else:  # away from one, some negative: an ignored weight shows
            weight = (1.0 + 0.5 * torch.randn(n, generator=gen, device=gen.device)).to(dtype)
    if case.has_bias:
        bias = (0.5 * torch.randn(n, generator=gen, device=gen.device)).to(dtype)
    if case.dist == "fp8_max" and case.out_dtype:
        # Rows of one value: x^ is +-1 (RMSNorm) or 0 (LayerNorm), so every 7th y is +-max * scale
        # through the weight (RMSNorm) or the bias (LayerNorm): y / scale lands on the maximum.
        top = fp8_max(case.out_torch_dtype) * case.scale
        signs = torch.where(torch.arange(n, device=gen.device) % 2 == 0, 1.0, -1.0)[::7]
        target = bias if BASE_OP[case.op] == "layer_norm" and bias is not None else weight
        if target is not None:
            target[::7] = (top * signs).to(dtype)
    return FusedInputs(buffers, places, weight, bias, case.eps_value, case.scale)


def make_fused_dy(case, device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """dy (x's shape and dtype) and, for the add ops, residual_out's gradient (residual's dtype,
    drawn from its own seed): the backward gets both, as a model's does."""
    dy, _ = make_dy(case, device)
    if case.op not in ADD_OPS:
        return dy.contiguous(), None
    gen = torch.Generator(device=device).manual_seed(case.seed ^ 0xD1FF)
    dres = (0.5 * torch.randn(case.shape, generator=gen, dtype=torch.float64, device=gen.device))
    return dy.contiguous(), dres.to(case.residual_torch_dtype)
