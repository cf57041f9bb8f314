"""Triton candidates: kernels and launch choices that tools/long_row_probe.py times beside the
registered kernels (and tools/candidate_backend.py checks as backends of their own). Nothing in
the backend imports this package: it is loaded only by what asks for it. A candidate that a
probe finds faster moves into the registered kernels (_split_kernels, settings, the tuned
table); one that loses is deleted, its numbers kept in docs/perf-notes.md.

- ``split``: triton.split with another launch setting (columns, warps, the lagged kernels' load
  choices), with the kernel that waits for a row's partials before storing it instead of the
  lagged one, or with the lagged kernels of ``l2_kernels`` (an L2 bulk prefetch, the next row
  not held);
- ``store_halves``: the lagged LayerNorm with its store step in two halves (``halves``).
"""
from __future__ import annotations

import dataclasses

from impls.triton.settings import SPLIT_LAG_MIN_N, LaunchConfig


@dataclasses.dataclass(frozen=True)
class CandidateConfig(LaunchConfig):
    """A split launch setting with the choices of candidates.l2_kernels."""

    l2_ahead: int = 0  # rows past the next one brought into L2 by a bulk prefetch (0: none)
    hold_next: bool = True  # the next row held in registers while this one is reduced


class _SplitCandidate:
    """Mixed into a registered split kernel's class: its setting with ``choices`` over it, the
    waiting kernel where ``lagged`` is off, and l2_kernels' lagged kernels where the setting asks
    for their choices."""

    choices: dict = {}
    lagged: bool = True
    l2_kernels: bool = False  # the lagged kernels of l2_kernels, given the setting's l2_ahead and hold_next

    def config(self, n, dtype, m=None) -> LaunchConfig:
        own = dataclasses.asdict(super().config(n, dtype))
        return CandidateConfig(**{**own, **self.choices})

    def kernel_name(self, n: int) -> str:
        return super().kernel_name(n) if self.lagged else self._kernel_name

    def lag_meta(self, cfg: CandidateConfig) -> dict:
        meta = super().lag_meta(cfg)
        if self.l2_kernels:
            meta.update(L2_AHEAD=cfg.l2_ahead, HOLD_NEXT=cfg.hold_next)
        return meta


def split(op: str, block_n: int | None = None, warps: int | None = None, lagged: bool = True, **choices):
    """triton.split with ``block_n`` columns x ``warps`` a program (default: the setting's), the
    waiting kernel where ``lagged`` is off, and ``choices`` (CandidateConfig fields: hold_w,
    x_cache, w_evict, next_first, l2_ahead, hold_next) over the setting's own."""
    from impls import registry

    base = type(registry.get(op, "triton", "split"))
    kernel = type(base.__name__ + "Candidate", (_SplitCandidate, base), {})()
    kernel.choices = {**({"block_n": block_n, "num_warps": warps} if block_n else {}), **choices}
    kernel.lagged = lagged
    if choices.get("l2_ahead") or choices.get("hold_next") is False:
        from impls.triton.candidates import l2_kernels

        kernel.kernel_module, kernel.l2_kernels = l2_kernels, True
    return kernel


def store_halves(block_n: int | None = None, warps: int | None = None):
    """triton.split's LayerNorm with its lagged rows run by layer_norm_split_lag_halves, which
    always loads the next row first and never holds the weight."""
    from impls.triton.candidates import halves

    kernel = split("layer_norm", block_n, warps, hold_w=False, next_first=True)
    kernel.kernel_module = halves
    kernel.kernel_name = lambda n: "layer_norm_split_lag_halves" if n >= SPLIT_LAG_MIN_N else kernel._kernel_name
    return kernel
