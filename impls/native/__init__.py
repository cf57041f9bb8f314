"""The native call path: a warm call's launches replayed from C++ (``launch.cpp``, ``driver.cpp``).

The Python fast path (``impls.fastpath``) still spends its host time in Python: the signature,
two or three torch allocations and the launcher's argument handling, about 20 µs a call against
eager torch's 10-13 µs. Here the second call of a signature with outputs left to the kernel
(the first run of its Python plan) also records it: the kernel's own launch code runs once more
under CUDA stream capture, on fresh stand-ins for the call's tensors (same shapes, strides, dtypes
and 16-byte alignment), and the captured graph gives every launch's function, grid, block,
shared memory and parameter bytes. A parameter equal to a stand-in's data pointer, or to the float32 bits of the marker eps,
is filled from the call each time; every other parameter keeps its recorded bytes. Later calls
of the signature are one C++ call: signature lookup, output allocation, cuLaunchKernel (or
cuLaunchKernelEx for a launch with programmatic dependent launch, below).

PDL (impls.pdl). A launch recorded with PDL is replayed with its attribute
(CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION through cuLaunchKernelEx); one recorded
without it, without. Which it was, per launch (``replay_pdl``): the kernel's declaration at
recording time (``kernel.launches_pdl(device, rows)``) says whether it may launch with PDL at all, and
the capture says whether each launch did. A kernel that may is captured behind a launch of its
own (a one-element add), so that even its first launch has an edge before it: a capture turns a
PDL launch into a programmatic edge. A kernel's declaration alone would not do: it holds for a
row count, and a kernel may still launch without PDL there (TileLang's where the weight does not
fit in registers beside the row), and a launch that never waits
(griddepcontrol.wait) replayed with PDL could read its input before the kernel before it wrote
it. The node's own programmatic-serialization attribute counts too where the driver reports it
(a 0 proves nothing: the capture moved PDL into the edge). Refused: a launch that shows PDL the
kernel does not declare here; an edge and an attribute that disagree; a kernel that may launch
with PDL and a launch whose capture shows neither (no edge data: a driver without
cuGraphGetEdges_v2); a PDL launch and a driver without cuLaunchKernelEx.

Plans and tables hold launches recorded under one position of the PDL switch: each change
bumps ``impls.pdl.generation()``, the table then serves nothing (it reads the switch on each
call) and the call path (impls.callpath) drops it with its Python plans (Triton's hold the
compiled kernel and its launch_pdl), so the next call validates and records afresh.

A recording is refused, and the call keeps the Python fast path, where it cannot be replayed
exactly: a node that is not a kernel launch (a memset, a copy), parameters passed packed, a
parameter that points at device memory other than the call's tensors (a workspace allocated per
call), no parameter carrying eps, a cluster or cooperative launch (a kernel launched as clusters
also declares it: ``NormKernel.native_replay``), a launch whose PDL cannot be replayed as
recorded (above). ``refusals()`` says why, per kernel.

The extension is built with torch's cpp_extension on first use, in a background thread (about
half a minute, once per torch version; the cache is torch's extensions directory), so no call
waits for the compiler: calls take the Python fast path until it is ready. ``wait()`` blocks
until then (benchmarks call it). A process that ends while its build runs waits for it at exit
(see EXIT_WAIT_S). ``python -m impls.native`` builds it in the foreground.
NORMDIFF_NATIVE=0 turns the path off.
"""
from __future__ import annotations

import atexit
import os
import struct
import threading
import time
import weakref
from pathlib import Path

import torch

from impls import fastpath, pdl
from impls.base import DEFAULT_EPS, NormOutputs, rows_view

ENABLED = os.environ.get("NORMDIFF_NATIVE", "1") != "0"
SOURCE = Path(__file__).with_name("launch.cpp")
EPS_MARKER = 0.000123456789  # recorded as eps: its float32 bits mark the eps parameter
_EPS_BITS = struct.pack("<f", EPS_MARKER)
X, W, B, Y, MEAN, RSTD, EPS = range(7)  # as launch.cpp's Source

