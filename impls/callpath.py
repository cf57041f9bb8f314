"""The call path: what a kernel's calls need after their first, owned per kernel.

The layers, from the bottom:

- ``impls.base``: the contract and the validated call (checks, rows, spec, outputs, ``_forward``).
- this module: one ``CallPath`` per kernel, made on its first validated call. It owns the two
  caches a warm call uses, and nothing else touches them:
  - ``plans``: per call signature, the Python fast path (``impls.fastpath``): a plan that
    allocates the outputs and launches;
  - ``native``: the C++ replay table (``impls.native``), filled by recording a signature's launches
    on its second call.
- ``impls.fastpath`` and ``impls.native``: how a plan and a replay are made.

Both caches hold launches made under one position of the PDL switch (impls.pdl): a plan replays
the launch it found (Triton's, the compiled kernel with its launch_pdl), a native table the
launches it recorded. A ``CallPath`` remembers the switch's ``generation()`` it planned under and
drops both caches once it changes, so the next call validates and records afresh (the native
table itself serves nothing meanwhile: callers that reach it first get None).

``NormKernel.__call__`` asks the native table first, then the Python plan, then validates. The
native path asks the kernel, never its backend's name, for what a replay needs: the kernel's
``launch_hooks()`` (an object whose launch hooks, when set, send a call the Python way) and its
``persistent_buffers``.

Tests and tools read and reset the caches through ``state``, ``plans``, ``native_table`` and
``forget`` only.
"""
from __future__ import annotations

from impls import fastpath, native, pdl
from impls.base import DEFAULT_EPS, NormKernel, NormSpec, install_call_path


class CallPath:
    """One kernel's plans and native table. ``native`` is read by entry points that skip a frame
    (impls.triton's functions); it is written here and by ``impls.native.record`` only."""

    __slots__ = ("kernel", "plans", "native", "default_eps", "generation", "__weakref__")

    def __init__(self, kernel: NormKernel):
        self.kernel = kernel
        self.plans: dict = {}
        self.native = None
        self.default_eps = DEFAULT_EPS[kernel.op]
        self.generation = pdl.generation()  # of the PDL switch the caches were made under

    def fast(self, x, weight, bias, eps):
        """The outputs of this call by its signature's plan, or None where the call must validate
        (a new signature, an eps the validated call must judge, a change of the PDL switch)."""
        if not self.plans:  # nothing kept (the fast path off, or every plan dropped): no signature to make
            return None
        if self.generation != pdl.generation():
            self.forget_switch()
            return None
        key = fastpath.call_signature(x, weight, bias)
        if key is None:
            return None
        plan = self.plans.get(key)
        if plan is None:
            return None
        eps = fastpath.fast_eps(eps, self.default_eps)
        if eps is None:
            return None
        return plan(x, weight, bias, eps)

    def remember(self, x, x2, weight, bias, spec: NormSpec) -> None:
        """After a validated call on rows viewed from x (not copied): keep a plan for its signature,
        wrapped to record its native launches on its first run where the kernel may be replayed."""
        if not fastpath.ENABLED:
            return
        if self.generation != pdl.generation():
            self.forget_switch()
        key = fastpath.call_signature(x, weight, bias)
        if key is None or key in self.plans:
            return
        if len(self.plans) >= fastpath.PLAN_LIMIT:
            self.plans.clear()
        kernel = self.kernel
        plan = kernel.fast_plan(x, x2, weight, bias, spec) or fastpath.generic_plan(x, x2, kernel.outputs,
                                                                                  kernel._forward)
        if kernel.project and spec.device == "cuda" and native.ENABLED:
            plan = native.recording(self, key, plan)  # the signature's second call records
        self.plans[key] = plan

    def forget_plans(self) -> None:
        """Drop the Python plans: each signature's next call validates (and records) again."""
        self.plans.clear()

    def forget_switch(self) -> None:
        """Drop the plans and the native table made under an earlier position of the PDL switch."""
        self.plans.clear()
        self.native = None
        self.generation = pdl.generation()


def state(kernel: NormKernel) -> dict:
    """What a kernel's call path holds: {"signatures": plans kept, "native": whether it has a
    replay table}; both empty before its first call."""
    path = kernel._calls
    return {"signatures": 0 if path is None else len(path.plans),
            "native": path is not None and path.native is not None}


def forget(kernel: NormKernel) -> None:
    """Drop a kernel's plans and native table: its next call validates as a first call does (tools
    that time the paths apart, a copied kernel that must not share its original's caches)."""
    kernel._calls = None


def plans(kernel: NormKernel) -> list:
    """The kernel's Python plans (tests that check what a plan's closure keeps alive)."""
    path = kernel._calls
    return [] if path is None else list(path.plans.values())


def native_table(kernel: NormKernel):
    """The kernel's native replay table, or None (tools that time the table called directly)."""
    path = kernel._calls
    return None if path is None else path.native


install_call_path(CallPath)

__all__ = ["CallPath", "forget", "native_table", "plans", "state"]
