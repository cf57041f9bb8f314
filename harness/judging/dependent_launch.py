"""The dependent-launch check: a kernel that launches with programmatic dependent launch (PDL,
impls.pdl) reads what the kernel before it wrote.

Launched with PDL, a norm may start while the kernel before it on the stream still runs; only its
own ``griddepcontrol.wait`` keeps it from reading x and the residual before that kernel's writes
land. A kernel that drops the wait is fast and wrong, and wrong only when something runs before
it, so no other check sees it. This one builds what a model's decode step is: a CUDA graph in
which a producer kernel writes x (and the residual) and the norm follows it. The producer lets
its dependents start at once (``gdc_launch_dependents``) and then spins for tens of microseconds
before it writes, so a norm that does not wait reads the poison its buffers held before. The
norm's outputs from the graph must equal, bit for bit, its outputs from a plain call on the
same inputs (a kernel that may give other bits on a repeat is not judged here: it says so).

On the CPU (and wherever PDL cannot run) the check is skipped with the reason. Its CPU twins:
``wait_before_loads`` (the kernel's decode launch compiled for sm_90 offline, whose PTX must hold
``griddepcontrol.wait`` before its first global load), and ``simulate=True`` (the same steps in
order, without a graph: the check's machinery on any kernel, any family and write convention).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch

from impls import pdl
from impls.contract import UnsupportedCase

# The decode shapes the check runs: rows x N, bfloat16 (what a decode step's norms see).
SHAPES = ((1, 4096), (64, 4096))
DTYPE = torch.bfloat16
# The producer's spin: SPIN dependent multiply-adds, meant to outlast a decode norm many times over.
SPIN = 1 << 15
POISON = 7.0  # what x and the residual hold before the producer writes them
REPLAYS = 3


@dataclass
class DependentLaunchResult:
    skipped: str | None = None
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


def _fused(kernel) -> bool:
    return getattr(kernel, "family", "plain") == "fused"


def _call_kwargs(kernel) -> dict:
    """A fused kernel's call in its own first convention, offset and output (a decode step's)."""
    from impls.fused import FP8_DTYPES
    kw = {"write": kernel.writes[0]}
    if 0.0 not in kernel.weight_offsets:
        kw["weight_offset"] = kernel.weight_offsets[0]
    if None not in kernel.out_dtypes:
        kw.update(out_dtype=next(d for d in kernel.out_dtypes if d in FP8_DTYPES), scale=1.0)
    return kw


def _inputs(kernel, m: int, n: int, device: str, seed: int = 0):
    """Sources (what the producer writes) and the weight and bias of a call."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    src_x = torch.randn(m, n, generator=g).to(DTYPE).to(device)
    add = _fused(kernel) and kernel.op.startswith("add_")
    src_r = torch.randn(m, n, generator=g).to(DTYPE).to(device) if add else None
    weight = (1 + 0.1 * torch.randn(n, generator=g)).to(DTYPE).to(device)
    bias = (0.1 * torch.randn(n, generator=g)).to(DTYPE).to(device) if kernel.op.endswith("layer_norm") else None
    return src_x, src_r, weight, bias


def _call(kernel, x, r, weight, bias):
    """The kernel's call on x (and the residual); its outputs as a dict of tensors."""
    if _fused(kernel):
        out = kernel(x, r, weight, bias, **_call_kwargs(kernel))
    else:
        out = kernel(x, weight, bias)
    return out.fields()


def _differences(got: dict, want: dict) -> list[str]:
    out = []
    for name, w in want.items():
        g = got.get(name)
        if g is None:
            out.append(f"{name}: not written")
            continue
        gv, wv = g.float(), w.float()
        same = (gv == wv) | (gv.isnan() & wv.isnan())
        if not bool(same.all()):
            rows = (~same).reshape(same.shape[0], -1).any(dim=1) if same.dim() else ~same
            worst = (gv - wv).abs().nan_to_num(float("inf")).max().item()
            out.append(f"{name}: {int(rows.sum())} of {rows.numel()} rows differ from a plain call on the same "
                       f"inputs (worst |diff| {worst:.3g}): it read x before the kernel before it wrote it")
    return out


def _producer():
    from harness.judging import _pdl_producer
    return _pdl_producer


def _copy_write(src_x, dst_x, src_r, dst_r, spin: int) -> None:
    """The simulated producer: the same writes, at once."""
    dst_x.copy_(src_x)
    if dst_r is not None:
        dst_r.copy_(src_r)


