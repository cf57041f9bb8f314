"""What every kernel declares, whatever its family's call (KernelContract), and the pieces of the
contract every backend shares: why a valid case cannot run here (UnsupportedCase), optional
imports, the CUDA and torch-operator probes."""
from __future__ import annotations

import importlib
from typing import ClassVar

import torch

from impls.inputs import SUPPORTED_DTYPES, NormSpec, ReproCall, dtype_name

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


class KernelContract:
    """What every kernel of every family declares (impls.base.NormKernel: the plain norms;
    impls.fused.FusedNormKernel: the fused ones; an outside family's own): its name, where and on
    what it runs, and what the harness may expect of it. A family's base class adds its call."""

    op: ClassVar[str]
    backend: ClassVar[str]
    variant: ClassVar[str] = "default"
    # The family whose contract the call follows: "plain" (impls.base), "fused" (impls.fused), or
    # an outside family's name; the registry keeps each family's kernels apart.
    family: ClassVar[str]
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
    # Whether the kernel can launch with programmatic dependent launch (impls.pdl): it then waits
    # (griddepcontrol.wait) before reading its inputs, and does launch with it where
    # ``impls.pdl.enabled(device)``. The benchmarks time such a kernel with PDL on and off.
    pdl: ClassVar[bool] = False
    # ... and only for calls of at most this many rows (the decode rule: at many rows the grid's
    # own waves leave launch latency nothing to hide); None: at any.
    pdl_max_rows: ClassVar[int | None] = None
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

    @property
    def name(self) -> str:
        return f"{self.backend}.{self.variant}"

    def __repr__(self) -> str:
        return f"<{self.op} kernel {self.name}>"

    # -- capability -------------------------------------------------------------------------
    def launches_pdl(self, device, rows: int | None = None) -> bool:
        """Whether a call on ``device`` of ``rows`` rows (None: any) launches with PDL now
        (impls.pdl, ``pdl_max_rows``)."""
        from impls.pdl import launches_pdl
        limit = self.pdl_max_rows
        return launches_pdl(self, device) and (rows is None or limit is None or rows <= limit)

    def availability(self) -> str | None:
        """None when the backend can run in this process, else why not (shown as a skip)."""
        return None

    def note(self) -> str:
        """How the backend runs here, for the report header (e.g. 'interpreter, no GPU')."""
        return ""

    def stat_dtype(self, dtype: torch.dtype, device: str) -> torch.dtype:
        """Precision the kernel computes its statistics in (they are returned as float32)."""
        return torch.float32

    def known_issue(self, case, device: str, inputs=None) -> str | None:
        """A declared, reproduced defect of this kernel on a case (why it fails), else None: by the
        condition that triggers it, never by a list of case ids. ``case``: the harness's case, read
        by its fields (op, dtype, shape, rows, n, dist, eps, affine, row_pad, dy_dist, ...:
        docs/interface.md); ``inputs``: None, or a zero-argument callable giving the case's inputs
        as its checks draw them on ``device``, to call only where the declaration needs them. The
        harness then expects that case to fail (strictly: a pass is reported as a failure, so a
        fixed issue cannot stay declared) and counts it apart from passes and failures. For
        defects of peers the project does not own, never for its own kernels."""
        return None

    def known_issue_may_pass(self, case, device: str, inputs=None) -> bool:
        """True where a declared known issue shows on some machines and not on others (a peer's
        generated code that differs from one CPU to another), or on some of the cases its
        condition covers: the check is then expected to fail but may pass, and is recorded as
        what it did. False (the default): a declared issue must keep failing."""
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

    # -- the backward (optional) ------------------------------------------------------------
    @property
    def has_backward(self) -> bool:
        """Whether the kernel has a backward (each family's base says how it knows)."""
        return False

    def backward_unsupported(self, spec: NormSpec) -> str | None:
        """None when this kernel's backward can run ``spec``, else why not: no backward, the
        forward's limits, then the backward's own (a kernel with a narrower backward adds them)."""
        if not self.has_backward:
            return f"{self.name} has no backward"
        return self.unsupported(spec)

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

    def repro_call(self) -> ReproCall | None:
        """How a standalone repro calls this kernel (ReproCall); None: it imports the plug-in."""
        return None
