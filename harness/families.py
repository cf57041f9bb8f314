"""The project's two families (harness.judging.family): the plain norms (impls.base.NormKernel,
harness/test_differential.py and its neighbours) and the fused ones (impls.fused.FusedNormKernel,
harness/test_fused.py). Each is one object: catalogue, case ids, pairing, checks, memory and
benchmark rows. Imported by the plugins, which registers them."""
from __future__ import annotations

from harness.benchmarks import bench_backward, bench_fused, bench_sweep
from harness.benchmarks.bench_forward import run_forward
from harness.judging import cases, fused_cases, fused_runner, runner
from harness.judging.family import Family, register_family
from harness.running import estimate
from impls.base import OPS
from impls.fused import FUSED_OPS


class PlainFamily(Family):
    """RMSNorm and LayerNorm, forward and backward: ``(x, weight, bias, eps)``."""

    name, ops = "plain", OPS
    # harness/test_backward.py pairs its backward and property cases itself
    forward_fixture, backward_fixture, kernel_fixture = "case_kernel", None, "kernel"

    def __init__(self):
        self.oracle, self.backward_oracle = runner.OracleCache(), runner.BackwardOracleCache()

    def catalogue(self, profile):
        return cases.catalogue(profile)

    def backward_catalogue(self, profile):
        return cases.backward_catalogue(profile)

    def case_from_id(self, case_id):
        return cases.case_from_id(case_id)

    def check(self, kernel, case, watch=None):
        return runner.check(kernel, case, oracle=self.oracle, keep_outputs=True, watch=watch)

    def check_backward(self, kernel, case, watch=None):
        return runner.check_backward(kernel, case, oracle=self.backward_oracle, watch=watch)

    def forget(self):
        self.oracle.forget()
        self.backward_oracle.forget()

    def estimate(self, need, case, kernel, peers, device):
        return estimate.plain_parts(need, case, kernel, peers, device)

    def bench_items(self, config, kernels, profile, dtypes, repeat, bench_set):
        ops = [op for op in self.ops if any(k.op == op for k in kernels)]
        return bench_sweep.items(bench_sweep.sweep(profile, ops, dtypes, repeat, bench_set), kernels,
                                 config.getoption("bench_baseline"))

    def run_bench(self, item, benchmark, ctx):
        if item.shape.regime == "backward":
            return bench_backward.run_backward(item, benchmark, ctx)
        return run_forward(item, benchmark, ctx)


class FusedFamily(Family):
    """The residual add (in place too), Gemma's (1 + w) and the fp8 output: each case in every write
    convention its kernel declares (fused_cases.with_writes)."""

    name, ops = "fused", FUSED_OPS
    forward_fixture, backward_fixture, kernel_fixture = "fused_case_kernel", "fused_backward_case_kernel", "fused_kernel"

    def __init__(self):
        self.oracle = fused_runner.FusedOracleCache()

    def catalogue(self, profile):
        return fused_cases.fused_catalogue(profile)

    def backward_catalogue(self, profile):
        return fused_cases.fused_backward_catalogue(profile)

    def case_from_id(self, case_id):
        return fused_cases.fused_case_from_id(case_id)

    def pairs(self, cases_, kernels, backward=False):
        return fused_cases.write_pairs(cases_, kernels, backward)

    def check(self, kernel, case, watch=None):
        return fused_runner.check_fused(kernel, case, oracle=self.oracle, watch=watch)

    def check_backward(self, kernel, case, watch=None):
        return fused_runner.check_fused_backward(kernel, case, oracle=self.oracle, watch=watch)

    def forget(self):
        self.oracle.forget()

    def estimate(self, need, case, kernel, peers, device):
        return estimate.fused_parts(need, case, kernel, peers, device)

    def bench_items(self, config, kernels, profile, dtypes, repeat, bench_set):
        ops = [op for op in self.ops if any(k.op == op for k in kernels)]
        return bench_fused.items(bench_fused.sweep(profile, ops, dtypes, repeat, bench_set), kernels,
                                 bench_fused.baseline_of(config))

    def run_bench(self, item, benchmark, ctx):
        return bench_fused.run_fused(item, benchmark, ctx)


PLAIN, FUSED = register_family(PlainFamily()), register_family(FusedFamily())

__all__ = ["FUSED", "PLAIN", "FusedFamily", "PlainFamily"]
