"""The split variant: each row over SPLITS programs that exchange partial statistics through a
workspace in global memory, over a persistent grid sized from the compiled kernel's resources.
Rows of at least SPLIT_LAG_MIN_N columns run the lagged kernels (_split_kernels.*_split_lag: row i's
partial published before row i - 1 is stored, so the wait for the siblings is off the critical
path)."""
from __future__ import annotations

import torch

from impls.gpu_limits import SM_MAX_BLOCKS, SM_REGISTERS, SM_SHARED, SM_THREADS, blocks_per_sm, cdiv, next_pow2
from impls.triton._launch import TritonKernel, split_unavailable
from impls.triton.settings import SPLIT_LAG_MIN_N, SPLIT_MAX, SPLIT_MAX_BLOCK, LaunchConfig, split_config


class SplitRowsKernel(TritonKernel):
    """The split variant: each row over SPLITS programs that exchange partial statistics (see
    _split_kernels.rms_norm_split). GPU only, and every program of a row must be resident at once, so
    the grid is persistent: as many groups of SPLITS programs as the GPU holds, counted from the
    compiled kernel's registers, threads and shared memory."""

    variant = "split"
    max_n = SPLIT_MAX * SPLIT_MAX_BLOCK
    lean_launch = False  # the workspace follows the stream and CUDA-graph capture: planned per call

    def availability(self) -> str | None:
        return split_unavailable()

    def config(self, n: int, dtype: torch.dtype, m: int | None = None) -> LaunchConfig:
        return split_config(n, dtype, self.op)

    def unsupported(self, spec) -> str | None:
        reason = super().unsupported(spec)
        if reason is None and spec.device == "cuda":
            splits = cdiv(spec.n, self.config(spec.n, spec.dtype).block_n)
            sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
            if splits > sms:
                reason = (f"N={spec.n} splits over {splits} programs that must be resident at once; "
                          f"this GPU has {sms} SMs")
        return reason

    def _meta(self, cfg: LaunchConfig) -> dict:
        return {}  # SPLITS comes from the call, which knows N

    def kernel_name(self, n: int) -> str:
        return self._kernel_name + ("_lag" if n >= SPLIT_LAG_MIN_N else "")

    def lag_meta(self, cfg: LaunchConfig) -> dict:
        """The lagged kernels' load choices (settings.split_config): compile-time arguments."""
        return dict(HOLD_W=cfg.hold_w, X_CACHE=cfg.x_cache, W_EVICT=cfg.w_evict, NEXT_FIRST=cfg.next_first)

    def run(self, x: torch.Tensor, cfg: LaunchConfig, tensors: tuple, scalars: tuple, **meta) -> None:
        """As TritonKernel.run, with the workspace between ``tensors`` and ``scalars`` and the
        group count after them, over a persistent grid of groups x SPLITS programs."""
        m, n = x.shape
        splits = cdiv(n, cfg.block_n)
        name = self.kernel_name(n)
        meta.update(SPLITS=splits, SPLITS_P2=next_pow2(splits))
        if name != self._kernel_name:
            meta.update(self.lag_meta(cfg))
        words, done = _split_workspace(x.device)
        key = (name, x.device, x.dtype, n, cfg, tuple(sorted(meta.items())))
        resident = _RESIDENT_PROGRAMS.get(key)
        if resident is None:  # compile once (GROUPS is not specialised on, so any value serves)
            compiled = self.launch(name, x, cfg, *tensors, words, done, *scalars, 1,
                                   grid=(1,), compile_only=True, **meta)
            sms = torch.cuda.get_device_properties(x.device).multi_processor_count
            resident = _RESIDENT_PROGRAMS[key] = sms * programs_per_sm(compiled, x.device)
        groups = max(1, min(m, resident // splits))
        self.launch(name, x, cfg, *tensors, words, done, *scalars, groups, grid=(groups * splits,), **meta)


# Programs of one compiled split kernel the whole GPU holds at once, by launch key.
_RESIDENT_PROGRAMS: dict = {}
_WORKSPACE: dict = {}
# Workspaces made during CUDA graph capture: the graph zeroes them at each replay, so they must
# live as long as it does; one small pair per capture.
_CAPTURED: list = []


# Exchange words per program: 2 per row slot, 2 row slots (rms_norm_split) or 4 (the lagged kernels).
SPLIT_WORDS = 8


def _split_workspace(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The split kernels' exchange words (SPLIT_WORDS per program) and per-group DONE counters,
    one set per device and stream, so launches on different streams cannot meet. Made zero; every
    launch leaves the words it used zero."""
    def make():
        programs = torch.cuda.get_device_properties(device).multi_processor_count * SM_MAX_BLOCKS  # the most in flight
        return (torch.zeros(SPLIT_WORDS * programs, dtype=torch.int64, device=device),
                torch.zeros(programs, dtype=torch.int32, device=device))

    if torch.cuda.is_current_stream_capturing():
        ws = make()
        _CAPTURED.append(ws)
        return ws
    key = (device, torch.cuda.current_stream(device).cuda_stream)
    if key not in _WORKSPACE:
        _WORKSPACE[key] = make()
    return _WORKSPACE[key]


def programs_per_sm(compiled, device: torch.device) -> int:
    """How many programs of a compiled Triton kernel one SM of ``device`` holds at once."""
    if hasattr(compiled, "_init_handles"):
        compiled._init_handles()
    props = torch.cuda.get_device_properties(device)
    return blocks_per_sm(compiled.n_regs, compiled.metadata.num_warps, compiled.metadata.shared,
                         getattr(props, "regs_per_multiprocessor", SM_REGISTERS),
                         getattr(props, "max_threads_per_multi_processor", SM_THREADS),
                         getattr(props, "shared_memory_per_multiprocessor", SM_SHARED))
