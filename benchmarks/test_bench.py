"""pytest-benchmark benchmarks of every selected kernel: ``pytest --benchmark-only`` from the root.

The sweep, the timing and the report live in ``harness.bench``; ``harness/benchmarks/timing.py`` says exactly
what a time is.
"""
from harness.bench import run_benchmark


def test_bench(bench_item, benchmark, bench_context):
    run_benchmark(bench_item, benchmark, bench_context)
