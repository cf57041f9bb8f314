"""Standalone reproductions of the harness's failures (``python -m harness.repro NODEID``): one
file that imports torch and the kernel's own library, draws the case's inputs as the harness does,
calls the kernel through the library's public API (``NormKernel.repro_call``), judges the outputs
against a float64 reference with the case's allowance and the write guard, and exits 1 while the
defect is present. ``--shrink`` first looks for a smaller failing case (harness.repro.shrink).
docs/repro.md has the whole of it."""
from __future__ import annotations

from harness.repro.emit import generate
from harness.repro.target import Target, resolve

__all__ = ["Target", "generate", "resolve"]
