"""A peer's repro calls its library as its plug-in does: the call section a repro holds
(harness.repro.emit.call_section: the declared imports, the helpers copied in, call_forward and
call_backward) and the plug-in's _forward and _backward run on the same inputs against stand-ins
of the libraries (tests/peer_fakes.py). Each library function must be called with the same
arguments (every tensor's shape, strides, dtype, bytes, and whether it is a caller's tensor, a
view of one or a copy), and the caller's outputs and inputs must hold the same bytes after: the
same contiguity copies, dtype casts, in-place writes and copies into the outputs. Rows are
padded (a row stride of N + 3, which QuACK's and FlashInfer's layouts copy) or not."""
from __future__ import annotations

import math
import os
import sys
from types import SimpleNamespace as Namespace

import pytest
import torch

from harness.repro import emit
from impls import registry
from impls.base import NormGrads, NormOutputs, OptionalImport
from impls.fused import ADD_OPS, FusedGrads, FusedOutputs, FusedParams
from tests import peer_fakes
from tests.test_repro_peers import PLUGINS

BACKENDS = ["liger", "quack", "flashinfer", "apex"]
M, N, GAP, EPS = 3, 1000, 16, 1e-5
registry.load_all(PLUGINS)
KERNELS = registry.kernels(BACKENDS, family=None)
# By name, not the kernel: the harness's collection takes a test of a kernel for one of its checks.
CALLS = [(f"{k.name}-{k.op}", bwd) for k in KERNELS for bwd in (False, True) if not bwd or k.has_backward]


@pytest.fixture
def libraries(monkeypatch):
    """The stand-ins imported wherever a library is, and each plug-in's imports tried again."""
    for name, mod in peer_fakes.modules().items():
        monkeypatch.setitem(sys.modules, name, mod)
    for module in {sys.modules[type(k).__module__] for k in KERNELS}:
        for value in vars(module).values():
            if isinstance(value, OptionalImport):
                for attr, fresh in (("_tried", False), ("_modules", None), ("reason", None)):
                    monkeypatch.setattr(value, attr, fresh)


def _rows(dtype, pad: int, seed: int, n: int = N) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(M, n + pad, generator=g).to(dtype)[:, :n]


