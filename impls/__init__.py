"""normdiff's operators: one common interface (impls.base), its call path (impls.callpath), one
module per backend."""
from impls.base import NormInputError, NormKernel, NormOutputs, NormSpec, UnsupportedCase
from impls import callpath  # noqa: F401  (installs the call path: warm calls skip validation)

__all__ = ["NormInputError", "NormKernel", "NormOutputs", "NormSpec", "UnsupportedCase"]
