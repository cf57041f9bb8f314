"""Kernels by backend name.

Built-in backends register themselves when their module is imported. A backend that lives
outside the project comes in either through an installed package's entry point in the group
``normdiff.backends`` (the entry point names a module or a callable returning kernels), or
through a Python file named with ``--backend-file``; both are then selected with
``--backend NAME`` like a built-in one.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import sys
from pathlib import Path

from impls.base import NormKernel
from impls.contract import KernelContract

# Plug-ins the project ships as examples: a name that is not registered but is listed here gets
# told how to load it.
KNOWN_PLUGINS = {"liger": "examples/liger_backend.py", "quack": "examples/quack_backend.py",
                 "flashinfer": "examples/flashinfer_backend.py"}
BUILTIN_MODULES = ("impls.torch_eager", "impls.torch_compile", "impls.triton", "impls.tilelang", "impls.apex",
                   "impls.torch_fused")
ENTRY_POINT_GROUP = "normdiff.backends"

_KERNELS: dict[tuple[str, str, str, str], KernelContract] = {}  # (family, backend, variant, op) -> kernel
_LOAD_ERRORS: dict[str, str] = {}  # source -> why it did not load


def register(kernel: KernelContract | type[KernelContract]) -> KernelContract | type[KernelContract]:
    """Register a kernel (instance or class, so it can be used as a class decorator). A kernel
    that does not say why its timings would mean nothing (``bench_unavailable``) gets the
    built-in Triton kernels' reason while it runs Triton under the interpreter."""
    instance = kernel() if isinstance(kernel, type) else kernel
    key = (instance.family, instance.backend, instance.variant, instance.op)
    if key in _KERNELS and type(_KERNELS[key]) is not type(instance):
        raise ValueError(f"a {instance.family} kernel for {instance.op} named {instance.name} is already registered")
    if type(instance).bench_unavailable is KernelContract.bench_unavailable:
        instance.bench_unavailable = lambda: INTERPRETED if runs_interpreted_triton(instance) else None
    _KERNELS[key] = instance
    return kernel


# The benchmark's reason for every kernel that runs Triton under its interpreter: the
# interpreter's time is Python's, not the kernel's (impls.triton declares it for its own).
INTERPRETED = "triton runs under its interpreter on this machine: not a timing"


def runs_interpreted_triton(kernel: KernelContract) -> bool:
    """Whether ``kernel`` runs Triton under the interpreter: its class's module (or a base
    class's) holds an interpreted Triton kernel, or it lists triton in ``packages`` while the
    interpreter is on. Never imports triton."""
    triton = sys.modules.get("triton")
    if triton is None:
        return False
    for cls in type(kernel).__mro__:
        module = sys.modules.get(cls.__module__)
        if cls not in (NormKernel, KernelContract) and module is not None and any(_interpreted(v) for v in vars(module).values()):
            return True
    if "triton" not in kernel.packages:
        return False
    try:
        return bool(triton.knobs.runtime.interpret)
    except AttributeError:  # a Triton without knobs reads the variable
        return os.environ.get("TRITON_INTERPRET") == "1"


def _interpreted(value, depth: int = 3) -> bool:
    """An interpreted @triton.jit function, or an autotuner/heuristics wrapper around one."""
    for _ in range(depth):
        if type(value).__name__ == "InterpretedFunction":
            return True
        value = getattr(value, "fn", None) if hasattr(type(value), "run") else None
        if value is None:
            return False
    return False


def load_builtins() -> None:
    for module in BUILTIN_MODULES:
        importlib.import_module(module)


def load_entry_points() -> None:
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
        except Exception as exc:  # a broken plug-in must not take the harness down
            _LOAD_ERRORS[f"entry point {ep.name}"] = f"{type(exc).__name__}: {exc}"
            continue
        if callable(obj) and not isinstance(obj, type):
            for kernel in obj() or ():
                register(kernel)


