"""Which of the project's kernels the public ops run, looked up once per (op, name)."""
from __future__ import annotations

import functools

from impls import registry

# "auto": the Triton kernel users call with batch_invariant=True where Triton runs here (on the
# GPU compiled, on the CPU under its interpreter), else eager PyTorch.
AUTO_ORDER = ("triton.invariant", "torch.eager")


@functools.cache
def kernel_for(op: str, name: str):
    """The registered kernel ``name`` ("backend.variant", or "auto") of ``op`` that can run here,
    with a backward; raises RuntimeError saying why not."""
    registry.load_builtins()
    names = AUTO_ORDER if name == "auto" else (name,)
    reasons = []
    for full in names:
        backend, _, variant = full.partition(".")
        try:
            k = registry.get(op, backend, variant or None)
        except Exception as exc:  # noqa: BLE001 (unknown name: say so with the others)
            reasons.append(f"{full}: {exc}")
            continue
        why = k.unavailable() or (None if k.has_backward else "no backward")
        if why is None:
            return k
        reasons.append(f"{full}: {why}")
    raise RuntimeError(f"no {op} kernel for {name!r} runs here: " + "; ".join(reasons))
