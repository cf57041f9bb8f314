"""The base of the test plug-ins' outside backends (faulty_backends, oom_backends): a correct
RMSNorm on the CPU that first calls ``fault(m, n)``, where each backend fails its own way."""
import torch

from impls.base import NormKernel


class FaultableRMSNorm(NormKernel):
    op = "rms_norm"
    outputs = ("y", "rstd")
    variant = "v1"
    devices = ("cpu",)

    def fault(self, m, n):
        raise NotImplementedError

    def _forward(self, x, weight, bias, eps, out):
        self.fault(x.shape[0], x.shape[1])
        rstd = torch.rsqrt(x.float().pow(2).mean(-1) + eps)
        y = x.float() * rstd[:, None]
        out.y.copy_(y if weight is None else y * weight.float())
        out.rstd.copy_(rstd)
