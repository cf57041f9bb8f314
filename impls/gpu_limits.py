"""GPU arithmetic the compiled backends share: integer helpers and what one SM holds."""
from __future__ import annotations

# One SM of sm_90 (H100, H200): 32-bit registers, resident threads, shared memory in bytes.
SM_REGISTERS, SM_THREADS, SM_SHARED = 65536, 2048, 233472
# Programs (blocks) one SM holds at most, whatever their size.
SM_MAX_BLOCKS = 32


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(0, (n - 1).bit_length())


def blocks_per_sm(registers: int, warps: int, shared: int = 0, sm_registers: int = SM_REGISTERS,
                  sm_threads: int = SM_THREADS, sm_shared: int = SM_SHARED) -> int:
    """How many programs (blocks) of ``warps`` warps one SM holds at once, at ``registers`` a
    thread and ``shared`` bytes of shared memory a block; at least 1, at most SM_MAX_BLOCKS."""
    regs_per_warp = cdiv(max(registers, 1) * 32, 256) * 256  # allocated in units of 256
    by_regs = sm_registers // regs_per_warp // warps
    by_threads = sm_threads // (32 * warps)
    by_shared = sm_shared // (shared + 1024)  # the driver reserves 1 KiB per block
    return max(1, min(SM_MAX_BLOCKS, by_regs, by_threads, by_shared))
