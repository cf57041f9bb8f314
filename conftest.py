"""Loads the normdiff plugins once for every directory: the checks (harness.plugin, whose options
--backend, --op, --dtype, --profile the benchmarks share) and the benchmarks (harness.bench). A run
given --backend-file, from any directory, has them loaded earlier by the installed pytest entry
point (harness/entry.py) under these same names, so each is registered once."""
pytest_plugins = ("harness.plugin", "harness.bench")
