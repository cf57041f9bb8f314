"""The Triton kernels by name, as the launcher looks them up (TritonKernel.launch). Imported only
through _launch.state(), once triton is known to import.

- _row_kernels: a row in one program: rowwise (the row in one tile; its 1-D form rms_norm_row,
  layer_norm_row) and looped (the row in chunks);
- _split_kernels: a row over several programs (the split variant), lagged for long rows.
"""
from impls.triton._row_kernels import (layer_norm_looped, layer_norm_row, layer_norm_rowwise,  # noqa: F401
                                       rms_norm_looped, rms_norm_row, rms_norm_rowwise)
from impls.triton._split_kernels import (layer_norm_split, layer_norm_split_lag, rms_norm_split,  # noqa: F401
                                         rms_norm_split_lag)