_lock = threading.Lock()
_state = {"module": None, "error": None, "thread": None}
_done = threading.Event()
_refusals: dict[str, str] = {}  # kernel name -> why its last recording was refused
# Call paths (impls.callpath) whose signatures met no built extension: when it is ready their
# Python plans are dropped, so each signature's next call is validated once more and recorded.
_waiting: "weakref.WeakSet" = weakref.WeakSet()


# torch's cpp_extension guards a build with a lock file in its build directory and waits for as
# long as that file exists. A process that exits while its build thread (a daemon) is still
# building leaves the file behind, and every later build used to wait forever (a short script, then
# `python -m impls.native`, hung). So a process waits for its own build at exit (up to
# EXIT_WAIT_S), and a lock older than STALE_LOCK_S, which no live build holds, is removed.
EXIT_WAIT_S = 120.0
STALE_LOCK_S = 300.0  # a build takes about half a minute


def _build():
    from torch.utils import cpp_extension

    # torch's extensions directory names the Python and CUDA build; load() rebuilds on a change of source.
    build_dir = cpp_extension._get_build_directory("normdiff_native", verbose=False)
    _wait_for_lock(Path(build_dir) / "lock")
    return cpp_extension.load(name="normdiff_native", sources=[str(SOURCE)], extra_cflags=["-O2"], verbose=False,
                              build_directory=build_dir)


def _wait_for_lock(lock: Path, stale_s: float = STALE_LOCK_S, poll_s: float = 0.5) -> None:
    """Return once ``lock`` is gone: released by the build that holds it, or removed here once it
    is older than ``stale_s`` (left by a process that died mid-build)."""
    while True:
        try:
            age = time.time() - lock.stat().st_mtime
        except FileNotFoundError:
            return
        if age > stale_s:
            lock.unlink(missing_ok=True)
            return
        time.sleep(poll_s)


@atexit.register
def _finish_build_at_exit() -> None:
    """Let a running build finish, so that it releases its lock (see EXIT_WAIT_S)."""
    thread = _state["thread"]
    if thread is not None and thread.is_alive():
        thread.join(EXIT_WAIT_S)


def _build_in_background() -> None:
    try:
        module = _build()
        problem = module.driver_error()
        if problem:
            _state["error"] = problem
        else:
            _state["module"] = module
            for path in list(_waiting):
                path.forget_plans()
    except Exception as exc:  # a missing compiler, a failed build: the Python path stays
        _state["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
    finally:
        _done.set()


def module():
    """The built extension, or None while it is building (the first ask starts the build) or
    where it failed."""
    if _state["module"] is not None or not ENABLED:
        return _state["module"]
    if _state["thread"] is None:
        with _lock:
            if _state["thread"] is None:
                _state["thread"] = threading.Thread(target=_build_in_background, name="normdiff-native-build", daemon=True)
                _state["thread"].start()
    return None


def wait(timeout: float | None = None):
    """Start the build if needed and wait for it; the module, or None (then ``status()`` says why)."""
    if not ENABLED:
        return None
    module()
    _done.wait(timeout)
    return _state["module"]


def status() -> str:
    if not ENABLED:
        return "off (NORMDIFF_NATIVE=0)"
    if _state["module"] is not None:
        return "ready"
    if _state["error"]:
        return f"unavailable: {_state['error']}"
    return "building" if _state["thread"] is not None else "not built yet (built on the first CUDA call)"


def refusals() -> dict[str, str]:
    return dict(_refusals)


def _stand_in(t: torch.Tensor | None) -> torch.Tensor | None:
    """A fresh tensor with t's shape, strides, dtype, device and data pointer modulo 16."""
    if t is None:
        return None
    span = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride())) if t.numel() else 1
    pad = 16 // t.element_size()
    buffer = torch.empty(span + pad, dtype=t.dtype, device=t.device)
    shift = ((t.data_ptr() & 15) - (buffer.data_ptr() & 15)) % 16 // t.element_size()
    view = buffer.as_strided(tuple(t.shape), tuple(t.stride()), shift)
    assert view.data_ptr() & 15 == t.data_ptr() & 15
    return view


