"""The plain family's interface: RMSNorm and LayerNorm called as ``(x, weight, bias, eps)``.

A kernel is one (op, backend, variant); what every family's kernels declare is impls.contract's
KernelContract. NormKernel owns everything that must behave the
same in every backend: the validated call (input validation from impls.inputs, which refuses bad
input with an error that names the problem before any backend code runs; the collapse of
leading dimensions into rows; output allocation and the shape of the returned statistics) and
the declarations the harness reads. A backend only writes ``_forward`` for 2-D rows. What a
warm call skips is the call path's (impls.callpath), the layer above this one.
"""
from __future__ import annotations

from typing import ClassVar, Literal

import torch

from impls.inputs import (  # noqa: F401  (the call's types and validation, part of this interface)
    OPS, SUPPORTED_DTYPES, NormGrads, NormInputError, NormOutputs, NormSpec, ReproCall, check_out, dtype_name,
    rows_view, spec_of, validate_inputs,
)
from impls.contract import (  # noqa: F401  (the declarations every family shares, part of this interface)
    KernelContract, OptionalImport, UnsupportedCase, cuda_present, torch_has_op,
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


class NormKernel(KernelContract):
    """A kernel of the plain family: RMSNorm or LayerNorm called as ``(x, weight, bias, eps)``.
    Subclasses set the declarations (KernelContract) and write ``_forward``."""

    family: ClassVar[str] = "plain"
    # The kernel's call path (impls.callpath), made on its first validated call.
    _calls = None

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

    # -- benchmarking -----------------------------------------------------------------------
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

    def bench_callable(self, x: torch.Tensor, weight, bias, eps: float, out: NormOutputs):
        """A zero-argument callable that runs the kernel once on prepared 2-D rows, as the benchmark
        times it: ``_call`` where the kernel has one (copying into the caller's buffers is not
        the kernel's work), else ``_forward``."""
        if type(self)._call is not NormKernel._call:
            return lambda: self._call(x, weight, bias, eps)
        return lambda: self._forward(x, weight, bias, eps, out)
