"""The common interface every backend implements.

A kernel is one (op, backend, variant). The base class owns everything that must behave the
same in every backend: the validated call (input validation from impls.inputs, which refuses bad
input with an error that names the problem before any backend code runs; the collapse of
leading dimensions into rows; output allocation and the shape of the returned statistics) and
the declarations the harness reads. A backend only writes ``_forward`` for 2-D rows. What a
warm call skips is the call path's (impls.callpath), the layer above this one.
"""
from __future__ import annotations

import importlib
from typing import ClassVar, Literal

import torch

from impls.inputs import (  # noqa: F401  (the call's types and validation, part of this interface)
    OPS, SUPPORTED_DTYPES, NormGrads, NormInputError, NormOutputs, NormSpec, ReproCall, check_out, dtype_name,
    rows_view, spec_of, validate_inputs,
)

Op = Literal["rms_norm", "layer_norm"]
# eps where a caller gives none: the catalogue, the benchmarks and ahead-of-time compilation.
DEFAULT_EPS = {"rms_norm": 1e-6, "layer_norm": 1e-5}

# What makes a kernel's call path (impls.callpath, the layer above this one, installs it when it
# loads; the impls package loads it): None leaves every call validated.
_call_path_type = None


def install_call_path(factory) -> None:
    """Make ``factory(kernel)`` the owner of each kernel's warm-call caches (impls.callpath)."""
    global _call_path_type
    _call_path_type = factory


def cuda_present() -> bool:
    """Whether a CUDA device is usable here; a broken CUDA install counts as none."""
    try:
        return torch.cuda.is_available()
    except Exception:
        return False


def torch_has_op(name: str) -> bool:
    """Whether this torch has the aten operator ``name`` (a kernel's requires_torch_ops)."""
    return hasattr(torch.ops.aten, name)


class OptionalImport:
    """Modules a backend needs that the project does not install, imported on first use, once.
    ``modules()`` returns them, or None with ``reason`` saying why: ``missing`` where one is not
    installed, with the error added where an installed one fails to load."""

    def __init__(self, *names: str, missing: str):
        self.names, self.missing = names, missing
        self.reason: str | None = None
        self._modules: list | None = None
        self._tried = False

    def modules(self) -> list | None:
        if not self._tried:
            self._tried = True
            try:
                self._modules = [importlib.import_module(n) for n in self.names]
            except Exception as exc:  # missing, or an install that cannot load: either way unusable
                self.reason = self.missing
                if not isinstance(exc, ModuleNotFoundError):
                    self.reason += f" [{type(exc).__name__}: {str(exc).strip()[:200]}]"
        return self._modules


class UnsupportedCase(RuntimeError):
    """Valid input that this particular kernel cannot run (device, dtype, N beyond its capacity)."""


