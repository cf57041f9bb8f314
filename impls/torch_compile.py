"""The eager math through torch.compile (Inductor), compiled once per shape class.

- LayerNorm compiles torch.native_layer_norm, which Inductor decomposes into its own kernels
  (y, mean, rstd). RMSNorm is written out as F.rms_norm's own math (float32 compute, one rounding
  of y): Inductor keeps aten._fused_rms_norm as a call into the eager kernel, so compiling that op
  would time eager's kernel under this backend's name.
- The graph writes y and the statistics straight into the caller's buffers, so no copy follows it.
- A shape class is (op, dtype, device, rows, N, row strides of x and y, weight/bias present, eps);
  eps is a constant in the generated code, as it is in a model. Each class gets its own compiled
  function with its own code object, so Dynamo's per-function recompile limits never apply across
  classes, and fullgraph=True turns any graph break or limit into an error, never a silent run of
  eager code.
- On CUDA shapes are static. On the CPU the row count is dynamic (one compile per N, not per
  (M, N)): each CPU compile costs about a second, and the quick profile alone has ~220 static
  classes. NORMDIFF_COMPILE_ROWS=static or dynamic overrides that (a GPU run of the full
  profile compiles ~430 static classes, ~240 with dynamic rows). ``note()`` says which mode ran.
- ``prepare(spec)`` compiles and runs a class once, so benchmarks keep compilation out of the
  timed region.
- The backward is what a model compiled with torch.compile trains with: the forward math (y only)
  compiled per shape class, and autograd through it, so AOTAutograd's compiled backward graph
  computes dx, dw and db from the statistics its own compiled forward saved. That forward runs
  again inside each backward call (a compiled graph's saved tensors cannot be handed in), so the
  kernel's ``saved`` statistics are checked by the interface but not read.
"""
from __future__ import annotations

import os
import types
from typing import Callable, ClassVar

import torch

from impls.base import (DEFAULT_EPS, NormGrads, NormKernel, NormOutputs, NormSpec, ReproCall, UnsupportedCase,
                         cuda_present)
from impls.registry import register
from impls.repro_calls import source_of

_PROBES: dict[str, str | None] = {}  # device type -> why Inductor cannot compile there, or None
# While it tunes a new compile on a GPU, Inductor's benchmarker flushes the L2 cache with a buffer
# of the cache's size (50 MiB on an H100): room for an L2 of up to this.
INDUCTOR_FLUSH_BYTES = 128 * 2**20


def _device() -> str:
    return "cuda" if cuda_present() else "cpu"


def dynamic_rows(device: str) -> bool:
    """Whether the row count is a dynamic dimension of the compiled graph on ``device``:
    NORMDIFF_COMPILE_ROWS=static or dynamic decides; by default dynamic on the CPU only."""
    mode = os.environ.get("NORMDIFF_COMPILE_ROWS", "")
    if mode in ("static", "dynamic"):
        return mode == "dynamic"
    return device == "cpu"


def _probe(device: str) -> str | None:
    """Compile and run a tiny reduction once per process: Inductor needs a working C++ compiler
    on the CPU and Triton on the GPU, and only a real compile proves either."""
    if device not in _PROBES:
        try:
            fn = torch.compile(lambda t: (t * t).sum(-1), dynamic=False, fullgraph=True)
            t = torch.arange(8.0, device=device).view(2, 4)
            if not torch.equal(fn(t).cpu(), torch.tensor([14.0, 126.0])):
                raise RuntimeError("the compiled probe returned a wrong result")
            _PROBES[device] = None
        except Exception as exc:  # any failure means this backend cannot run here
            first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
            _PROBES[device] = f"torch.compile (Inductor) cannot compile on {device}: {type(exc).__name__}: {first}"
    return _PROBES[device]


def _rms_norm(x, weight, eps: float, y, rstd):
    xf = x.float()
    r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    yf = xf * r
    if weight is not None:
        yf = yf * weight.float()
    y.copy_(yf)
    rstd.copy_(r.view(-1))


def _layer_norm(x, weight, bias, eps: float, y, mean, rstd):
    yy, m, r = torch.native_layer_norm(x, [x.shape[-1]], weight, bias, eps)
    y.copy_(yy)
    mean.copy_(m.view(-1))
    rstd.copy_(r.view(-1))


def _rms_norm_y(x, weight, bias, eps: float):
    xf = x.float()
    yf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        yf = yf * weight.float()
    return yf.to(x.dtype)


def _layer_norm_y(x, weight, bias, eps: float):
    return torch.native_layer_norm(x, [x.shape[-1]], weight, bias, eps)[0]


