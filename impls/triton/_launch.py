"""How the Triton kernels run: loading triton, the run mode, and the launch (the settings come
from settings.py, the split variant's workspace from _split.py).

triton is imported only on first use (availability, note or a call), and never at import of
the backend, so a process without triton still lists the kernels, each skipped with the reason.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from impls import fastpath, pdl
from impls.base import DEFAULT_EPS, NormKernel
from impls.gpu_limits import cdiv, next_pow2
from impls.repro_calls import through_normdiff
from impls.triton import settings
from impls.triton._fast import lean_plan
from impls.triton._runtime import DEVICES, note, state  # noqa: F401  (state: read through here too)
from impls.triton.backward import TritonBackward
from impls.triton.settings import DECODE_MAX_ROWS, DECODE_MIN_BLOCK, ROWWISE_MAX_N, LaunchConfig, launch_config


def split_unavailable() -> str | None:
    """Why the split kernels cannot run in this process, else None."""
    if state().reason:
        return state().reason
    if state().interpreted:
        return "triton.split's programs wait on each other, and Triton's interpreter runs programs one at a time"
    return None


@dataclass(frozen=True)
class Launch:
    """One kernel launch a call makes: the @triton.jit function, its arguments and setting."""

    kernel_name: str
    fn: object
    args: tuple
    kwargs: dict
    cfg: LaunchConfig
    grid: tuple


class TritonKernel(TritonBackward, NormKernel):
    backend = "triton"
    project = True
    repro_call = through_normdiff  # a repro calls normdiff's own kernel through normdiff (impls.repro_calls)
    packages = ("triton",)
    devices = DEVICES
    kernel_module = None  # where launch() finds kernels by name: impls.triton._kernels, or a probe's candidates

    def availability(self) -> str | None:
        return state().reason

    def note(self) -> str:
        return note()

    def bench_unavailable(self) -> str | None:
        if state().interpreted:
            return "triton runs under its interpreter on this machine: not a timing"
        return None

    def compile_key(self, spec, cfg: LaunchConfig | None = None):
        """What a call with launch setting ``cfg`` (default: this kernel's own for spec) compiles."""
        if state().interpreted or spec.device != "cuda":
            return None  # the interpreter compiles nothing
        # The JIT specialises on the launch setting, N, the affine flags, and integers equal to
        # one or divisible by 16 (the row count and stride).
        return (self.variant, spec.dtype, spec.n, cfg or self.config(spec.n, spec.dtype, spec.rows),
                spec.has_weight, spec.has_bias, spec.rows == 1, spec.row_stride % 16 == 0)

    def config(self, n: int, dtype: torch.dtype, m: int | None = None) -> LaunchConfig:
        return launch_config(n, dtype, looped=self.variant == "looped", op=self.op, m=m)

    # The looped kernels' setting depends on N and dtype alone, and each row is reduced on its own.
    batch_invariant = True

    _recorded: list | None = None
    # Whether the host fast path may replay this variant's launch as recorded (impls.triton._fast).
    lean_launch = True
    # Users call the dispatch entry points (triton.auto, triton.invariant), which run the variants.
    entry_point = False

    def launch_hooks(self):
        """Triton's runtime knobs: a launch hook set there (a profiler) must see every launch."""
        return state().triton.knobs.runtime

    def fast_plan(self, x, x2, weight, bias, spec, cfg: LaunchConfig | None = None):
        """The host fast path (impls.fastpath): the recorded launch replayed through the compiled
        kernel's launcher on a GPU, else the validated call's planning skipped."""
        if self.lean_launch and spec.device == "cuda" and not state().interpreted:
            plan = lean_plan(self, x, x2, weight, bias, cfg)
            if plan is not None:
                return plan
        forward = functools.partial(self._forward, cfg=cfg) if cfg is not None else self._forward
        return fastpath.generic_plan(x, x2, self.outputs, forward)

    def launches(self, x: torch.Tensor, weight=None, bias=None, eps: float | None = None,
                 cfg: LaunchConfig | None = None, out=None) -> list[Launch]:
        """What a call on these 2-D rows would launch (with launch setting ``cfg``, default the
        kernel's own; into ``out``, default fresh outputs), without running anything: for tools
        that compile the kernels offline (tools.triton_resources) and for the host fast path. The
        tensors are never read."""
        self._recorded = []
        try:
            self._forward(x, weight, bias, DEFAULT_EPS[self.op] if eps is None else eps, out or self.allocate(x), cfg)
            return self._recorded
        finally:
            del self._recorded

    def _meta(self, cfg: LaunchConfig) -> dict:
        """Compile-time arguments this variant's kernel takes beyond BLOCK_N and ROUND_BF16."""
        return {"ROWS": cfg.rows}

    def run(self, x: torch.Tensor, cfg: LaunchConfig, tensors: tuple, scalars: tuple, **meta) -> None:
        """Run this variant's kernel on x's rows; its arguments are ``tensors`` then ``scalars``
        (M, N, strides, eps), as both ops' kernels take them."""
        self.launch(self._kernel_name, x, cfg, *tensors, *scalars, **meta)

    def launch_kwargs(self, x: torch.Tensor, cfg: LaunchConfig, **meta) -> dict:
        """The keyword arguments of a launch: compile-time arguments and compile options."""
        kwargs = dict(BLOCK_N=cfg.block_n, num_warps=cfg.num_warps,
                      ROUND_BF16=state().interpreted and x.dtype == torch.bfloat16, **self._meta(cfg), **meta)
        if cfg.maxnreg and not state().interpreted:
            kwargs["maxnreg"] = cfg.maxnreg
        return kwargs

    def launch(self, kernel_name: str, x: torch.Tensor, cfg: LaunchConfig, *args, grid=None, compile_only=False,
               **meta):
        """Run the kernel on x's device over ``grid``, by default one program per cfg.rows rows.
        Returns the kernel as Triton compiled it (compile_only: without running it)."""
        fn = getattr(self.kernel_module or state().kernels, kernel_name)
        kwargs = self.launch_kwargs(x, cfg, **meta)
        grid = grid or (cdiv(x.shape[0], cfg.rows),)
        if self._recorded is not None:
            self._recorded.append(Launch(kernel_name, fn, args, kwargs, cfg, grid))
            return None
        if compile_only:
            return fn.warmup(*args, grid=grid, **kwargs)
        if x.device.type == "cuda":
            with torch.cuda.device(x.device):
                return fn[grid](*args, **kwargs)
        return fn[grid](*args, **kwargs)


class RowwiseKernel(TritonKernel):
    """The rowwise variant: the whole row in one tile, so N is bounded; its kernels take W_FIRST
    (the decode rule's weight-with-x load). Where the launch setting says ``one_row`` (decode, and
    ROWWISE_ONE_ROW) it runs the 1-D form of its kernel (``_row_kernel_name``: the row's offset a
    scalar, no row mask, statistics stored before y; docs/perf-notes.md, item 26)."""

    variant = "rowwise"
    max_n = ROWWISE_MAX_N
    _row_kernel_name: str
    # Few rows take the decode setting (another form and warp count, so another reduction order).
    batch_invariant = False

    def m_thresholds(self, spec) -> tuple[int, ...]:
        return (DECODE_MAX_ROWS,) if next_pow2(spec.n) >= DECODE_MIN_BLOCK else ()

    # At few rows (latency, not bandwidth) the rowwise kernels launch with programmatic dependent
    # launch where it runs (impls.pdl).
    pdl = True
    pdl_max_rows = DECODE_MAX_ROWS

    def _meta(self, cfg: LaunchConfig) -> dict:
        rows = {} if cfg.one_row else super()._meta(cfg)
        return {**rows, "W_FIRST": cfg.w_first}

    def launch_kwargs(self, x: torch.Tensor, cfg: LaunchConfig, **meta) -> dict:
        kwargs = super().launch_kwargs(x, cfg, **meta)
        if self.launches_pdl(x.device, x.shape[0]):
            kwargs.update(PDL=True, launch_pdl=True)
        return kwargs

    def compile_key(self, spec, cfg: LaunchConfig | None = None):
        key = super().compile_key(spec, cfg)
        return None if key is None else key + (self.launches_pdl(spec.device, spec.rows),)

    def run(self, x: torch.Tensor, cfg: LaunchConfig, tensors: tuple, scalars: tuple, **meta) -> None:
        name = self._row_kernel_name if cfg.one_row else self._kernel_name
        self.launch(name, x, cfg, *tensors, *scalars, **meta)


def choose_variant(op: str, n: int, dtype: torch.dtype, m: int | None = None) -> str:
    """The Triton variant the dispatch functions run for M rows of N elements of ``dtype``
    (settings.choose_variant, with split only where it can run in this process)."""
    return settings.choose_variant(op, n, dtype, m, split_runs=split_unavailable() is None)
