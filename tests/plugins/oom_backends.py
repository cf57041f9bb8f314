"""Outside backends that run out of memory the ways a GPU run does, each on one catalogue case
only (RMSNorm, bfloat16, quick profile), and compute a correct RMSNorm everywhere else:

- ``oom_once``: ``torch.OutOfMemoryError`` on 17 x 769 the first time in a run (memory another
  check held): the retry alone passes;
- ``oom_always``: ``torch.OutOfMemoryError`` asking 64 GiB on 3 x 769 every time: out of memory
  alone too, and far beyond its estimate (an over-allocation of the kernel's);
- ``oom_sticky``: on 1 x 769, the first time in a run, an out-of-memory that leaves the CUDA
  context unusable (simulated as faulty_backends' sticky error is): its worker dies, the check
  runs again alone in a new worker, and passes;
- ``oom_sticky_always``: the same on 1025 x 769, every time: charged as out of memory, never failed.

"First time in a run" is kept in files under ``$OOM_MARKERS`` (a new worker is a new process).
"""
import os
from pathlib import Path

import torch

from harness.running import isolation
from tests.plugins.rms_base import FaultableRMSNorm
from impls.registry import register

_sticky = False
_real_probe = isolation.broken_context


def _probe(device):
    return "CUDA error: out of memory (simulated)" if _sticky else _real_probe(device)


isolation.broken_context = _probe


def first_time(name: str) -> bool:
    marker = Path(os.environ["OOM_MARKERS"]) / name
    if marker.exists():
        return False
    marker.touch()
    return True


def raise_oom(gib: float) -> None:
    raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {gib:.2f} GiB. GPU 0 has a total "
                                 "capacity of 79.19 GiB of which 1.25 GiB is free. (simulated)")


_Oom = FaultableRMSNorm


@register
class Once(_Oom):
    backend = "oom_once"

    def fault(self, m, n):
        if (m, n) == (17, 769) and first_time(self.backend):
            raise_oom(1.5)


@register
class Always(_Oom):
    backend = "oom_always"

    def fault(self, m, n):
        if (m, n) == (3, 769):
            raise_oom(64)


@register
class Sticky(_Oom):
    backend = "oom_sticky"
    shape, once = (1, 769), True

    def fault(self, m, n):
        global _sticky
        if (m, n) == self.shape and (not self.once or first_time(self.backend)):
            _sticky = True
            raise RuntimeError("CUDA error: out of memory (simulated)")


@register
class StickyAlways(Sticky):
    backend = "oom_sticky_always"
    shape, once = (1025, 769), False