class NormKernel:
    """Base class of every kernel. Subclasses set the class attributes and write ``_forward``."""

    op: ClassVar[str]
    backend: ClassVar[str]
    variant: ClassVar[str] = "default"
    # "plain" (this interface) or "fused" (impls.fused: the residual add, weight offset, fp8 output).
    family: ClassVar[str] = "plain"
    # Which outputs this kernel produces: y always; mean for layer_norm; rstd where exposed.
    outputs: ClassVar[tuple[str, ...]] = ("y",)
    # Devices the kernel runs on, by torch device type.
    devices: ClassVar[tuple[str, ...]] = ("cpu", "cuda")
    # Input dtypes the kernel handles (a subset of SUPPORTED_DTYPES).
    dtypes: ClassVar[tuple[torch.dtype, ...]] = SUPPORTED_DTYPES
    # Largest N the kernel handles; None means no limit.
    max_n: ClassVar[int | None] = None
    # Shortest N it handles (a long-row kernel), and what runs shorter rows instead.
    min_n: ClassVar[int] = 1
    shorter_rows_note: ClassVar[str] = ""
    # How y is rounded: "once" (computed in float32, rounded once to x's dtype), or
    # "before_affine" (x^ rounded to x's dtype before the weight, x^*w again before the bias).
    # The harness allows exactly the extra error the declared contract implies.
    rounding: ClassVar[str] = "once"
    # aten operators the kernel calls, by name (e.g. "_fused_rms_norm"): a torch without one
    # makes the kernel unavailable with that reason, not a crash inside the call.
    requires_torch_ops: ClassVar[tuple[str, ...]] = ()
    # One of normdiff's own kernels (not a peer it is compared with): the benchmark's speed
    # targets apply to the project's kernels, measured against the best of the others.
    project: ClassVar[bool] = False
    # Whether impls.native may record this kernel's launches and replay them from C++. A kernel
    # launched as thread-block clusters (or cooperatively) says why not: cuLaunchKernel carries
    # no launch attributes, and a cluster kernel replayed without its cluster shape faults.
    native_replay: ClassVar[str | None] = None  # None: may be replayed; else the reason it may not
    # Python distributions whose versions a report states for this kernel (e.g. "triton").
    packages: ClassVar[tuple[str, ...]] = ()
    # Why two calls on identical inputs may give different bits (atomics, a reduction order
    # that changes per call), else None: the harness then reports the difference, not a failure.
    nondeterministic: ClassVar[str | None] = None
    # The benchmarks' host-inclusive columns time the call a user makes (``user_call``): for a
    # kernel with its own entry point (``_call``), that entry point, named by ``call_name``.
    call_name: ClassVar[str | None] = None
    # One of the project's entry points users call (the host-cost targets judge these); a variant
    # that users reach through a dispatch entry point sets False.
    entry_point: ClassVar[bool] = True
    # Whether a row's bits are the same whatever else shares the call: True (claimed: a change
    # fails the check), False (known not to be), None (unknown: measured and reported).
    batch_invariant: ClassVar[bool | None] = None
    # The same two claims for the backward, read the same way: batch invariance is dx's (a row's
    # dx bits whatever shares the call; dw and db are sums over the batch), determinism all three
    # (dw and db reduced across programs by atomics, say, are not deterministic).
    backward_nondeterministic: ClassVar[str | None] = None
    backward_batch_invariant: ClassVar[bool | None] = None
    # The quick profile on the CPU (CI) runs this kernel's checks on one case in this many (every
    # check of a case: oracle, backward, properties), the rest skipped with that reason: for a
    # kernel whose every new shape compiles for seconds there. Known issues are always checked;
    # the full profile checks all.
    quick_cpu_every: ClassVar[int] = 1
    # The kernel's call path (impls.callpath), made on its first validated call.
    _calls = None

    @property
    def name(self) -> str:
        return f"{self.backend}.{self.variant}"

    def __repr__(self) -> str:
        return f"<{self.op} kernel {self.name}>"

    # -- capability -------------------------------------------------------------------------
    def availability(self) -> str | None:
        """None when the backend can run in this process, else why not (shown as a skip)."""
        return None

    def note(self) -> str:
        """How the backend runs here, for the report header (e.g. 'interpreter, no GPU')."""
        return ""

    def stat_dtype(self, dtype: torch.dtype, device: str) -> torch.dtype:
        """Precision the kernel computes its statistics in (they are returned as float32)."""
        return torch.float32

    def known_issue(self, case_id: str, device: str) -> str | None:
        """A declared, reproduced defect of this kernel on one catalogue case (why it fails), else
        None. The harness then expects that case to fail (strictly: a pass is reported as a
        failure, so a fixed issue cannot stay declared) and counts it apart from passes and
        failures. For defects of peers the project does not own, never for its own kernels."""
        return None

    def known_issue_may_pass(self, case_id: str, device: str) -> bool:
        """True where a declared known issue shows on some machines and not on others (a peer's
        generated code that differs from one CPU to another): the check is then expected to fail
        but may pass, and is recorded as what it did. False (the default): a declared issue must
        keep failing."""
        return False

    def missing_torch(self) -> str | None:
        """None when this torch has every operator the kernel calls, else what is missing."""
        missing = [op for op in self.requires_torch_ops if not torch_has_op(op)]
        if not missing:
            return None
        return (f"torch {torch.__version__} lacks aten.{', aten.'.join(missing)}, which {self.name} calls: "
                "install a newer torch (pip install -U torch)")

    def unavailable(self) -> str | None:
        """None when this kernel can run in this process, else why not: the torch operators it
        needs, then its backend's own availability."""
        return self.missing_torch() or self.availability()

    def unsupported(self, spec: NormSpec) -> str | None:
        """None when this kernel can run ``spec``; otherwise the reason it cannot."""
        reason = self.unavailable()
        if reason:
            return reason
        if spec.device not in self.devices:
            return f"{self.name} does not run on device '{spec.device}' (runs on {', '.join(self.devices)})"
        if spec.dtype not in self.dtypes:
            names = ", ".join(dtype_name(d) for d in self.dtypes)
            return f"{self.name} does not support dtype {dtype_name(spec.dtype)} (supports {names})"
        if self.max_n is not None and spec.n > self.max_n:
            return f"N={spec.n} exceeds {self.name}'s limit of {self.max_n}"
        if spec.n < self.min_n:
            return f"N={spec.n} < {self.min_n}: {self.name} is a long-row kernel" + self.shorter_rows_note
        return None

    # -- the call ---------------------------------------------------------------------------
    def __call__(
        self,
        x: torch.Tensor,
        weight: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        eps: float | None = None,
        out: NormOutputs | None = None,
    ) -> NormOutputs:
        calls = self._calls  # the call path (impls.callpath): native replay, then the Python plan
        if calls is not None and out is None:
            table = calls.native
            if table is not None:
                got = table(x, weight, bias, eps)  # None: not a recorded signature, or eps to judge
                if got is not None:
                    return got
            got = calls.fast(x, weight, bias, eps)
            if got is not None:
                return got
        return self.validated_call(x, weight, bias, eps, out)

    def validated_call(self, x: torch.Tensor, weight=None, bias=None, eps: float | None = None,
                       out: NormOutputs | None = None) -> NormOutputs:
        """The call with every check: the inputs, the rows, whether this kernel runs them, the
        outputs; then ``_forward``. It leaves the call path a plan for the call's signature."""
        eps = DEFAULT_EPS[self.op] if eps is None else eps  # the op's default, as the catalogue's
        validate_inputs(self.op, x, weight, bias, eps)
        x2 = rows_view(x, "x", allow_copy=True)
        spec = spec_of(self.op, x2, x.device.type, weight, bias)
        reason = self.unsupported(spec)
        if reason:
            raise UnsupportedCase(reason)
        if out is None:
            out = self.allocate(x)
        else:
            check_out(self, out, x)
        if x2.shape[0] == 0:
            return out
        if _call_path_type is not None and x2.data_ptr() == x.data_ptr():  # rows viewed, not copied
            if self._calls is None:
                self._calls = _call_path_type(self)
            self._calls.remember(x, x2, weight, bias, spec)
        out2 = NormOutputs(
            y=rows_view(out.y, "out.y", allow_copy=False),
            mean=None if out.mean is None else out.mean.view(-1),
            rstd=None if out.rstd is None else out.rstd.view(-1),
        )
        self._forward(x2, weight, bias, float(eps), out2)
        return out

    def fast_plan(self, x: torch.Tensor, x2: torch.Tensor, weight, bias, spec: NormSpec):
        """What later calls of this call's signature run (``impls.fastpath``): a callable
        ``(x, weight, bias, eps) -> NormOutputs`` that allocates and launches, nothing else; None
        (the default) for the generic plan, which runs ``_forward``. Backends return leaner ones."""
        return None

    def launch_hooks(self):
        """An object whose ``launch_enter_hook`` and ``launch_exit_hook``, when either is set (a
        profiler), send a native replay's call the Python way so the hooks see it; None where the
        kernel's launches have no hooks (impls.native)."""
        return None

    def persistent_buffers(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Tensors this kernel keeps between calls and hands to its launches (a placeholder for an
        absent weight): a recorded launch (impls.native) may point at them."""
        return []

    # -- the backward (optional) ------------------------------------------------------------
    @property
    def has_backward(self) -> bool:
        return type(self)._backward is not NormKernel._backward

    def backward_unsupported(self, spec: NormSpec) -> str | None:
        """None when this kernel's backward can run ``spec``, else why not: no backward, the
        forward's limits, then the backward's own (a kernel with a narrower backward adds them)."""
        if not self.has_backward:
            return f"{self.name} has no backward"
        return self.unsupported(spec)

    def backward(self, x: torch.Tensor, weight, bias, dy: torch.Tensor, saved: NormOutputs,
                 eps: float | None = None, out: NormGrads | None = None) -> NormGrads:
        """dx, dw and db for the forward call on x, weight and bias that gave ``saved`` (this
        kernel's own mean and rstd), and the gradient ``dy`` of y; into ``out`` where given."""
        if not self.has_backward:
            raise UnsupportedCase(f"{self.name} has no backward")
        eps = DEFAULT_EPS[self.op] if eps is None else eps
        validate_inputs(self.op, x, weight, bias, eps)
        if dy.shape != x.shape or dy.dtype != x.dtype or dy.device != x.device:
            raise NormInputError(f"dy must match x: {tuple(dy.shape)} {dtype_name(dy.dtype)} on {dy.device}, "
                                 f"x is {tuple(x.shape)} {dtype_name(x.dtype)} on {x.device}")
        for name in self.outputs[1:]:
            if getattr(saved, name) is None:
                raise NormInputError(f"{self.name}'s backward needs the forward's saved {name}")
        if out is None:
            out = NormGrads(dx=torch.empty_like(x),
                            dw=None if weight is None else torch.empty_like(weight),
                            db=None if bias is None else torch.empty_like(bias))
        x2, dy2 = rows_view(x, "x", allow_copy=True), rows_view(dy, "dy", allow_copy=True)
        reason = self.backward_unsupported(spec_of(self.op, x2, x.device.type, weight, bias))
        if reason:  # as the forward: a kernel that cannot run here says why, before any backend code
            raise UnsupportedCase(reason)
        if x2.shape[0]:
            grads = NormGrads(dx=rows_view(out.dx, "out.dx", allow_copy=False), dw=out.dw, db=out.db)
            stats = NormOutputs(y=x2, mean=None if saved.mean is None else saved.mean.reshape(-1),
                                rstd=None if saved.rstd is None else saved.rstd.reshape(-1))
            self._backward(x2, weight, bias, dy2, stats, float(eps), grads)
        else:
            for t in (out.dw, out.db):
                if t is not None:
                    t.zero_()
        return out

    def _backward(self, x: torch.Tensor, weight, bias, dy: torch.Tensor, saved: NormOutputs, eps: float,
                  out: NormGrads) -> None:
        """Write dx (and dw, db where given) for 2-D rows; ``saved`` holds mean and rstd per row."""
        raise NotImplementedError

    def allocate(self, x: torch.Tensor) -> NormOutputs:
        lead = x.shape[:-1]
        stat = lambda: torch.empty(lead, dtype=torch.float32, device=x.device)  # noqa: E731
        return NormOutputs(
            y=torch.empty(x.shape, dtype=x.dtype, device=x.device),
            mean=stat() if "mean" in self.outputs else None,
            rstd=stat() if "rstd" in self.outputs else None,
        )

    def _forward(self, x: torch.Tensor, weight, bias, eps: float, out: NormOutputs) -> None:
        """Write the outputs for 2-D rows ``x`` (M, N), stride(1) == 1, into ``out``."""
        raise NotImplementedError

    def compile_key(self, spec: NormSpec):
        """What the kernel compiles once for (a hashable value), or None when a call never
        compiles. The harness runs the first call of each key under its compile time limit, not
        the check's, and keeps the checks that share a key in few workers."""
        return None

    def m_thresholds(self, spec: NormSpec) -> tuple[int, ...]:
        """Row counts at which the kernel's plan changes for this problem (its dispatch by M): a
        plan is used up to and including each. The batch-invariance check runs both sides."""
        return ()

    # -- compiling without the device --------------------------------------------------------
    def offline_builds(self) -> tuple:
        """Builds (hashable descriptions, such as (dtype, N, affine, M)) whose compilation the
        harness checks on any machine, GPU or not; empty for a kernel that compiles only when it
        runs."""
        return ()

    def build_offline(self, build) -> dict:
        """Compile one of ``offline_builds`` for the target architecture without running it; what
        the compiler reports: "arch" (asked for) and "sass_arch" (in the binary), "registers",
        "spill_stores", "spill_loads", "executed" (whether this machine also runs that code), and
        whatever else the report should show. Raises UnsupportedCase when it cannot compile here."""
        raise UnsupportedCase(f"{self.name} declares no offline builds")

    # -- benchmarking -----------------------------------------------------------------------
    def prepare(self, spec: NormSpec) -> None:
        """Compile or autotune for ``spec`` ahead of a timed run; the benchmark calls it first."""

    def bench_unavailable(self) -> str | None:
        """None when timing this kernel here measures the kernel; else why not (an interpreter)."""
        return None

    def _call(self, x: torch.Tensor, weight, bias, eps: float):
        """The entry point of a kernel that allocates its own outputs (aten, apex, Liger), on 2-D
        rows; such a kernel overrides this and its ``_forward`` copies the results into ``out``."""
        raise NotImplementedError

    def user_call(self, x: torch.Tensor, weight, bias, eps: float):
        """(what it is, a zero-argument callable): the call a user makes on x, for the benchmarks'
        host-inclusive columns. The project's kernels: the public interface (validation, then the
        host fast path); a kernel with its own entry point: that entry point (``_call``)."""
        if type(self)._call is not NormKernel._call:
            return self.call_name or f"{self.name}'s entry point", lambda: self._call(x, weight, bias, eps)
        return (f"registry.get({self.op!r}, {self.backend!r}, {self.variant!r})(x, weight, bias, eps)",
                lambda: self(x, weight, bias, eps))

    def repro_call(self) -> ReproCall | None:
        """How a standalone repro calls this kernel (ReproCall); None: it imports the plug-in."""
        return None

    def bench_callable(self, x: torch.Tensor, weight, bias, eps: float, out: NormOutputs):
        """A zero-argument callable that runs the kernel once on prepared 2-D rows, as the benchmark
        times it: ``_call`` where the kernel has one (copying into the caller's buffers is not
        the kernel's work), else ``_forward``."""
        if type(self)._call is not NormKernel._call:
            return lambda: self._call(x, weight, bias, eps)
        return lambda: self._forward(x, weight, bias, eps, out)
