"""Poisoned outputs with canaries around them.

Each output is a view into a larger buffer filled with a poison bit pattern: a NaN with a
payload no arithmetic produces. y additionally gets canary columns between its rows (its row
stride is N + GAP), so a write one past the end of any row lands on a canary, not on the next
row. After the call: an element of the view still holding the poison bits was never written;
a canary that changed was written out of bounds.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from impls.base import NormGrads, NormOutputs

HEAD = 64  # canary elements before each output
TAIL = 64  # and after it
GAP = 16  # canary columns after each row of y

# Signalling NaNs with a distinctive payload: arithmetic only ever produces quiet NaNs.
POISON_BITS = {torch.float16: 0x7DA5, torch.bfloat16: 0x7FA5, torch.float32: 0x7FA5A5A5}
_INT_VIEW = {2: torch.int16, 4: torch.int32}


@dataclass
class Guarded:
    """One output inside its buffer: ``view`` goes to the kernel, the rest is canary."""

    name: str
    buffer: torch.Tensor  # 1-D, the whole allocation
    view: torch.Tensor
    inside: torch.Tensor  # bool mask over buffer: True where the view's elements live

    def bits(self) -> torch.Tensor:
        return self.buffer.view(_INT_VIEW[self.buffer.element_size()])


def _guard(name: str, shape: tuple[int, ...], dtype: torch.dtype, device, gap: int) -> Guarded:
    n = shape[-1] if shape else 1
    rows = 1
    for s in shape[:-1]:
        rows *= s
    row_stride = n + gap
    size = HEAD + rows * row_stride + TAIL
    buffer = torch.empty(size, dtype=dtype, device=device)
    bits = buffer.view(_INT_VIEW[buffer.element_size()])
    bits.fill_(POISON_BITS[dtype])
    strides = []
    acc = 1
    for i, s in enumerate(reversed(shape)):
        strides.append(acc)
        acc *= row_stride if i == 0 else s
    view = buffer.as_strided(shape, tuple(reversed(strides)), HEAD)
    inside = torch.zeros(size, dtype=torch.bool, device=device)
    inside.as_strided(shape, tuple(reversed(strides)), HEAD).fill_(True)
    return Guarded(name, buffer, view, inside)


def guarded_outputs(kernel, x: torch.Tensor) -> tuple[NormOutputs, list[Guarded]]:
    """Poisoned, canaried outputs for ``kernel`` called on ``x``."""
    guards = [_guard("y", tuple(x.shape), x.dtype, x.device, GAP)]
    for name in ("mean", "rstd"):
        if name in kernel.outputs:
            guards.append(_guard(name, tuple(x.shape[:-1]), torch.float32, x.device, 0))
    views = {g.name: g.view for g in guards}
    return NormOutputs(y=views["y"], mean=views.get("mean"), rstd=views.get("rstd")), guards


def guarded_grads(x: torch.Tensor, weight, bias) -> tuple[NormGrads, list[Guarded]]:
    """Poisoned, canaried gradient buffers for a backward on ``x``: dx (canary columns between its
    rows, as y's), and dw and db (N) where the forward had weight and bias."""
    guards = [_guard("dx", tuple(x.shape), x.dtype, x.device, GAP)]
    for name, t in (("dw", weight), ("db", bias)):
        if t is not None:
            guards.append(_guard(name, tuple(t.shape), t.dtype, t.device, 0))
    views = {g.name: g.view for g in guards}
    return NormGrads(dx=views["dx"], dw=views.get("dw"), db=views.get("db")), guards


@dataclass
class GuardFinding:
    output: str  # an output, or an input ("x", "weight", "bias") for "input modified"
    kind: str  # "unwritten", "out-of-bounds write" or "input modified"
    count: int
    first: list[int]  # index of the first offending element (in the output, or buffer offset)

    def summary(self) -> str:
        where = "buffer offset" if self.kind == "out-of-bounds write" else "element"
        return f"{self.output}: {self.count} {self.kind} element(s), first at {where} {self.first}"


def inspect(guards: list[Guarded]) -> list[GuardFinding]:
    """Unwritten elements and out-of-bounds writes, per output."""
    findings = []
    for g in guards:
        poison = g.bits() == POISON_BITS[g.buffer.dtype]
        unwritten = poison & g.inside
        if unwritten.any():
            findings.append(GuardFinding(g.name, "unwritten", int(unwritten.sum()), _first_in_view(g, unwritten)))
        clobbered = ~poison & ~g.inside
        if clobbered.any():
            first = int(torch.nonzero(clobbered)[0].item()) - HEAD
            findings.append(GuardFinding(g.name, "out-of-bounds write", int(clobbered.sum()), [first]))
    return findings


def _first_in_view(g: Guarded, unwritten: torch.Tensor) -> list[int]:
    offset = int(torch.nonzero(unwritten)[0].item()) - HEAD
    index = []
    for stride in g.view.stride():
        index.append(offset // stride)
        offset %= stride
    return index


def snapshot_inputs(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: t.clone() for name, t in tensors.items()}


def inputs_modified(before: dict[str, torch.Tensor], tensors: dict[str, torch.Tensor]) -> list[GuardFinding]:
    """Inputs (x with the padding between its rows, weight, bias) that the kernel wrote to."""
    findings = []
    for name, old in before.items():
        new = tensors[name]
        changed = new.view(_INT_VIEW[new.element_size()]) != old.view(_INT_VIEW[old.element_size()])
        if changed.any():
            first = [int(i) for i in torch.nonzero(changed)[0]]
            findings.append(GuardFinding(name, "input modified", int(changed.sum()), first))
    return findings
