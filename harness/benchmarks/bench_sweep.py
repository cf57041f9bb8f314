"""What the benchmarks time: the sweep of shapes (op, dtype, M x N, regime; every N and M from
harness.judging.shapes) and one benchmark's parameter, a shape and a kernel."""
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
    """One benchmark's parameter (not a NormKernel or a tuple, so the correctness report ignores it)."""

    shape: BenchShape
    kernel: NormKernel

    @property
    def id(self) -> str:
        return f"{self.shape.group}-{self.kernel.name}" + (f"-repeat{self.shape.repeat}" if self.shape.repeat else "")

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


def items(shapes: list[BenchShape], kernels: list[NormKernel], baseline: str) -> list[BenchItem]:
    """Every kernel of the shape's op (the backward regime: those with a backward), the baseline
    first in each group (its time sets the speedups)."""
    out = []
    for s in shapes:
        ks = sorted((k for k in kernels if k.op == s.op and (s.regime != "backward" or k.has_backward)),
                    key=lambda k: (k.name != baseline, k.name))
        out += [BenchItem(s, k) for k in ks]
    return out
