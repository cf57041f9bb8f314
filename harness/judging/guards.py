"""Poisoned outputs with canaries around them.

Each output is a view into a larger buffer filled with a poison bit pattern: a NaN with a
payload no arithmetic produces. y additionally gets canary columns between its rows (its row
stride is N + GAP), so a write one past the end of any row lands on a canary, not on the next
row. After the call: an element of the view still holding the poison bits was never written;
a canary that changed was written out of bounds. Where the poison is a value a kernel may write
(float8_e4m3fn has no NaN that arithmetic does not make), an element holding it is unwritten only
if a second call, into buffers with another poison, leaves that one there too.

The call may change nothing of its inputs: not their values (``inputs_modified``), nor what the
caller sees of them beyond their values: requires_grad, dtype, shape, strides (``inputs_altered``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from impls.base import NormGrads, NormOutputs

HEAD = 64  # canary elements before each output
TAIL = 64  # and after it
GAP = 16  # canary columns after each row of y

# Signalling NaNs with a distinctive payload: arithmetic only ever produces quiet NaNs.
POISON_BITS = {torch.float16: 0x7DA5, torch.bfloat16: 0x7FA5, torch.float32: 0x7FA5A5A5,
               # fp8 (the fused family's y): a negative NaN, which a cast of a NaN does not give (0x7F)
               torch.float8_e4m3fn: -1, torch.float8_e5m2: -3}  # 0xFF, 0xFD as int8
# Where the poison is a NaN a kernel may write (e4m3fn's only NaNs are 0x7F and 0xFF), the poison of
# the second call that tells an unwritten element from a written one (resolve).
SECOND_POISON_BITS = {torch.float8_e4m3fn: 0x7F}
_INT_VIEW = {1: torch.int8, 2: torch.int16, 4: torch.int32}


def bits_of(t: torch.Tensor) -> torch.Tensor:
    """t's bits as integers of its width (poison and canaries compare bits, not values)."""
    return t.view(_INT_VIEW[t.element_size()])


# Inspections and input comparisons go through their tensors in chunks of this many elements, so
# that their bool temporaries stay small (a mask over a 2**31-element output would take GBs).
CHUNK_ELEMENTS = 2**26


@dataclass
class Guarded:
    """One output inside its buffer: ``view`` goes to the kernel, the rest is canary: HEAD
    elements before, TAIL after, ``gap`` columns after each of ``rows`` rows of ``n``."""

    name: str
    buffer: torch.Tensor  # 1-D, the whole allocation
    view: torch.Tensor
    rows: int
    n: int
    gap: int
    poison: int  # the bits the buffer was filled with

    def bits(self) -> torch.Tensor:
        return bits_of(self.buffer)

    def rows_bits(self) -> torch.Tensor:
        """The view's bits as (rows, n)."""
        return self.bits().as_strided((self.rows, self.n), (self.n + self.gap, 1), HEAD)

    def canaries(self) -> list[tuple[int, torch.Tensor]]:
        """(buffer offset of the first element, bits as rows) of every canary region, in buffer order."""
        bits, end = self.bits(), HEAD + self.rows * (self.n + self.gap)
        regions = [(0, bits[:HEAD].view(1, HEAD))]
        if self.gap:
            regions.append((HEAD + self.n, bits.as_strided((self.rows, self.gap), (self.n + self.gap, 1), HEAD + self.n)))
        return regions + [(end, bits[end:].view(1, -1))]


