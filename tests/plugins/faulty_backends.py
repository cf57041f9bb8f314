"""Outside backends that fail the way broken GPU kernels do, each on one catalogue case only
(RMSNorm, bfloat16, quick profile), and compute a correct RMSNorm everywhere else:

- ``faulty_segv``: a segmentation fault on 3 x 769;
- ``faulty_hang``: a call that never returns on 17 x 769;
- ``faulty_raise``: an exception on 1025 x 769;
- ``faulty_sticky``: what a sticky CUDA error looks like on 1 x 769 (the call raises and the
  context probe then fails, as after an illegal address; simulated, so it runs on a CPU);
- ``faulty_late``: returns a correct result on 1025 x 769 but leaves a sticky error that only
  a later synchronize finds (an asynchronous fault; simulated);
- ``faulty_compile``: its first call per N compiles for 8 s (longer than a short --check-timeout:
  compilation is not a hang);
- ``faulty_drawn``: a segmentation fault on any shape the catalogue does not have (drawn cases);
- ``faulty_always``: a segmentation fault on every call (the crash limit).
"""
import ctypes
import os
import time


from harness.running import isolation
from harness.judging.cases import catalogue
from tests.plugins.rms_base import FaultableRMSNorm
from impls.registry import register

CATALOGUE_SHAPES = {(c.shape[0] if len(c.shape) == 2 else c.shape[0] * c.shape[1], c.shape[-1])
                    for c in catalogue("quick")}


def segfault():
    ctypes.string_at(0)  # reads address 0: SIGSEGV


_sticky = False  # set once the simulated sticky error happened in this process
_late = False  # set once faulty_late left its error behind in this process
_real_probe = isolation.broken_context


def _probe(device):
    if _late:
        return "CUDA error: an illegal instruction was encountered (simulated, found after the call)"
    return "CUDA error: an illegal memory access was encountered (simulated)" if _sticky else _real_probe(device)


isolation.broken_context = _probe


_Faulty = FaultableRMSNorm


@register
class Segv(_Faulty):
    backend = "faulty_segv"

    def fault(self, m, n):
        if (m, n) == (3, 769):
            segfault()


@register
class Hang(_Faulty):
    backend = "faulty_hang"

    def fault(self, m, n):
        if (m, n) == (17, 769):
            while True:
                time.sleep(1)


@register
class Raise(_Faulty):
    backend = "faulty_raise"

    def fault(self, m, n):
        if (m, n) == (1025, 769):
            raise RuntimeError("faulty_raise: launch failed on 1025 x 769")


@register
class Sticky(_Faulty):
    backend = "faulty_sticky"

    def fault(self, m, n):
        global _sticky
        if (m, n) == (1, 769) or _sticky:
            _sticky = True
            raise RuntimeError("CUDA error: an illegal memory access was encountered (simulated)")


@register
class Late(_Faulty):
    backend = "faulty_late"

    def fault(self, m, n):
        global _late
        if (m, n) == (1025, 769):
            _late = True  # the call itself returns normally


@register
class SlowCompile(_Faulty):
    backend = "faulty_compile"
    seconds = float(os.environ.get("FAULTY_COMPILE_S", "8"))

    def __init__(self):
        self.compiled = set()

    def compile_key(self, spec):
        return (spec.n,)

    def fault(self, m, n):
        if n == 769 and n not in self.compiled:
            time.sleep(self.seconds)
        self.compiled.add(n)


@register
class Drawn(_Faulty):
    backend = "faulty_drawn"

    def fault(self, m, n):
        if (m, n) not in CATALOGUE_SHAPES:
            segfault()


@register
class Always(_Faulty):
    backend = "faulty_always"

    def fault(self, m, n):
        segfault()
