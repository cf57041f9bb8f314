"""An outside backend that under-declares its workspace (``--backend greedy``): it declares none,
so its checks are admitted beside others, and on 17 x 769 it asks for ``GREEDY_WORKSPACE`` bytes
(default 64 GiB) through torch, on the device its inputs are on: more than a simulated card of
``--simulate-gpu`` (or most real ones) holds. The check runs out of memory, is retried alone, runs
out again and is counted *out of memory*; every other case computes a correct RMSNorm."""
import os

import torch

from impls.registry import register
from tests.plugins.rms_base import FaultableRMSNorm


@register
class Greedy(FaultableRMSNorm):
    backend = "greedy"

    def fault(self, m, n):
        if (m, n) == (17, 769):
            workspace = torch.empty(int(os.environ.get("GREEDY_WORKSPACE", 64 << 30)), dtype=torch.uint8)
            del workspace