def _guard(name: str, shape: tuple[int, ...], dtype: torch.dtype, device, gap: int, second: bool = False) -> Guarded:
    """``second``: filled with the dtype's second poison where it has one (resolve)."""
    n = shape[-1] if shape else 1
    rows = 1
    for s in shape[:-1]:
        rows *= s
    row_stride = n + gap
    size = HEAD + rows * row_stride + TAIL
    buffer = torch.empty(size, dtype=dtype, device=device)
    bits = buffer.view(_INT_VIEW[buffer.element_size()])
    poison = SECOND_POISON_BITS.get(dtype, POISON_BITS[dtype]) if second else POISON_BITS[dtype]
    bits.fill_(poison)
    strides = []
    acc = 1
    for i, s in enumerate(reversed(shape)):
        strides.append(acc)
        acc *= row_stride if i == 0 else s
    view = buffer.as_strided(shape, tuple(reversed(strides)), HEAD)
    return Guarded(name, buffer, view, rows, n, gap, poison)


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
    output: str  # an output, or an input ("x", "weight", "bias", ...) for "input modified" and "input altered"
    kind: str  # "unwritten", "out-of-bounds write", "input modified" or "input altered"
    count: int  # elements; for "input altered", properties changed
    first: list[int]  # index of the first offending element (in the output, or buffer offset)
    detail: str = ""  # "input altered": what changed ("requires_grad False -> True")

    def summary(self) -> str:
        if self.detail:
            return f"{self.output}: {self.kind}: {self.detail}"
        where = "buffer offset" if self.kind == "out-of-bounds write" else "element"
        return f"{self.output}: {self.count} {self.kind} element(s), first at {where} {self.first}"


