"""A third op family from outside the project, to prove the seam (tests/test_toy_family.py): row
L2 normalisation, y = x / max(||x||, eps), with a catalogue of two rows, one correct kernel and one
that leaves a row's last element out of its norm, its float64 oracle, and a benchmark row. It
registers its kernels (impls.registry) and its family (harness.judging.family) and touches nothing
in harness/ or impls/."""
from __future__ import annotations

import hashlib
import statistics
from dataclasses import dataclass
from typing import ClassVar

import torch

from harness.judging.cases import Case
from harness.judging.compare import compare
from harness.judging.family import Family, register_family
from harness.judging.runner import CheckResult, device_for
from impls.contract import KernelContract
from impls.registry import register

OP = "l2_normalize"
EPS = 1e-12


class ToyKernel(KernelContract):
    family: ClassVar[str] = "toy"
    op: ClassVar[str] = OP
    backend: ClassVar[str] = "toy"
    devices: ClassVar[tuple[str, ...]] = ("cpu", "cuda")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not x.is_floating_point():
            raise TypeError(f"{self.name}: x must be floating point, got {x.dtype}")
        return self._norm(x.float()).to(x.dtype)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        return x / x.norm(dim=-1, keepdim=True).clamp(min=EPS)


@register
class Eager(ToyKernel):
    variant = "eager"


@register
class LastLeftOut(ToyKernel):
    """Its norm leaves out each row's last element."""
    variant = "last_left_out"

    def _norm(self, x):
        return x / x[:, :-1].norm(dim=-1, keepdim=True).clamp(min=EPS)


@dataclass(frozen=True)
class ToyCase(Case):
    @property
    def id(self) -> str:
        return f"{self.op}-{self.dtype}-{'x'.join(map(str, self.shape))}"


def oracle(x: torch.Tensor) -> torch.Tensor:
    x = x.double()
    return x / x.norm(dim=-1, keepdim=True).clamp(min=EPS)


def draw(case: ToyCase, device: str) -> torch.Tensor:
    seed = int.from_bytes(hashlib.sha256(case.id.encode()).digest()[:4], "little")
    g = torch.Generator().manual_seed(seed)
    return torch.randn(case.shape, generator=g).to(case.torch_dtype).to(device)


class ToyFamily(Family):
    name, ops = "toy", (OP,)
    ROWS = (ToyCase(OP, "float32", (3, 100), tags=("rows",)), ToyCase(OP, "bfloat16", (5, 129), tags=("padded N",)))

    def catalogue(self, profile):
        return list(self.ROWS)

    def case_from_id(self, case_id):
        return next(c for c in self.ROWS if c.id == case_id)

    def check(self, kernel, case, watch=None):
        result = CheckResult(case=case, kernel=kernel.name)
        x = draw(case, device_for(kernel))
        y = kernel(x)
        result.errors = [compare("y", y, oracle(x), case.torch_dtype, 1e-6, 1.0)]
        return result

    def estimate(self, need, case, kernel, peers, device):
        return {"inputs": 2 * case.rows * case.n * 8}

    def bench_items(self, config, kernels, profile, dtypes, repeat, bench_set):
        from harness.benchmarks.bench_sweep import BenchItem, BenchShape

        return [BenchItem(BenchShape(OP, "float32", 256, 1024, "bandwidth"), k) for k in kernels]

    def run_bench(self, item, benchmark, ctx):
        """Timed as the project's rows are: the session's timer and rounds, bytes against its copy."""
        s, kernel = item.shape, item.kernel
        device = device_for(kernel)
        x = torch.randn(s.m, s.n, device=device)
        timer, fallback = ctx.timer(lambda: kernel(x), s.regime, device)
        rounds, warmup = ctx.rounds(s.regime, device)
        benchmark.pedantic(timer.target, setup=timer.setup, rounds=rounds, warmup_rounds=warmup)
        median = statistics.median(timer.times[-rounds:])
        nbytes, (ceiling, _) = 2 * x.numel() * x.element_size(), ctx.ceiling(device)
        benchmark.extra_info.update(
            family=self.name, case=f"{OP}-{s.m}x{s.n}", case_title="row L2 normalisation", op=OP, dtype=s.dtype,
            m=s.m, n=s.n, regime=s.regime, repeat=s.repeat, kernel=kernel.name, backend=kernel.backend,
            variant=kernel.variant, bytes=nbytes, ceiling_gbps=ceiling, timing=fallback or timer.how,
            timer=timer.kind, median_us=median * 1e6, gbps=nbytes / median / 1e9)


register_family(ToyFamily())
