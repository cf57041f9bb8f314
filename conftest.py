"""Loads the normdiff plugins once for every directory: the checks (harness.plugin, whose options
--backend, --op, --dtype, --profile the benchmarks share) and the benchmarks (harness.bench)."""
pytest_plugins = ("harness.plugin", "harness.bench")