def mark_rows(dynamic: bool, *tensors) -> None:
    """The row count a dynamic dimension of the graph (the shape class's rows are None), on every
    tensor given that has rows."""
    if dynamic:
        for t in tensors:
            if t is not None:
                torch._dynamo.maybe_mark_dynamic(t, 0)


def grads_through(fn, x, weight, bias, dy, eps: float, out, dynamic: bool) -> None:
    """dx, dw and db into ``out``: autograd through ``fn``, the compiled forward's y."""
    with torch.enable_grad():
        xl, wl, bl = (None if t is None else t.detach().requires_grad_() for t in (x, weight, bias))
        mark_rows(dynamic, xl)
        leaves = [t for t in (xl, wl, bl) if t is not None]
        grads = iter(torch.autograd.grad(fn(xl, wl, bl, eps), leaves, dy))
    out.dx.copy_(next(grads))
    for t, given in ((out.dw, wl), (out.db, bl)):
        if given is not None:
            g = next(grads)
            if t is not None:
                t.copy_(g)


def _fresh(fn: Callable, tag: str) -> Callable:
    """A copy of ``fn`` with a code object of its own: Dynamo keeps its cache, and counts its
    recompile limits, per code object."""
    code = fn.__code__.replace(co_name=f"{fn.__name__}_{tag}")
    return types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)


class _TorchCompile(NormKernel):
    backend = "torch_compile"
    variant = "inductor"
    # Each shape class compiles C++ on the CPU (a median 1.3 s a check in CI, 700 of its 2300
    # worker-seconds): the quick profile there checks a third of the cases, the full one all.
    quick_cpu_every = 3
    _fn: ClassVar[Callable]

    _y_fn: ClassVar[Callable]  # the forward's y alone, differentiable (the backward's graph)

    def __init__(self):
        self._compiled: dict[tuple, Callable] = {}
        self._compiled_bwd: dict[tuple, Callable] = {}

    def availability(self) -> str | None:
        return _probe(_device())

    def note(self) -> str:
        device = _device()
        rows = "dynamic row count" if dynamic_rows(device) else "static shapes"
        return f"torch {torch.__version__}, Inductor on {device}, {rows}, one compile per shape class"

    def stat_dtype(self, dtype: torch.dtype, device: str) -> torch.dtype:
        # Inductor's LayerNorm decomposition keeps aten's convention: input dtype on the CPU.
        return torch.float32 if device == "cuda" else dtype

    def workspace_bytes(self, spec: NormSpec) -> int:
        """Device bytes a call may allocate beyond its outputs (harness.running.estimate): a y of its own
        and float32 copies of x (the backward's autograd through the compiled forward, the
        tuner's copies of the outputs it writes), and on a GPU Inductor's L2 flush buffer."""
        e = spec.rows * spec.n
        own = e * spec.dtype.itemsize + 2 * 4 * e + 8 * spec.rows
        return own + (INDUCTOR_FLUSH_BYTES if spec.device == "cuda" else 0)

    def compiled_classes(self) -> int:
        """How many shape classes have been compiled in this process."""
        return len(self._compiled)

    def _key(self, x, weight, bias, eps, y) -> tuple:
        m, n = x.shape
        dyn = dynamic_rows(x.device.type)
        rows = (m if m <= 1 else None) if dyn else m  # Dynamo specialises a row count of 0 or 1
        return (self.op, x.dtype, x.device.type, rows, n, x.stride(0), y.stride(0),
                weight is not None, bias is not None, eps)

    def compile_key(self, spec: NormSpec):
        """The shape class _key compiles for (eps aside, which the catalogue rarely varies)."""
        dyn = dynamic_rows(spec.device)
        rows = (spec.rows if spec.rows <= 1 else None) if dyn else spec.rows
        return (self.op, spec.dtype, spec.device, rows, spec.n, spec.row_stride, spec.has_weight, spec.has_bias)

    def _args(self, x, weight, bias, eps, out: NormOutputs) -> tuple:
        """The compiled function's arguments, in its order."""
        raise NotImplementedError

    def _bound(self, x, weight, bias, eps, out: NormOutputs) -> Callable[[], None]:
        key = self._key(x, weight, bias, eps, out.y)
        fn = self._compiled.get(key)
        if fn is None:
            fn = torch.compile(_fresh(type(self)._fn, f"c{len(self._compiled)}"), dynamic=False, fullgraph=True)
            self._compiled[key] = fn
        mark_rows(key[3] is None, x, out.y, out.mean, out.rstd)
        args = self._args(x, weight, bias, eps, out)
        return lambda: fn(*args)

    def _forward(self, x, weight, bias, eps, out: NormOutputs) -> None:
        self._bound(x, weight, bias, eps, out)()

    def _backward(self, x, weight, bias, dy, saved: NormOutputs, eps, out: NormGrads) -> None:
        key = self._key(x, weight, bias, eps, x)
        fn = self._compiled_bwd.get(key)
        if fn is None:
            fn = torch.compile(_fresh(type(self)._y_fn, f"b{len(self._compiled_bwd)}"), dynamic=False, fullgraph=True)
            self._compiled_bwd[key] = fn
        grads_through(fn, x, weight, bias, dy, eps, out, key[3] is None)

    def repro_call(self) -> ReproCall:
        """The same functions compiled the same way, one shape class (its rows dynamic where _key's are)."""
        fn, y_fn = type(self)._fn, type(self)._y_fn
        dynamic = "x.shape[0] > 1 and dynamic_rows(x.device.type)"
        return ReproCall(
            imports="", source=source_of(dynamic_rows, mark_rows, grads_through, fn, y_fn),
            forward=(f"mark_rows({dynamic}, x, out.y, out.mean, out.rstd)\n"
                     f"torch.compile({fn.__name__}, dynamic=False, fullgraph=True)({self.repro_args})"),
            backward=(f"grads_through(torch.compile({y_fn.__name__}, dynamic=False, fullgraph=True), x, weight, bias, "
                      f"dy, eps, out,\n              {dynamic})"))

    def bench_callable(self, x, weight, bias, eps, out):
        # Run once here, so a class that prepare() did not cover still compiles outside the timing.
        call = self._bound(x, weight, bias, eps, out)
        call()
        return call

    def user_call(self, x, weight, bias, eps):
        call = self._bound(x, weight, bias, eps, self.allocate(x))
        call()  # compiles outside any timing
        return "the torch.compile'd function (fullgraph, static shapes) on x, writing into given outputs", call

    def prepare(self, spec: NormSpec, eps: float | None = None) -> None:
        """Compile ``spec``'s shape class and run it once (outputs go to fresh buffers)."""
        reason = self.unsupported(spec)
        if reason:
            raise UnsupportedCase(reason)
        if spec.rows == 0:
            return
        stride = max(spec.row_stride, spec.n)
        storage = torch.zeros(spec.rows, stride, dtype=spec.dtype, device=spec.device)
        x = storage[:, : spec.n]
        weight = torch.ones(spec.n, dtype=spec.dtype, device=spec.device) if spec.has_weight else None
        bias = torch.zeros(spec.n, dtype=spec.dtype, device=spec.device) if spec.has_bias else None
        self(x, weight, bias, DEFAULT_EPS[self.op] if eps is None else eps)