def recording(path, key, plan):
    """``plan`` (the Python fast path of a signature in the call path ``path``), wrapped so that its
    first run also records the signature's native launches and then leaves the plain plan in
    ``path.plans``: a signature called once costs no recording, and the kernel has compiled by then."""

    def first(x, weight, bias, eps):
        got = plan(x, weight, bias, eps)
        if path.plans.get(key) is first:
            path.plans[key] = plan
        record(path, x, rows_view(x, "x", allow_copy=False), weight, bias)
        return got

    return first


def record(path, x: torch.Tensor, x2: torch.Tensor, weight, bias) -> None:
    """Record the launches of ``path``'s kernel for this call's signature into its native table
    (see the module docstring); a refusal is kept in ``refusals()``."""
    kernel = path.kernel
    generation = pdl.generation()
    if kernel.native_replay is not None:
        _refusals[kernel.name] = kernel.native_replay
        return
    mod = module()
    if mod is None:
        if _state["error"] is None:
            _waiting.add(path)
        return
    if torch.cuda.is_current_stream_capturing():  # the caller's own capture: not inside it
        return
    try:
        launches, keep = _capture(mod, kernel, x, x2, weight, bias)
        if pdl.generation() != generation:
            raise _Refused("the PDL switch changed while the launches were recorded")
    except _Refused as why:
        _refusals[kernel.name] = str(why)
        return
    except RuntimeError as exc:  # the driver refused a capture or a query
        _refusals[kernel.name] = f"capture failed: {str(exc).strip().splitlines()[0]}"
        return
    table = path.native
    if table is None:
        table = mod.PlanTable(NormOutputs, "mean" in kernel.outputs, "rstd" in kernel.outputs,
                              DEFAULT_EPS[kernel.op], torch.Tensor, kernel.launch_hooks(), fastpath.PLAN_LIMIT,
                              pdl_state())
    table.add(x, weight, bias, x.device.index if x.device.index is not None else torch.cuda.current_device(),
              launches, keep)
    path.native = table
    _refusals.pop(kernel.name, None)


class _Refused(Exception):
    pass


def pdl_state() -> dict:
    """impls.pdl's switch, whose "generation" a native table reads on every call (a dict read in
    C++, no Python call): a table recorded under another generation serves nothing."""
    state = pdl._switch
    if not isinstance(state, dict) or state.get("generation") != pdl.generation():
        raise RuntimeError("impls.pdl's switch is no longer a dict holding generation()")
    return state


def replay_pdl(declared: bool, evidence, launch_ex: bool) -> list[bool]:
    """Whether each recorded launch replays with PDL, by the rule of the module docstring, or
    ``_Refused`` with the reason. ``declared``: the kernel may launch with PDL for this call
    (``kernel.launches_pdl``); ``evidence``: per launch, (edge, attribute) as ``read_graph`` gives
    them (1: shows PDL, 0: shows none, -1: says nothing); ``launch_ex``: the driver has
    cuLaunchKernelEx."""
    flags = []
    for i, (edge, attribute) in enumerate(evidence):
        # An attribute of 0 says nothing: a capture moves a PDL launch's attribute into its edge.
        shown = {edge} - {-1} | ({1} if attribute == 1 else set())
        if len(shown) > 1:
            raise _Refused(f"launch {i}: the capture's edge shows no PDL but the node's attribute does")
        used = shown.pop() if shown else None
        if used and not declared:
            raise _Refused(f"launch {i} used PDL, which the kernel does not declare for this call (KernelContract.pdl, "
                           "impls.pdl.enabled)")
        if declared and used is None:
            raise _Refused(f"whether launch {i} used PDL cannot be established: the kernel may launch with it here and "
                           "the capture shows neither a programmatic edge nor the attribute (no cuGraphGetEdges_v2?)")
        if used and not launch_ex:
            raise _Refused(f"launch {i} used PDL and the driver has no cuLaunchKernelEx: cuLaunchKernel would drop it")
        flags.append(bool(used))
    return flags


