"""normdiff's kernels for use in models: RMSNorm and LayerNorm over the last dimension, forward
and backward, as functions (custom ops, usable under torch.compile), autograd Functions and
nn.Modules. ``kernel="auto"`` runs triton.invariant where Triton runs (on the CPU under its
interpreter: slow, for tests), else eager PyTorch; any registered "backend.variant" with a
backward can be named; ``kernel_name(op, kernel)`` says which one a call runs here. The fused ops
``add_rms_norm`` / ``add_layer_norm`` (x + residual, then the norm; new outputs or in place; Gemma's
weight offset; an fp8 output) run triton.fused, else torch.fused."""
from normdiff._kernels import KernelFallbackWarning, kernel_name
from normdiff.functions import AddLayerNormFunction, AddRMSNormFunction, LayerNormFunction, RMSNormFunction
from normdiff.fused_ops import add_layer_norm, add_rms_norm
from normdiff.modules import FusedAddLayerNorm, FusedAddRMSNorm, LayerNorm, RMSNorm
from normdiff.ops import layer_norm, rms_norm

__all__ = ["rms_norm", "layer_norm", "RMSNorm", "LayerNorm", "RMSNormFunction", "LayerNormFunction",
           "kernel_name", "KernelFallbackWarning", "add_rms_norm", "add_layer_norm", "FusedAddRMSNorm",
           "FusedAddLayerNorm", "AddRMSNormFunction", "AddLayerNormFunction"]