def plugin_module(path: str | Path) -> str:
    """The module name a plug-in file is loaded as (its kernels' classes carry it)."""
    return f"normdiff_plugin_{Path(path).stem}"


def load_file(path: str | Path) -> None:
    """Import a Python file that registers kernels (it calls ``impls.registry.register``)."""
    path = Path(path).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"backend file {path} does not exist")
    name = plugin_module(path)
    loaded = sys.modules.get(name)
    if loaded is not None and Path(getattr(loaded, "__file__", "")) == path:
        return  # already loaded in this process: its kernels are registered
    if str(path.parent) not in sys.path:  # a plug-in may import the modules beside it
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


def load_all(files: list[str] | tuple[str, ...] = ()) -> None:
    load_builtins()
    load_entry_points()
    for f in files:
        load_file(f)


def expand(patterns: list[str]) -> list[str]:
    """Backend names for names or glob patterns (``my_*``); an unmatched pattern stays, so the
    caller can say it is unknown."""
    import fnmatch

    out: list[str] = []
    for p in patterns:
        hits = fnmatch.filter(backends(), p) if any(c in p for c in "*?[") else []
        out += [h for h in (hits or [p]) if h not in out]
    return out


class UnknownBackend(KeyError):
    """A backend name nothing registered. A KeyError, shown as its message (not quoted)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def unknown_message(unknown: list[str]) -> str:
    """What is registered, and how each kind of backend gets registered."""
    named = [f"{n}: a plug-in, load it with --backend-file {KNOWN_PLUGINS[n]}" for n in unknown if n in KNOWN_PLUGINS]
    shipped = ", ".join(f"{n} ({p})" for n, p in KNOWN_PLUGINS.items())
    return (f"unknown backend(s) {', '.join(unknown)}; registered: {', '.join(backends()) or 'none'}. "
            + "".join(f"{line}. " for line in named)
            + "Built-in backends load with impls.registry.load_all() (or load_builtins()); a plug-in file with "
            f"--backend-file PATH (pytest) or impls.registry.load_all([PATH]). Plug-ins shipped as examples: {shipped}")


def backends() -> list[str]:
    return sorted({b for _, b, _, _ in _KERNELS})


def families() -> list[str]:
    """The families of the registered kernels: "plain", "fused" and any outside family's."""
    return sorted({f for f, _, _, _ in _KERNELS})


def kernels(names: list[str] | None = None, op: str | None = None, family: str | None = "plain") -> list[KernelContract]:
    """Registered kernels of the named backends (all when None), by backend, variant and op, of one
    family: the plain norms' ("plain"), the fused ones' ("fused", impls.fused), an outside family's,
    or every family's (None)."""
    if names is not None:
        unknown = sorted(set(names) - set(backends()))
        if unknown:
            raise UnknownBackend(unknown_message(unknown))
    return [
        k
        for (f, b, v, o), k in sorted(_KERNELS.items(), key=lambda item: item[0][1:] + item[0][:1])
        if (names is None or b in names) and (op is None or o == op) and (family is None or f == family)
    ]


def get(op: str, backend: str, variant: str | None = None, family: str | None = None) -> KernelContract:
    """The kernel of ``op`` named ``backend.variant`` (the first variant where None), of ``family``
    (any where None: the name tells the families apart)."""
    found = [k for k in kernels([backend], op, family=family) if variant is None or k.variant == variant]
    if not found:
        valid = ", ".join(k.variant for k in kernels([backend], op, family=family)) or "none"
        raise KeyError(f"no {op} kernel {backend}.{variant or '*'}; {backend}'s {op} variants: {valid}")
    return found[0]


def load_errors() -> dict[str, str]:
    return dict(_LOAD_ERRORS)


def unregister(backend: str) -> None:
    """Remove a backend (used by the framework's own tests)."""
    for key in [k for k in _KERNELS if k[1] == backend]:
        del _KERNELS[key]