def _capture(mod, kernel, x, x2, weight, bias):
    declared = kernel.launches_pdl(x.device, x2.shape[0])
    # A kernel that may launch with PDL is captured behind a launch of its own: its first launch
    # then has an edge before it, programmatic where it used PDL.
    lead = torch.zeros(1, dtype=torch.int32, device=x.device) if declared else None
    sx, sw, sb = _stand_in(x), _stand_in(weight), _stand_in(bias)
    out = kernel.allocate(sx)
    sx2 = rows_view(sx, "x", allow_copy=False)
    out2 = NormOutputs(y=rows_view(out.y, "out.y", allow_copy=False),
                       mean=None if out.mean is None else out.mean.view(-1),
                       rstd=None if out.rstd is None else out.rstd.view(-1))
    if sx2.shape != x2.shape or sx2.stride() != x2.stride():
        raise _Refused("the rows view of a stand-in differs from the call's")
    pointers = {}
    for t, src in ((sx, X), (sw, W), (sb, B), (out.y, Y), (out.mean, MEAN), (out.rstd, RSTD)):
        if t is not None:
            pointers.setdefault(t.data_ptr(), src)
    current = torch.cuda.current_stream(x.device)
    side = torch.cuda.Stream(x.device)
    side.wait_stream(current)
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.stream(side):
        graph.capture_begin(capture_error_mode="relaxed")
        try:
            if lead is not None:
                lead.add_(1)
            kernel._forward(sx2, sw, sb, EPS_MARKER, out2)
        finally:
            graph.capture_end()
    current.wait_stream(side)
    nodes = mod.read_graph(graph.raw_cuda_graph(), 0 if lead is None else 1)
    del graph
    # Memory the launch code allocated for itself (a workspace) is neither the call's nor one of
    # the kernel's lasting placeholders: a launch that points at it cannot be replayed.
    keep = [t for t in kernel.persistent_buffers(x) if t.data_ptr() not in pointers]
    return _launches(mod, nodes, pointers, {t.data_ptr() for t in keep}, declared), keep


def _launches(mod, nodes, pointers: dict, allowed: set, declared: bool) -> list:
    """The table's launches from ``read_graph``'s nodes: each parameter's source (the call's data
    pointer ``pointers`` maps it to, eps, or -1: its recorded bytes) and whether it replays with
    PDL; ``_Refused`` where they cannot be replayed as recorded."""
    if not nodes:
        raise _Refused("the capture holds no kernel launch")
    flags = replay_pdl(declared, [node[7:9] for node in nodes], mod.driver_features()["launch_ex"])
    launches, eps_found = [], 0
    for (func, grid, block, smem, params, offsets, sizes, _, _), with_pdl in zip(nodes, flags):
        sources = []
        for offset, size in zip(offsets, sizes):
            raw = params[offset:offset + size]
            src = -1
            if size == 8:
                value = int.from_bytes(raw, "little")
                if value in pointers:
                    src = pointers[value]
                elif value not in allowed and mod.is_device_pointer(value):
                    raise _Refused(f"a launch parameter points at device memory that is not the call's ({value:#x})")
            elif size == 4 and raw == _EPS_BITS:
                src, eps_found = EPS, eps_found + 1
            elif size not in (1, 2, 4, 8):
                raise _Refused(f"a launch parameter of {size} bytes (a struct such as a TMA descriptor)")
            sources.append(src)
        launches.append((func, tuple(grid), tuple(block), smem, params, list(offsets), sources, with_pdl))
    if not eps_found:
        raise _Refused("no launch parameter carries eps (compiled in?)")
    return launches


def main() -> int:
    print("building normdiff's native launcher ...", flush=True)
    mod = wait()
    print(status())
    return 0 if mod is not None else 1


if __name__ == "__main__":
    raise SystemExit(main())