def _graph_chain(steps):
    """The card: ``steps`` captured once in a CUDA graph; each replay runs them again, writing the
    outputs the capture allocated."""
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        graph.capture_begin()
        try:
            got = steps()
        finally:
            graph.capture_end()
    torch.cuda.current_stream().wait_stream(stream)

    def replay():
        graph.replay()
        torch.cuda.synchronize()
        return got
    return replay


def check_dependent_launch(kernel, m: int, n: int, device: str = "cuda", simulate: bool = False) -> DependentLaunchResult:
    """The CUDA graph producer -> norm with PDL on, replayed REPLAYS times, each against the
    plain call's bits (see the module docstring). ``simulate``: the CPU twin of the same steps,
    run in order on ``device`` with the producer's writes made at once (no PDL, no graph): it
    holds the check's own machinery (inputs, the call in each family and convention, the
    comparison) on any machine, and catches a kernel that reads a stale copy of x."""
    why = kernel.unavailable()
    if why:
        return DependentLaunchResult(skipped=why)
    if not simulate:
        why = pdl.unavailable(device)
        if why:
            return DependentLaunchResult(skipped=f"PDL cannot run here: {why}")
        if not getattr(kernel, "pdl", False):
            return DependentLaunchResult(skipped=f"{kernel.name} does not launch with PDL")
    if getattr(kernel, "nondeterministic", None):
        return DependentLaunchResult(skipped=f"not judged bit for bit: {kernel.nondeterministic}")
    # Inputs of their own for the warm-up and each replay (a kernel that reads the x of an earlier
    # call differs too); the weight and bias of the first.
    drawn = [_inputs(kernel, m, n, device, seed) for seed in range(REPLAYS + 1)]
    _, _, weight, bias = drawn[0]
    src_x, src_r = drawn[0][0].clone(), None if drawn[0][1] is None else drawn[0][1].clone()

    def load(i: int) -> None:  # the producer's next sources, set outside the chain
        src_x.copy_(drawn[i][0])
        if src_r is not None:
            src_r.copy_(drawn[i][1])

    with pdl.forced(True):
        if not simulate and not kernel.launches_pdl(torch.device(device)):
            return DependentLaunchResult(skipped="PDL is switched off for this process (NORMDIFF_PDL=0)")
        # The plain calls' inputs stay alive to the end: the chain's buffers never take their memory.
        plain = [(dx.clone(), None if dr is None else dr.clone()) for dx, dr, _, _ in drawn]
        try:
            wants = [{k: v.clone() for k, v in _call(kernel, px, pr, weight, bias).items()} for px, pr in plain]
        except UnsupportedCase as e:
            return DependentLaunchResult(skipped=str(e))
        x = torch.full_like(src_x, POISON)
        r = None if src_r is None else torch.full_like(src_r, POISON)
        write = _copy_write if simulate else _producer().write
        # Warm: compile the producer and the norm for these buffers before the chain.
        write(src_x, x, src_r, r, spin=1)
        _call(kernel, x, r, weight, bias)
        if not simulate:
            torch.cuda.synchronize()

        def steps():
            x.fill_(POISON)
            if r is not None:
                r.fill_(POISON)
            write(src_x, x, src_r, r, spin=SPIN)
            return _call(kernel, x, r, weight, bias)

        replay = steps if simulate else _graph_chain(steps)
        failures = []
        for i in range(1, REPLAYS + 1):
            load(i)
            failures += [f"replay {i}: {d}" for d in _differences(replay(), wants[i])]
        return DependentLaunchResult(failures=failures)


# -- The CPU twin: the wait in the compiled code ---------------------------------------------------
_LOAD = re.compile(r"^\s*(@%p\d+\s+)?ld\.global", re.M)
_WAIT = re.compile(r"griddepcontrol\.wait", re.M)


def wait_before_loads(ptx: str) -> str | None:
    """None where the PTX waits (griddepcontrol.wait) before its first global load, else what is
    wrong."""
    wait, load = _WAIT.search(ptx), _LOAD.search(ptx)
    if wait is None:
        return "no griddepcontrol.wait: launched with PDL it may read x before the kernel before it wrote it"
    if load is not None and load.start() < wait.start():
        return "a global load comes before griddepcontrol.wait"
    return None