@register
class CompiledRMSNorm(_TorchCompile):
    op = "rms_norm"
    outputs = ("y", "rstd")
    _fn = staticmethod(_rms_norm)
    _y_fn = staticmethod(_rms_norm_y)

    def stat_dtype(self, dtype, device):
        return torch.float32

    # Reproduced with torch 2.13 on the CPU (dynamic rows): Inductor's sum of squares drifts on
    # a long constant float32 row (every rounding of its running sums goes the same way, about
    # N * u), by a margin that depends on the code it generates for the machine and on the thread
    # count, so the declaration may pass (known_issue_may_pass; the machines it was seen on:
    # docs/checks.md, *Found by it*). Declared from DRIFT_MIN_N: at N = 32764 y errs by about its
    # allowance, and the drift shrinks with N (the 4096-long constant rows pass).
    DRIFT_MIN_N = 16384

    def _drifts(self, case, device) -> bool:
        """y of a forward case on the CPU: float32 constant rows of at least DRIFT_MIN_N."""
        return (device == "cpu" and case.dy_dist is None and case.dtype == "float32" and case.dist == "constant"
                and case.n >= self.DRIFT_MIN_N)

    def known_issue(self, case, device, inputs=None):
        if self._drifts(case, device):
            return ("Inductor's CPU sum of squares drifts on a long constant float32 row on some machines "
                    "and thread counts: y errs by 103 ulps (1.05x the allowance) at N = 32764 where eager errs by 0.6")
        return None

    def known_issue_may_pass(self, case, device, inputs=None):
        return self._drifts(case, device)

    def _args(self, x, weight, bias, eps, out):
        return (x, weight, eps, out.y, out.rstd)

    repro_args = "x, weight, eps, out.y, out.rstd"  # _args, in a repro


@register
class CompiledLayerNorm(_TorchCompile):
    op = "layer_norm"
    outputs = ("y", "mean", "rstd")
    _fn = staticmethod(_layer_norm)
    _y_fn = staticmethod(_layer_norm_y)

    def _args(self, x, weight, bias, eps, out):
        return (x, weight, bias, eps, out.y, out.mean, out.rstd)

    repro_args = "x, weight, bias, eps, out.y, out.mean, out.rstd"  # _args, in a repro
