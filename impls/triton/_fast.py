"""The Triton kernels' host fast path (impls.fastpath): one recorded launch replayed through the
compiled kernel's own launcher.

A call through ``fn[grid](*args, **kwargs)`` binds the arguments, computes the specialisation
key and looks the compiled kernel up on every call. For one call signature all of that is fixed:
the plan records the launch a validated call makes (``TritonKernel.launches``), finds which of its
arguments are the call's tensors and eps (by identity), and from then on fills those into the
bound argument list and calls ``CompiledKernel.run`` directly. The first call of a plan goes
through ``fn[grid]`` and keeps the kernel it returns; so does every call while a launch hook is
installed (a profiler) or when another device is current, so hooks still see every launch.
"""
from __future__ import annotations

import contextlib
import inspect

import torch

from impls.base import NormOutputs
from impls.fastpath import output_factory

# Where each replayed argument comes from: the call's (x, weight, bias, y, mean, rstd, eps).
X, W, B, Y, MEAN, RSTD, EPS = range(7)


def _hooks_idle(runtime) -> bool:
    """No launch hook installed (Triton 3.6 keeps empty hook chains; older releases None)."""
    for hook in (runtime.launch_enter_hook, runtime.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", True):
            return False
    return True


def lean_plan(kernel, x: torch.Tensor, x2: torch.Tensor, weight, bias, cfg):
    """A plan ``(x, weight, bias, eps) -> NormOutputs`` that replays the one launch the Triton
    ``kernel`` makes for this signature, or None where that launch cannot be replayed as is
    (more than one launch, an argument that is not one of the call's)."""
    m, n = x2.shape
    out2 = kernel.allocate(x2)
    marker = float("0.5")  # a fresh float object: found again by identity among the arguments
    launches = kernel.launches(x2, weight, bias, marker, cfg, out=out2)
    if len(launches) != 1:
        return None
    launch = launches[0]
    fn = launch.fn
    sources = {id(x2): X, id(out2.y): Y, id(marker): EPS}
    for obj, src in ((weight, W), (bias, B), (out2.mean, MEAN), (out2.rstd, RSTD)):
        if obj is not None:
            sources[id(obj)] = src
    subs = []
    for pos, arg in enumerate(launch.args):
        if isinstance(arg, (torch.Tensor, float)):
            if id(arg) not in sources:
                return None
            subs.append((pos, sources[id(arg)]))
    # The launcher takes every parameter in order, constexprs included. The recorded tensors are
    # not kept: every call fills its own in, and a plan must not hold the recording's memory.
    bound = [None if isinstance(arg, torch.Tensor) else arg for arg in launch.args]
    params = list(inspect.signature(fn.fn).parameters.values())  # the kernel's Python function
    for param in params[len(bound):]:
        if param.name in launch.kwargs:
            bound.append(launch.kwargs[param.name])
        elif param.default is not inspect.Parameter.empty:
            bound.append(param.default)
        else:
            return None
    grid = tuple(launch.grid) + (1,) * (3 - len(launch.grid))
    jit, kwargs, nargs = fn[launch.grid], launch.kwargs, len(launch.args)
    runtime = kernel.launch_hooks()
    raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # the stream Triton itself launches on
    current = torch.cuda.current_device
    device = x.device
    on_gpu = device.type == "cuda"  # else Triton's interpreter on CPU tensors (tests)
    index = (device.index if device.index is not None else current()) if on_gpu else None
    alloc = output_factory(x, kernel.outputs)
    box = [None]  # the compiled kernel, once the first call has compiled or found it

    def plan(x, weight, bias, eps):
        y, mean, rstd = alloc(x)
        compiled = box[0]
        args = bound.copy()
        if compiled is not None and current() == index and _hooks_idle(runtime):
            # Pointers as integers: the launcher then neither calls data_ptr() nor asks the driver
            # about each pointer (validation has settled the device).
            vals = (x.data_ptr(), weight is not None and weight.data_ptr(), bias is not None and bias.data_ptr(),
                    y.data_ptr(), mean is not None and mean.data_ptr(), rstd is not None and rstd.data_ptr(), eps)
            for pos, src in subs:
                args[pos] = vals[src]
            compiled.run(grid[0], grid[1], grid[2], raw_stream(index), compiled.function, compiled.packed_metadata,
                         None, None, None, *args)
        else:
            vals = (x, weight, bias, y, mean, rstd, eps)
            for pos, src in subs:
                args[pos] = vals[src]
            with torch.cuda.device(index) if on_gpu else contextlib.nullcontext():
                got = jit(*args[:nargs], **kwargs)
            if box[0] is None and hasattr(got, "packed_metadata"):
                got.run  # noqa: B018 (loads the binary: function is set from then on)
                box[0] = got
        return NormOutputs(y, mean, rstd)

    return plan


__all__ = ["lean_plan"]
