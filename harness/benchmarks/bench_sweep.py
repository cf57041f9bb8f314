"""What the benchmarks time: the sweep of shapes (op, dtype, M x N, regime; every N and M from
harness.judging.shapes) and one benchmark's parameter, a shape, a kernel and, at decode for a
kernel that can launch with programmatic dependent launch (``impls.pdl``), PDL on or off."""
from __future__ import annotations

from dataclasses import dataclass

from harness.judging.shapes import (BACKWARD_BENCH_N, BANDWIDTH_N, BENCH_LONG_N, DECODE_M, DECODE_N, HEADLINE_BACKWARD_N,
                            HEADLINE_BANDWIDTH_N, HEADLINE_DECODE, HEADLINE_LONG_N, QUICK_BACKWARD, QUICK_BANDWIDTH,
                            QUICK_DECODE, bandwidth_rows)
from impls.base import NormKernel


@dataclass(frozen=True)
class BenchShape:
    op: str
    dtype: str
    m: int
    n: int
    regime: str  # "bandwidth", "decode" or "backward"
    repeat: int = 0  # pass of the bandwidth sweep (--bench-repeat)

    @property
    def group(self) -> str:
        return f"{self.op}-{self.dtype}-{self.m}x{self.n}" + ("-backward" if self.regime == "backward" else "")


@dataclass(frozen=True)
class BenchItem:
    """One benchmark's parameter (not a NormKernel or a tuple, so the correctness report ignores it).
    ``pdl``: True or False where the item is timed with PDL forced on or off (``with_pdl``), None
    where the kernel launches as it does by default."""

    shape: BenchShape
    kernel: NormKernel
    pdl: bool | None = None

    @property
    def id(self) -> str:
        launch = "" if self.pdl is None else "-pdl" if self.pdl else "-nopdl"
        repeat = f"-repeat{self.shape.repeat}" if self.shape.repeat else ""
        return f"{self.shape.group}-{self.kernel.name}{launch}{repeat}"

    @property
    def forced_on(self) -> bool:
        """Timed with PDL forced on: not the row a speedup or a host-inclusive figure comes from
        (those compare like with like against kernels that cannot launch with PDL)."""
        return self.pdl is True

    def __repr__(self) -> str:  # how pytest-benchmark's JSON shows the parameter
        return self.id


def sweep(profile: str, ops, dtypes, repeat: int = 1, bench_set: str = "full") -> list[BenchShape]:
    """The shapes in run order: each bandwidth pass, then the decode regime, then the backward.
    The full profile's ``bench_set``: "full" (the whole sweep) or "headline" (shapes.HEADLINE_*)."""
    shapes = []
    if profile == "full" and bench_set == "headline":
        bandwidth = [(bandwidth_rows(n), n) for n in HEADLINE_BANDWIDTH_N + HEADLINE_LONG_N]
        decode = list(HEADLINE_DECODE)
        backward = [(bandwidth_rows(n), n) for n in HEADLINE_BACKWARD_N]
    elif profile == "full":
        bandwidth = [(bandwidth_rows(n), n) for n in BANDWIDTH_N + BENCH_LONG_N]
        decode = [(m, n) for n in DECODE_N for m in DECODE_M]
        backward = [(bandwidth_rows(n), n) for n in BACKWARD_BENCH_N]
    else:
        bandwidth, decode, backward = list(QUICK_BANDWIDTH), list(QUICK_DECODE), list(QUICK_BACKWARD)
    for r in range(repeat):
        shapes += [BenchShape(op, dt, m, n, "bandwidth", r) for op in ops for dt in dtypes for m, n in bandwidth]
    shapes += [BenchShape(op, dt, m, n, "decode") for op in ops for dt in dtypes for m, n in decode]
    shapes += [BenchShape(op, dt, m, n, "backward") for op in ops for dt in dtypes for m, n in backward]
    return shapes


def with_pdl(s: BenchShape, k) -> list[BenchItem]:
    """The items of kernel ``k`` at shape ``s``: at decode, a kernel that declares it can launch
    with PDL (``KernelContract.pdl``) twice, PDL on then off (a graph of back-to-back calls overlaps
    them with PDL, which a model's step of other kernels between two norms does not give); every
    other item once, as the kernel launches by default."""
    if s.regime == "decode" and getattr(k, "pdl", False):
        return [BenchItem(s, k, True), BenchItem(s, k, False)]
    return [BenchItem(s, k)]


def items(shapes: list[BenchShape], kernels: list[NormKernel], baseline: str) -> list[BenchItem]:
    """Every kernel of the shape's op (the backward regime: those with a backward), the baseline
    first in each group (its time sets the speedups)."""
    out = []
    for s in shapes:
        ks = sorted((k for k in kernels if k.op == s.op and (s.regime != "backward" or k.has_backward)),
                    key=lambda k: (k.name != baseline, k.name))
        out += [it for k in ks for it in with_pdl(s, k)]
    return out