def _vec(dtype, seed: int) -> torch.Tensor:
    return torch.randn(N, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _tensors(kernel, pad: int, backward: bool) -> dict:
    """The call's inputs and outputs by name, drawn the same on every call."""
    fused = kernel.family == "fused"
    dtype = torch.bfloat16 if torch.bfloat16 in kernel.dtypes else kernel.dtypes[0]
    layer = "layer_norm" in kernel.op
    t = {"x": _rows(dtype, pad, 1), "weight": _vec(dtype, 2), "bias": _vec(dtype, 3) if layer else None}
    stat = {s: torch.zeros(M) if s in kernel.outputs else None for s in ("mean", "rstd")}
    if fused and kernel.op in ADD_OPS:
        t["residual"] = _rows(dtype, pad, 4)
    if backward:
        t.update(dy=_rows(dtype, pad, 5), dx=_rows(dtype, GAP, 6), dw=torch.zeros(N, dtype=dtype),
                 db=torch.zeros(N, dtype=dtype) if layer else None, mean=None if stat["mean"] is None else _vec(torch.float32, 7)[:M],
                 rstd=_vec(torch.float32, 8)[:M].abs())
        if fused and kernel.op in ADD_OPS:
            t.update(d_residual_out=_rows(dtype, pad, 9), dresidual=_rows(dtype, GAP, 10))
        return t
    write = kernel.writes[0] if fused else "new"
    out_dtype = kernel.out_dtypes[-1] if fused else None
    t.update(y=t["x"] if write == "in_place" else _rows(out_dtype or dtype, GAP, 11), **stat)
    if "residual" in t:
        t["residual_out"] = t["residual"] if write != "new" else _rows(dtype, GAP, 12)
    t["params"] = (kernel.weight_offsets[-1], out_dtype, 1.0 if out_dtype else None, write) if fused else None
    return t


def _plugin_call(kernel, t: dict, backward: bool) -> None:
    x, w, b, r = t["x"], t["weight"], t["bias"], t.get("residual")
    if kernel.family != "fused":
        if backward:
            return kernel._backward(x, w, b, t["dy"], NormOutputs(x, t["mean"], t["rstd"]), EPS,
                                    NormGrads(t["dx"], t["dw"], t["db"]))
        return kernel._forward(x, w, b, EPS, NormOutputs(t["y"], t["mean"], t["rstd"]))
    if backward:
        return kernel._backward(x, w, b, t["dy"], t.get("d_residual_out"), FusedOutputs(x, None, t["mean"], t["rstd"]),
                                EPS, kernel.weight_offsets[-1], FusedGrads(t["dx"], t.get("dresidual"), t["dw"], t["db"]))
    return kernel._forward(x, r, w, b, EPS, FusedParams(*t["params"]),
                           FusedOutputs(t["y"], t.get("residual_out"), t["mean"], t["rstd"]))


def _repro_call(kernel, t: dict, backward: bool) -> None:
    """The repro's call section, run as the repro's main runs it (Namespaces for the outputs)."""
    fused = kernel.family == "fused"
    ns = {"torch": torch, "math": math, "os": os, "sys": sys, "__name__": "repro"}
    exec(compile("\n".join(emit.call_section(Namespace(kernel=kernel, fused=fused, backward=backward))), "repro",
                 "exec"), ns)
    x, w, b, r = t["x"], t["weight"], t["bias"], t.get("residual")
    saved = Namespace(y=x, mean=t["mean"], rstd=t["rstd"])
    if not fused:
        if backward:
            return ns["call_backward"](x, w, b, t["dy"], saved, EPS, Namespace(dx=t["dx"], dw=t["dw"], db=t["db"]))
        return ns["call_forward"](x, w, b, EPS, Namespace(y=t["y"], mean=t["mean"], rstd=t["rstd"]))
    if backward:
        grads = Namespace(dx=t["dx"], dresidual=t.get("dresidual"), dw=t["dw"], db=t["db"])
        return ns["call_backward"](x, w, b, t["dy"], t.get("d_residual_out"), saved, EPS, kernel.weight_offsets[-1],
                                   grads)
    params = Namespace(**dict(zip(("weight_offset", "out_dtype", "scale", "write"), t["params"])))
    return ns["call_forward"](x, r, w, b, EPS, params, Namespace(y=t["y"], residual_out=t.get("residual_out"),
                                                                mean=t["mean"], rstd=t["rstd"]))


def _bytes(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def _described(value, named: dict):
    if isinstance(value, torch.Tensor):
        owner = [k for k, v in named.items() if isinstance(v, torch.Tensor)
                 and v.untyped_storage().data_ptr() == value.untyped_storage().data_ptr()]
        role = (owner[0] if owner and value.data_ptr() == named[owner[0]].data_ptr() else
                f"view of {owner[0]}" if owner else "its own")
        return ("tensor", tuple(value.shape), value.stride(), value.dtype, role, _bytes(value))
    if isinstance(value, (list, tuple)):
        return type(value).__name__, tuple(_described(v, named) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _described(v, named)) for k, v in value.items()))
    return value


def _run(call, kernel, pad: int, backward: bool):
    """What the library was given, what the call raised, and every named tensor's bytes after."""
    t = _tensors(kernel, pad, backward)
    peer_fakes.LOG.clear()
    try:
        call(kernel, t, backward)
        raised = None
    except Exception as exc:  # noqa: BLE001 (a refusal is part of the call: the same on both sides)
        raised = f"{type(exc).__name__}: {exc}"
    log = [(name, _described(args, t), _described(kwargs, t)) for name, args, kwargs in peer_fakes.LOG]
    return log, raised, {k: _bytes(v) for k, v in t.items() if isinstance(v, torch.Tensor)}


@pytest.mark.parametrize("pad", [0, 3], ids=["dense", "padded"])
@pytest.mark.parametrize("name, backward", CALLS, ids=[f"{k}-{'bwd' if b else 'fwd'}" for k, b in CALLS])
def test_the_repro_calls_the_library_as_the_plug_in_does(libraries, name, backward, pad):
    peer = next(k for k in KERNELS if f"{k.name}-{k.op}" == name)
    theirs = _run(_plugin_call, peer, pad, backward)
    mine = _run(_repro_call, peer, pad, backward)
    assert theirs[0] or theirs[1], f"{peer.name} neither called its library nor refused the layout"
    assert [c[0] for c in mine[0]] == [c[0] for c in theirs[0]]
    assert mine[0] == theirs[0], "the library was given other arguments"
    assert mine[1] == theirs[1]
    assert mine[2] == theirs[2], "the outputs or inputs hold other bytes after the call"
