"""A repro draws its case's inputs bit for bit as the harness does (harness/repro/draw.py against
harness/judging/inputs.py and fused_inputs.py), over the quick catalogues, plain and fused, forward
and backward; and its backward judging gives the harness's numbers (torch.eager's 16-bit db on the
CPU, a declared finding, and torch.fused's add-op backward)."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from harness.judging import fused_runner, runner
from harness.judging.cases import backward_catalogue, catalogue
from harness.judging.fused_cases import fused_backward_catalogue, fused_catalogue
from harness.judging.fused_inputs import make_fused_dy, make_fused_inputs
from harness.judging.inputs import make_dy, make_inputs
from harness.repro import generate
from harness.repro.target import Target
from impls import registry

registry.load_all()
SMALL = 2**18  # elements: the larger quick cases draw the same code at more cost


def _namespace(case, fused: bool, backward: bool) -> dict:
    kernel = registry.get(case.op, "torch", "fused" if fused else "eager")
    ns: dict = {"__name__": "repro"}
    exec(compile(generate(Target("-", "-", case, kernel, fused, backward, "cpu")), "repro.py", "exec"), ns)
    return ns


def _same(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride() and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _small(cases):
    """One case of each way of drawing (the fields the drawing code branches on), small ones."""
    seen, out = set(), []
    for c in cases:
        key = (c.op, c.dtype, c.dist, c.affine, bool(c.row_pad), len(c.shape), c.dy_dist,
               *(getattr(c, f, None) for f in ("residual_dtype", "write", "adjacent", "weight_offset", "weight_dist",
                                                "out_dtype")))
        if c.rows * (c.n + c.row_pad) <= SMALL and key not in seen:
            seen.add(key)
            out.append(c)
    return out


@pytest.mark.parametrize("case", _small(catalogue("quick")) + _small(backward_catalogue("quick")), ids=lambda c: c.id)
def test_plain_draws_are_the_harness_draws(case):
    ns = _namespace(case, False, case.dy_dist is not None)
    x, storage, weight, bias = ns["draw_inputs"]()
    want = make_inputs(case, "cpu")
    assert _same(storage, want.storage) and _same(x, want.x) and _same(weight, want.weight) and _same(bias, want.bias)
    if case.dy_dist is not None:
        dy, dy_storage = ns["draw_dy"]()
        want_dy, want_storage = make_dy(case, "cpu")
        assert _same(dy, want_dy) and _same(dy_storage, want_storage)


@pytest.mark.parametrize("case", _small(fused_catalogue("quick")) + _small(fused_backward_catalogue("quick")),
                         ids=lambda c: c.id)
def test_fused_draws_are_the_harness_draws(case):
    backward = case.dy_dist is not None
    ns = _namespace(case, True, backward)
    buffers, views, weight, bias = ns["draw_inputs"]()
    want = make_fused_inputs(case, "cpu")
    assert buffers.keys() == want.buffers.keys() and all(_same(buffers[k], want.buffers[k]) for k in buffers)
    assert _same(views["x"][1], want.x) and _same(views.get("residual", (0, None))[1], want.residual)
    assert _same(weight, want.weight) and _same(bias, want.bias)
    if backward:
        dy, dres = ns["draw_fused_dy"]()
        want_dy, want_dres = make_fused_dy(case, "cpu")
        assert _same(dy, want_dy) and _same(dres, want_dres)


def _run(tmp_path, target) -> list[str]:
    path = tmp_path / "repro.py"
    path.write_text(generate(target))
    got = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300)
    assert got.returncode in (0, 1), got.stderr
    return got.stdout.splitlines()[:-1]


def test_the_backward_judging_is_the_harness_judging(tmp_path):
    """torch.eager's CPU LayerNorm backward sums db in bfloat16 (docs/checks.md, *Found by it*)."""
    case = next(c for c in backward_catalogue("quick") if c.id == "layer_norm-bfloat16-17x4097-large_mean-dynormal")
    kernel = registry.get("layer_norm", "torch", "eager")
    result = runner.check_backward(kernel, case)
    assert not result.ok
    assert _run(tmp_path, Target("-", "test_backward", case, kernel, False, True, "cpu")) == [
        e.summary() for e in result.errors]


def test_the_fused_backward_judging_is_the_harness_judging(tmp_path):
    case = next(c for c in fused_backward_catalogue("quick") if c.op == "add_rms_norm" and c.dtype == "bfloat16")
    kernel = registry.get(case.op, "torch", "fused")
    result = fused_runner.check_fused_backward(kernel, case)
    assert _run(tmp_path, Target("-", "test_fused_backward", case, kernel, True, True, "cpu")) == [
        e.summary() for e in result.errors]
