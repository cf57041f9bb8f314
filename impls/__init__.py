"""normdiff's operators: one common interface (impls.base), one module per backend."""
from impls.base import NormInputError, NormKernel, NormOutputs, NormSpec, UnsupportedCase

__all__ = ["NormInputError", "NormKernel", "NormOutputs", "NormSpec", "UnsupportedCase"]
