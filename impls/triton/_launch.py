"""What the Triton kernels share: loading triton, the run mode, launch settings and the launch.

triton is imported only on first use (availability, note or a call), and never at import of
the backend, so a process without triton still lists the kernels, each skipped with the reason.
"""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from functools import lru_cache

import torch

from impls.base import NormKernel, cuda_present

# Largest N the rowwise kernels hold in one tile; the looped ones take any N.
ROWWISE_MAX_N = 65536
# Elements of one [ROWS, BLOCK_N] tile to aim for: about 16 KiB of float32 accumulators.
TILE_ELEMS = 4096
# Cap on rows per program, so tiny N still leaves several programs for moderate M.
MAX_ROWS = 64
# Bytes of x one looped chunk reads: 4096 float32 or 8192 float16/bfloat16 elements.
CHUNK_BYTES = 16384
# Threads of a program hold this many float32 working values each (the compute is float32
# whatever x's dtype); 32 warps at most (1024 threads).
PER_THREAD = 16
MAX_WARPS = 32


def interpret_requested() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


# Kernels run on CPU tensors under the interpreter, on CUDA tensors when compiled.
DEVICES: tuple[str, ...] = ("cuda",) if cuda_present() and not interpret_requested() else ("cpu",)


@dataclass(frozen=True)
class LaunchConfig:
    block_n: int  # columns per tile: the whole row (rowwise) or one chunk (looped)
    rows: int  # rows per program
    num_warps: int


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def launch_config(n: int, dtype: torch.dtype, looped: bool) -> LaunchConfig:
    """Launch settings from (N, dtype) alone; no autotuning.

    - BLOCK_N: next power of two >= N for rowwise; for looped ``looped_block``: at most one
      chunk of CHUNK_BYTES of x (4096 float32 / 8192 16-bit elements), little padding.
    - rows per program: TILE_ELEMS // BLOCK_N, clamped to [1, MAX_ROWS], so short rows share a
      program (fewer, fuller programs on the GPU, and far fewer Python steps in the interpreter).
    - num_warps: enough 32-thread warps for PER_THREAD (16) tile elements per thread, rounded
      down to a power of two in [1, MAX_WARPS]; e.g. 8 for a 4096-element tile, 32 for N=65536
      (64 per thread: ptxas for sm_90 still spills a little for N >= 32768, far less than at 16).
    """
    itemsize = dtype.itemsize
    block_n = looped_block(n, itemsize) if looped else next_pow2(n)
    rows = max(1, min(MAX_ROWS, TILE_ELEMS // block_n))
    warps = max(1, (rows * block_n) // (32 * PER_THREAD))
    warps = min(MAX_WARPS, 1 << (warps.bit_length() - 1))
    return LaunchConfig(block_n=block_n, rows=rows, num_warps=warps)


def looped_block(n: int, itemsize: int) -> int:
    """Chunk width of the looped kernels: the widest power of two of at most CHUNK_BYTES of x
    whose chunks cover N with under 1/16 of padding (5120 -> 1024 x 5, 12288 -> 4096 x 3); masked
    lanes load nothing but still hold threads."""
    block_n = min(next_pow2(n), CHUNK_BYTES // itemsize)
    while block_n > 1024 and cdiv(n, block_n) * block_n - n > n // 16:
        block_n //= 2
    return block_n


def choose_variant(n: int) -> str:
    """rowwise while one tile holds the row, looped beyond."""
    return "rowwise" if n <= ROWWISE_MAX_N else "looped"


@dataclass(frozen=True)
class TritonState:
    triton: object | None  # the module, when importable
    kernels: object | None  # impls.triton._kernels, when it loaded
    interpreted: bool
    reason: str | None  # why the backend cannot run here, else None


@lru_cache(maxsize=1)
def state() -> TritonState:
    try:
        triton = importlib.import_module("triton")
    except Exception as exc:
        return TritonState(None, None, False, f"triton not importable: {type(exc).__name__}: {exc}")
    try:
        kernels = importlib.import_module("impls.triton._kernels")
    except Exception as exc:
        return TritonState(triton, None, False, f"triton kernels failed to load: {type(exc).__name__}: {exc}")
    # The mode is fixed when the kernels are decorated; read it from what the decorator returned.
    interpreted = type(kernels.rms_norm_rowwise).__name__ == "InterpretedFunction"
    reason = None
    if not interpreted and not cuda_present():
        reason = (
            "no CUDA device, and triton was imported before impls.triton without TRITON_INTERPRET=1, "
            "so the kernels cannot run; set TRITON_INTERPRET=1 before triton is first imported"
        )
    elif interpreted != ("cpu" in DEVICES):
        reason = "TRITON_INTERPRET changed between importing impls.triton and loading its kernels"
    return TritonState(triton, kernels, interpreted, reason)


def note() -> str:
    s = state()
    if s.triton is None:
        return s.reason or ""
    version = f"triton {getattr(s.triton, '__version__', '?')}"
    if s.interpreted:
        why = "TRITON_INTERPRET=1" if cuda_present() else "no GPU"
        return f"{version}, running under the interpreter ({why})"
    if cuda_present():
        return f"{version} on {torch.cuda.get_device_name()}"
    return version


class TritonKernel(NormKernel):
    backend = "triton"
    devices = DEVICES

    def availability(self) -> str | None:
        return state().reason

    def note(self) -> str:
        return note()

    def bench_unavailable(self) -> str | None:
        if state().interpreted:
            return "triton runs under its interpreter on this machine: not a timing"
        return None

    def config(self, n: int, dtype: torch.dtype) -> LaunchConfig:
        return launch_config(n, dtype, looped=self.variant == "looped")

    def launch(self, kernel_name: str, x: torch.Tensor, cfg: LaunchConfig, *args, **meta) -> None:
        """Run one program per cfg.rows rows, on x's device."""
        fn = getattr(state().kernels, kernel_name)
        grid = (cdiv(x.shape[0], cfg.rows),)
        interpreted = state().interpreted
        kwargs = dict(ROWS=cfg.rows, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps,
                      ROUND_BF16=interpreted and x.dtype == torch.bfloat16, **meta)
        if self.variant == "looped":
            # The interpreter needs the loop bound as a Python int (see _kernels); compiled: None.
            kwargs["LOOP_CHUNKS"] = cdiv(x.shape[1], cfg.block_n) if interpreted else None
        if x.device.type == "cuda":
            with torch.cuda.device(x.device):
                fn[grid](*args, **kwargs)
        else:
            fn[grid](*args, **kwargs)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)
