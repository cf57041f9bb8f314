"""The standalone calls (``repro_call``, harness.repro) of the project's kernels: eager PyTorch's
through torch's own operators, and normdiff's own kernels through normdiff (the library under test
is the project itself: the registered kernel called with the outputs to fill)."""
from __future__ import annotations

import inspect
import textwrap

from impls.base import ReproCall

TORCH_RMS = ReproCall(imports="", forward="""
y, rstd = torch.ops.aten._fused_rms_norm(x, [x.shape[-1]], weight, eps)
out.y.copy_(y)
out.rstd.copy_(rstd.view(-1))
""", backward="""
with torch.enable_grad():  # autograd of the fused op; it recomputes rstd from x
    leaves = [t.detach().requires_grad_() for t in (x, weight) if t is not None]
    y = torch.ops.aten._fused_rms_norm(leaves[0], [x.shape[-1]], leaves[1] if weight is not None else None, eps)[0]
    grads = torch.autograd.grad(y, leaves, dy)
out.dx.copy_(grads[0])
if out.dw is not None:
    out.dw.copy_(grads[1])
""")

TORCH_LAYER = ReproCall(imports="", forward="""
y, mean, rstd = torch.native_layer_norm(x, [x.shape[-1]], weight, bias, eps)
out.y.copy_(y)
out.mean.copy_(mean.view(-1))
out.rstd.copy_(rstd.view(-1))
""", backward="""
stat = torch.float32 if x.device.type == "cuda" else x.dtype  # the statistics' dtype aten's backward expects
mean, rstd = saved.mean.view(-1, 1).to(stat), saved.rstd.view(-1, 1).to(stat)
dx, dw, db = torch.ops.aten.native_layer_norm_backward(
    dy, x, [x.shape[-1]], mean, rstd, weight, bias, [True, weight is not None, bias is not None])
out.dx.copy_(dx)
if out.dw is not None:
    out.dw.copy_(dw)
if out.db is not None:
    out.db.copy_(db)
""")

_PLAIN = ("KERNEL(x, weight, bias, eps, out=NormOutputs(out.y, out.mean, out.rstd))",
          "KERNEL.backward(x, weight, bias, dy, NormOutputs(saved.y, saved.mean, saved.rstd), eps, "
          "out=NormGrads(out.dx, out.dw, out.db))")
_FUSED = ("KERNEL(x, residual, weight, bias, eps, weight_offset=params.weight_offset, out_dtype=params.out_dtype,\n"
          "       scale=params.scale, write=params.write, out=FusedOutputs(out.y, out.residual_out, out.mean, out.rstd))",
          "KERNEL._backward(src, weight, bias, dy, d_residual_out, FusedOutputs(saved.y, None, saved.mean, saved.rstd),\n"
          "                 eps, weight_offset, FusedGrads(out.dx, out.dresidual, out.dw, out.db))")


def source_of(*objects) -> str:
    """The source of a plug-in's functions (a ``@triton.jit`` kernel's own function), the helpers
    its call makes its layout with, to copy into a repro (ReproCall.source) as they are."""
    return "\n\n\n".join(textwrap.dedent(inspect.getsource(getattr(o, "fn", o))).strip() for o in objects)


def through_normdiff(kernel, note: str = "") -> ReproCall:
    """A kernel of the project: normdiff's registered kernel, called as a user of the project calls
    it; ``note``: why (by default, normdiff is its library)."""
    forward, backward = _FUSED if getattr(kernel, "family", "plain") == "fused" else _PLAIN
    imports = ("from impls import registry  # the library under test: normdiff (pip install -e . in its checkout)\n"
               "from impls.base import NormGrads, NormOutputs\nfrom impls.fused import FusedGrads, FusedOutputs\n\n"
               f"registry.load_builtins()\nKERNEL = registry.get({kernel.op!r}, {kernel.backend!r}, {kernel.variant!r})")
    return ReproCall(imports=imports, forward=forward, backward=backward, requires="pip install -e . in normdiff's checkout",
                     note=note)
