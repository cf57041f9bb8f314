"""The Triton backend: RMSNorm and LayerNorm, each as a rowwise and a looped kernel.

Without a CUDA device the kernels run under Triton's interpreter on CPU tensors. The
interpreter is chosen through TRITON_INTERPRET, which triton reads when a kernel is decorated;
it is set here only while triton is not yet imported, so a process that already uses triton
keeps its mode (and availability() then says why these kernels cannot run without a GPU).
triton itself is imported on first use, so this package imports, and its kernels register
(shown as skipped with the reason), where triton is missing. The public API (normdiff) asks for
the interpreter whatever was imported first: ``use_interpreter``.
"""
from __future__ import annotations

import os
import sys

from impls.base import cuda_present
from impls.triton import _runtime

if not cuda_present() and "triton" not in sys.modules:
    os.environ["TRITON_INTERPRET"] = "1"

# Importing the modules registers their kernels. The dispatch functions then take over the
# package attributes rms_norm and layer_norm; the modules stay importable by full name
# (from impls.triton.rms_norm import ...).
from impls.triton import dispatch, fused, layer_norm, rms_norm  # noqa: E402,F401
from impls.triton._launch import choose_variant  # noqa: E402
from impls.triton.dispatch import layer_norm, rms_norm  # noqa: E402,F811

__all__ = ["availability", "note", "choose_variant", "rms_norm", "layer_norm", "use_interpreter"]


def use_interpreter() -> str | None:
    """Without a GPU, make this process's Triton kernels run under the interpreter, whatever was
    imported first; None when they will (or run compiled on a GPU), else why they cannot.

    Triton 3.6 reads TRITON_INTERPRET each time a kernel is decorated, so this package's kernels
    (decorated when first used) follow it even after triton was imported. triton.language's own
    library functions (tl.sum, tl.max, ...) were decorated at triton's import: where that was
    compiled, each interpreted launch swaps in interpreted copies of them for its duration
    (``_interpret_library``). Kernels decorated later in the process are interpreted too."""
    if cuda_present():
        return None
    if "impls.triton._kernels" in sys.modules:  # decorated already: the mode is fixed
        return availability()
    os.environ["TRITON_INTERPRET"] = "1"
    triton = sys.modules.get("triton")
    if triton is None:
        return None
    try:
        if not triton.knobs.runtime.interpret:  # a knob a caller set hides the variable
            triton.knobs.runtime.interpret = True
        return _interpret_library()
    except Exception as exc:  # a Triton whose interpreter is built otherwise
        return (f"triton was imported before normdiff without TRITON_INTERPRET=1, and this Triton's "
                f"interpreter cannot be enabled afterwards ({type(exc).__name__}: {exc}); set "
                f"TRITON_INTERPRET=1 before triton is first imported")


def _interpret_library() -> None:
    """Make triton.language's library functions callable from interpreted kernels in a process
    that imported triton compiled: the interpreter's per-launch patch of the language (which it
    undoes after the launch) is extended with interpreted copies of every compiled library
    function (module attributes and tensor methods)."""
    import triton.language as tl
    from triton.runtime import interpreter
    from triton.runtime.jit import JITFunction

    if getattr(interpreter._patch_lang, "_normdiff_library", None) is not None:
        return None
    if not hasattr(interpreter, "_LangPatchScope"):  # a launch's patch this code cannot extend
        raise RuntimeError("triton.runtime.interpreter has no _LangPatchScope")
    modules = [m for name, m in sorted(sys.modules.items()) if name.startswith("triton.language") and m]
    copies, table = {}, []
    for holder in (*modules, tl.tensor):
        for name, fn in list(vars(holder).items()):
            if isinstance(fn, JITFunction):
                if id(fn) not in copies:
                    copies[id(fn)] = interpreter.InterpretedFunction(fn.fn)
                table.append((holder, name, copies[id(fn)]))
    if not table:
        return None  # the library was decorated interpreted
    patch_lang = interpreter._patch_lang

    def with_library(fn):
        scope = patch_lang(fn)
        for holder, name, copy in table:
            scope.set_attr(holder, name, copy)
        return scope

    with_library._normdiff_library = table
    interpreter._patch_lang = with_library
    return None


def availability() -> str | None:
    """None when the Triton kernels can run in this process, else why not."""
    return _runtime.state().reason


def note() -> str:
    return _runtime.note()
