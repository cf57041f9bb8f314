"""normdiff's kernels for use in models: RMSNorm and LayerNorm over the last dimension, forward
and backward, as functions (custom ops, usable under torch.compile), autograd Functions and
nn.Modules. ``kernel="auto"`` runs triton.invariant where Triton runs (on the CPU under its
interpreter: slow, for tests), else eager PyTorch; any registered "backend.variant" with a
backward can be named; ``kernel_name(op, kernel)`` says which one a call runs here."""
from normdiff._kernels import KernelFallbackWarning, kernel_name
from normdiff.functions import LayerNormFunction, RMSNormFunction
from normdiff.modules import LayerNorm, RMSNorm
from normdiff.ops import layer_norm, rms_norm

__all__ = ["rms_norm", "layer_norm", "RMSNorm", "LayerNorm", "RMSNormFunction", "LayerNormFunction",
           "kernel_name", "KernelFallbackWarning"]