def _chunks(*tensors):
    """Equal-shaped tensors, CHUNK_ELEMENTS at a time along their first dimension, with the first
    row of each chunk."""
    if tensors[0].dim() == 0:
        tensors = tuple(t.reshape(1) for t in tensors)
    per_row = max(1, tensors[0][0].numel()) if tensors[0].shape[0] else 1
    step = max(1, CHUNK_ELEMENTS // per_row)
    for r0 in range(0, tensors[0].shape[0], step):
        yield r0, tuple(t[r0:r0 + step] for t in tensors)


def _count(mask, *tensors) -> torch.Tensor:
    """How many elements ``mask(*parts)`` marks, as a tensor (not read back: a check reads all
    its counts with one synchronisation)."""
    total = torch.zeros((), dtype=torch.int64, device=tensors[0].device)
    for _, parts in _chunks(*tensors):
        total = total + mask(*parts).sum()
    return total


def nan_count(t: torch.Tensor) -> int:
    """How many elements of ``t`` are NaN, counted CHUNK_ELEMENTS at a time: a whole-tensor
    ``isnan(t).sum()`` widens its mask to int64 first, 32 GiB at 16384 x 262144 (out of memory
    on an 80 GB card)."""
    return int(_count(torch.isnan, t))


def _first(mask, *tensors) -> list[int] | None:
    """The index of the first element ``mask`` marks (read only for a finding)."""
    for r0, parts in _chunks(*tensors):
        marked = torch.nonzero(mask(*parts))
        if marked.shape[0]:
            first = [int(i) for i in marked[0]]
            first[0] += r0
            return first
    return None


def _read(counts: list[torch.Tensor]) -> list[int]:
    return [int(c) for c in torch.stack(counts).tolist()] if counts else []


def inspect(guards: list[Guarded], again: list[Guarded] = ()) -> list[GuardFinding]:
    """Unwritten elements and out-of-bounds writes, per output. ``again``: the same outputs of a
    second call, with the second poison: there an element is unwritten only if it holds the
    poison in both. Every count is read back at once; the first offending element is looked for
    only where there is one."""
    plan, counts, second = [], [], {g.name: g for g in again}
    for g in guards:
        rows = (g.rows_bits(),)
        unwritten = lambda b, poison=g.poison: b == poison
        if g.name in second:
            rows += (second[g.name].rows_bits(),)
            unwritten = lambda b, b2, poison=g.poison, p2=second[g.name].poison: (b == poison) & (b2 == p2)
        clobber = lambda b, poison=g.poison: b != poison
        regions = g.canaries()
        plan.append((g, rows, unwritten, clobber, regions))
        counts.append(_count(unwritten, *rows))
        counts.extend(_count(clobber, region) for _, region in regions)
    read = iter(_read(counts))
    findings = []
    for g, rows, unwritten, clobber, regions in plan:
        count = next(read)
        if count:
            where = _first(unwritten, *rows)
            findings.append(GuardFinding(g.name, "unwritten", count, _first_in_view(g, where[0] * (g.n + g.gap) + where[1])))
        clobbered, first = 0, None
        for offset, region in regions:
            found = next(read)
            if found and first is None:  # regions in buffer order: the first region's first is the first
                where = _first(clobber, region)
                first = offset + where[0] * (g.n + g.gap) + where[1] - HEAD
            clobbered += found
        if clobbered:
            findings.append(GuardFinding(g.name, "out-of-bounds write", clobbered, [first]))
    return findings


def resolve(guards: list[Guarded], findings: list[GuardFinding], call_again) -> list[GuardFinding]:
    """``findings`` (inspect's of ``guards``) with every unwritten element in an output whose
    poison a kernel may write checked by a second call: ``call_again()`` calls the kernel again on
    the same inputs into fresh outputs made with ``second=True`` and returns their guards. Only an
    element holding the poison both times is unwritten; the others are judged on their values."""
    doubtful = {f.output for f in findings if f.kind == "unwritten"}
    if not any(g.name in doubtful and g.buffer.dtype in SECOND_POISON_BITS for g in guards):
        return findings
    again = [g for g in call_again() if g.buffer.dtype in SECOND_POISON_BITS]
    return inspect(guards, again)


def _first_in_view(g: Guarded, offset: int) -> list[int]:
    """The view index of the element at ``offset`` elements past the buffer's HEAD."""
    index = []
    for stride in g.view.stride():
        index.append(offset // stride)
        offset %= stride
    return index


def snapshot_inputs(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: t.clone() for name, t in tensors.items()}


def inputs_modified(before: dict[str, torch.Tensor], tensors: dict[str, torch.Tensor]) -> list[GuardFinding]:
    """Inputs (x with the padding between its rows, weight, bias) that the kernel wrote to."""
    def changed(a, b):
        return a.view(_INT_VIEW[a.element_size()]) != b.view(_INT_VIEW[b.element_size()])

    names = list(before)
    findings = []
    for name, count in zip(names, _read([_count(changed, tensors[n], before[n]) for n in names])):
        if count:
            findings.append(GuardFinding(name, "input modified", count, _first(changed, tensors[name], before[name])))
    return findings


# What a call may not change of an input beyond its values.
STATE = ("requires_grad", "dtype", "shape", "strides", "storage offset")


def _state(t: torch.Tensor) -> tuple:
    return t.requires_grad, t.dtype, tuple(t.shape), tuple(t.stride()), t.storage_offset()


def input_state(tensors: dict[str, torch.Tensor | None]) -> dict[str, tuple]:
    """The state (STATE) of each input handed to a call, taken before it."""
    return {name: _state(t) for name, t in tensors.items() if t is not None}


def inputs_altered(before: dict[str, tuple], tensors: dict[str, torch.Tensor | None]) -> list[GuardFinding]:
    """Inputs whose state the call changed (a requires_grad set on the caller's weight, a view
    reshaped in place), each put back as it was so that the check can go on judging."""
    findings = []
    for name, was in before.items():
        t = tensors[name]
        changed = [f"{what} {a} -> {b}" for what, a, b in zip(STATE, was, _state(t)) if a != b]
        if changed:
            findings.append(GuardFinding(name, "input altered", len(changed), [], "; ".join(changed)))
            _restore(t, was)
    return findings


def _restore(t: torch.Tensor, was: tuple) -> None:
    requires_grad, dtype, shape, strides, offset = was
    try:
        with torch.no_grad():
            if t.dtype == dtype and (tuple(t.shape), tuple(t.stride()), t.storage_offset()) != (shape, strides, offset):
                t.as_strided_(shape, strides, offset)
        if t.requires_grad != requires_grad:
            if t.is_leaf:
                t.requires_grad_(requires_grad)
            else:
                t.detach_()
    except RuntimeError:
        pass  # the finding stands; the runner drops the case's inputs
