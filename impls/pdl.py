"""Programmatic dependent launch (PDL): the switch every kernel that can launch with it reads.

A kernel launched with PDL may start while the kernel before it on the stream is still running.
It must wait (``griddepcontrol.wait``: Triton's ``gdc_wait``, TileLang's ``T.pdl_sync``) before
it reads anything that kernel wrote, and it lets the kernel after it start early
(``griddepcontrol.launch_dependents``: ``gdc_launch_dependents``, ``T.pdl_trigger``). At decode
sizes a norm is a few microseconds, much of it launch latency, which the overlap hides.

Where it runs is a rule, not a constant in a kernel: a CUDA device of compute capability 9.0 or
more (the instructions and the launch attribute are Hopper's), compiled code (Triton's
interpreter cannot run the inline asm), and the switch on. The switch: ``NORMDIFF_PDL=0`` turns
it off for the process; ``forced(on)`` sets it for a block (the benchmarks time both ways). Each
change of the switch bumps ``generation()``, so a cache of recorded launches (impls.callpath)
knows to record again.

A kernel declares that it can (``KernelContract.pdl``); ``launches_pdl(kernel, device)`` says
whether this call launches with it.
"""
from __future__ import annotations

import contextlib
import functools
import os

import torch

ENV = "NORMDIFF_PDL"
MIN_CAPABILITY = (9, 0)

_switch = {"on": os.environ.get(ENV, "1") != "0", "generation": 0}


def switched_on() -> bool:
    return _switch["on"]


def generation() -> int:
    """Bumped by every change of the switch: plans recorded under another value are stale."""
    return _switch["generation"]


def set_switch(on: bool) -> None:
    if bool(on) != _switch["on"]:
        _switch["on"] = bool(on)
        _switch["generation"] += 1


@contextlib.contextmanager
def forced(on: bool):
    """The switch set to ``on`` for the block, then put back."""
    before = _switch["on"]
    set_switch(on)
    try:
        yield
    finally:
        set_switch(before)


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def unavailable(device) -> str | None:
    """Why a launch on ``device`` (a torch.device, or its type as a string) cannot use PDL, else
    None. The switch is not a reason here: see ``enabled``. Asked at each launch of a kernel that
    declares PDL, so the card's answer is asked of the driver once per device."""
    device = device if isinstance(device, torch.device) else torch.device(device)
    if device.type != "cuda":
        return f"PDL is a CUDA launch attribute; this is a {device.type} device"
    why = _card(device.index)
    if why is None and _interpreted():
        return "Triton's interpreter runs programs one at a time and cannot run griddepcontrol"
    return why


@functools.lru_cache(maxsize=None)
def _card(index: int | None) -> str | None:
    """Why the CUDA device ``index`` (None: the current one) cannot run PDL, else None."""
    if not torch.cuda.is_available():
        return "no CUDA device here"
    cap = torch.cuda.get_device_capability(index)
    if cap < MIN_CAPABILITY:
        return f"compute capability {cap[0]}.{cap[1]}: PDL needs {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} or more"
    return None


def why_off(device) -> str | None:
    """Why a kernel that can launch with PDL does not on ``device`` now: PDL cannot run there, or
    the switch is off. None: it does."""
    return unavailable(device) or (None if switched_on() else f"{ENV}=0: PDL is off for this process")


def enabled(device) -> bool:
    """Whether a kernel that can launch with PDL does so on ``device`` now."""
    return why_off(device) is None


def launches_pdl(kernel, device) -> bool:
    """Whether ``kernel`` launches with PDL on ``device`` now: it declares it can, and ``enabled``."""
    return bool(getattr(kernel, "pdl", False)) and enabled(device)
