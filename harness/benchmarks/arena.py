"""Where a benchmark's tensors live: one allocation for the whole session (harness.bench), within
the device memory budget (harness.running.memory)."""
from __future__ import annotations

import math

import torch

from harness.running import devmem, memory
from harness.judging.cases import DTYPES


class Arena:
    """One allocation carved into a shape's x, weight, bias, y, mean and rstd at offsets that
    depend on the shape alone. It grows (a new allocation) only for a shape larger than it was
    sized for, or where the sized allocation did not fit in memory (then: ``fallback``)."""

    # Every part starts on a 2 MiB boundary (a large page): the one-pass kernels ran faster than
    # at 4 KiB offsets (docs/perf-notes.md item 13 has the measurement).
    ALIGN = 2 << 20

    def __init__(self, nbytes: int, device: str) -> None:
        self.device, self.fallback = device, None
        self.prefilled = 0  # bytes of written memory left in the caching allocator (BenchContext.arena)
        try:
            self.buf = torch.empty(max(nbytes, self.ALIGN), dtype=torch.uint8, device=device)
        except torch.OutOfMemoryError as exc:
            self.fallback = f"one arena of {nbytes / 2**30:.1f} GiB did not fit ({exc}); allocated per shape"
            self.buf = torch.empty(self.ALIGN, dtype=torch.uint8, device=device)

    @classmethod
    def for_shapes(cls, shapes, device: str, room: int | None = None) -> "Arena":
        """The one buffer every benchmark on ``device`` takes its x, parameters and outputs from,
        sized for the largest of ``shapes`` and allocated once. Nothing is handed back to the
        driver during the session (no ``empty_cache``): after tens of GB were freed, the next
        kernel timed ran slow for a fraction of a second, longer than the settle step, while the
        placement of x made no difference (docs/perf-notes.md). ``room``: bytes of the memory
        budget left beside the largest shape; the allocator's fill stays within it."""
        arena = cls(max((cls.layout(s)[1] for s in shapes), default=0), device)
        if device == "cuda":
            # What kernels allocate themselves (eager's y, a compiled graph's buffers) comes from
            # the caching allocator: fill it once with memory already mapped and written, so no
            # shape of either pass is the first to use fresh memory.
            biggest = max((2 * s.m * s.n * DTYPES[s.dtype].itemsize for s in shapes), default=0)
            if room is not None:
                biggest = max(0, min(biggest, room))
            try:
                torch.empty(biggest, dtype=torch.uint8, device=device).fill_(0)
                arena.prefilled = biggest
            except torch.OutOfMemoryError:
                pass  # the arena's fallback note already says memory is short
            torch.cuda.synchronize()
        return arena

    def describe(self) -> str:
        how = self.fallback or (f"x, weight, bias and outputs of every shape in one {self.buf.numel() / 2**30:.2f} GiB "
                                f"allocation, made once, each at a {self.ALIGN // 2**20} MiB boundary: the same "
                                "addresses in every pass")
        if self.prefilled:
            how += (f"; the caching allocator filled once with {self.prefilled / 2**30:.2f} GiB of written memory "
                    "for what kernels allocate themselves; no memory handed back during the session")
        return how

    @classmethod
    def layout(cls, s) -> tuple[dict, int]:
        """{part: (offset, dtype, shape)} and the bytes the shape needs: a shape's own parts where it
        names them (``arena_parts``: the fused shapes, harness.benchmarks.bench_fused), else x,
        weight, bias, y, mean and rstd."""
        dt = DTYPES[s.dtype]
        own = getattr(s, "arena_parts", None)
        parts = own() if own is not None else (
            ("x", dt, (s.m, s.n)), ("w", dt, (s.n,)), ("b", dt, (s.n,)), ("y", dt, (s.m, s.n)),
            ("mean", torch.float32, (s.m,)), ("rstd", torch.float32, (s.m,)))
        out, off = {}, 0
        for name, dtype, shape in parts:
            out[name] = (off, dtype, shape)
            off += -(-math.prod(shape) * dtype.itemsize // cls.ALIGN) * cls.ALIGN
        return out, off

    def views(self, s) -> dict[str, torch.Tensor]:
        parts, need = self.layout(s)
        if need > self.buf.numel():
            del self.buf
            self.buf = torch.empty(need, dtype=torch.uint8, device=self.device)
        return {name: self.buf[off:off + math.prod(shape) * dt.itemsize].view(dt).view(shape)
                for name, (off, dt, shape) in parts.items()}


def shape_need(s, sample_elements: int) -> int:
    """Device bytes one benchmark of shape ``s`` needs: its arena layout, a y and statistics a
    kernel may allocate itself (twice: eager's result and a copy), the oracle's float64 sample of
    ``sample_elements``; the backward adds dy, dx and the screen's float64 reference over all rows."""
    e, b = s.m * s.n, DTYPES[s.dtype].itemsize
    need = Arena.layout(s)[1] + 2 * e * b + 4 * sample_elements * 8
    if s.regime == "backward":
        need += 2 * e * b + 6 * 8 * e
    return need


def device_budget(asked: str | None) -> int:
    """The bytes a benchmark process may use: ``--gpu-memory`` (``asked``; the process's allocator is
    capped at it too) or the free memory now, less the reserve (harness.running.memory.default_budget)."""
    size = memory.parse_size(asked) if asked else None
    card = devmem.RealCard()
    free, total = card.mem_get_info()
    if size:
        card.set_per_process_memory_fraction(min(1.0, size / total))
    return memory.default_budget(free + card.memory_reserved(), size)


def beyond_budget(s, name: str, budget: int, sample_elements: int) -> str | None:
    """Why shape ``s`` cannot run within ``budget``, or None."""
    need = shape_need(s, sample_elements)
    if need <= budget:
        return None
    return (f"{memory.TOO_BIG}{name} needs about {memory.fmt(need)} (inputs, outputs, the oracle's "
            f"sample), more than the budget of {memory.fmt(budget)}")
