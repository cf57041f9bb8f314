"""The fused family's property and drawn checks (harness/test_fused_properties.py,
harness/test_fuzz.py::test_fused_fuzz) catch what they are for: each planted bug below, in the
eager fused composition (impls.torch_fused) and nothing else changed, passes the oracle on the
cases its check runs, and fails that check alone; the honest composition passes them all.

- a batch statistic (the row scaled by the batch's largest |x + residual| before its sum of
  squares, as an overflow-safe kernel might) and a reduction order chosen by M: batch-variant;
- tiny random noise in rstd, and in dw: nondeterministic (forward, backward);
- dx's row sums in another order above 8 rows: batch-variant backward;
- y's last 3 columns not normalised where N % 16 == 3, a residue no catalogue case has: found by
  the drawn cases alone.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

from harness.judging import fused_properties, properties
from harness.judging.fused_cases import fused_catalogue
from harness.judging.fused_runner import check_fused
from impls.fused import FusedOutputs
from impls.torch_fused import TorchAddRMSNorm, quantize_fp8

ROOT = Path(__file__).resolve().parents[1]
M_SPLIT = 8  # the reduction-order bugs change order above this many rows


def _write(out: FusedOutputs, s: torch.Tensor, y: torch.Tensor, rstd: torch.Tensor, params) -> None:
    out.residual_out.copy_(s.to(out.residual_out.dtype))
    out.y.copy_(y.to(out.y.dtype) if params.out_dtype is None else quantize_fp8(y, params))
    out.rstd.copy_(rstd.view(-1))


def _rms(s: torch.Tensor, ms: torch.Tensor, weight, eps: float, offset: float) -> tuple[torch.Tensor, torch.Tensor]:
    rstd = torch.rsqrt(ms + eps)
    y = s * rstd
    return (y if weight is None else y * (weight.float() + offset)), rstd


class BatchScaled(TorchAddRMSNorm):
    """Scales the rows by the batch's largest |x + residual| before the sum of squares."""
    backend, variant, batch_invariant = "fusedbug", "batch_scaled", True

    def _forward(self, x, residual, weight, bias, eps, params, out):
        s = x.float() + residual.float()
        top = s.abs().amax().clamp_min(1e-30)
        y, rstd = _rms(s, (s / top).square().mean(-1, keepdim=True) * top * top, weight, eps, params.weight_offset)
        _write(out, s, y, rstd, params)


class OrderByM(TorchAddRMSNorm):
    """Above M_SPLIT rows, the sum of squares in blocks of 64 columns, then the blocks."""
    backend, variant, batch_invariant = "fusedbug", "order_by_m", True

    def _forward(self, x, residual, weight, bias, eps, params, out):
        s = x.float() + residual.float()
        sq = s.square()
        if s.shape[0] > M_SPLIT:
            pad = torch.nn.functional.pad(sq, (0, -sq.shape[1] % 64))
            total = pad.view(sq.shape[0], -1, 64).sum(-1).sum(-1, keepdim=True)
        else:
            total = sq.sum(-1, keepdim=True)
        y, rstd = _rms(s, total / s.shape[1], weight, eps, params.weight_offset)
        _write(out, s, y, rstd, params)


class Noisy(TorchAddRMSNorm):
    """rstd times 1 + up to 2**-22, drawn anew each call."""
    backend, variant = "fusedbug", "noisy"

    def _forward(self, x, residual, weight, bias, eps, params, out):
        s = x.float() + residual.float()
        y, rstd = _rms(s, s.square().mean(-1, keepdim=True), weight, eps, params.weight_offset)
        noise = 1 + 2.0**-22 * torch.rand(rstd.shape, device=rstd.device)
        _write(out, s, y * noise, rstd * noise, params)


class NoisyBackward(TorchAddRMSNorm):
    """dw times 1 + up to 2**-22, drawn anew each call."""
    backend, variant = "fusedbug", "noisy_backward"

    def _backward(self, src, weight, bias, dy, d_residual_out, saved, eps, weight_offset, out):
        super()._backward(src, weight, bias, dy, d_residual_out, saved, eps, weight_offset, out)
        if out.dw is not None:
            out.dw.mul_(1 + 2.0**-22 * torch.rand(out.dw.shape, device=out.dw.device))


class BackwardOrderByM(TorchAddRMSNorm):
    """Above M_SPLIT rows, dx's row dot product sum(g * x^) in blocks of 64 columns."""
    backend, variant, backward_batch_invariant = "fusedbug", "backward_order_by_m", True

    def _backward(self, src, weight, bias, dy, d_residual_out, saved, eps, weight_offset, out):
        super()._backward(src, weight, bias, dy, d_residual_out, saved, eps, weight_offset, out)
        if src.shape[0] <= M_SPLIT:
            return
        s = src.float()
        rstd = torch.rsqrt(s.square().mean(-1, keepdim=True) + eps)
        xh = s * rstd
        g = dy.float() * (1.0 if weight is None else weight.float() + weight_offset)
        prod = torch.nn.functional.pad(g * xh, (0, -s.shape[1] % 64))
        dot = prod.view(s.shape[0], -1, 64).sum(-1).sum(-1, keepdim=True) / s.shape[1]
        dx = rstd * (g - xh * dot) + (0 if d_residual_out is None else d_residual_out.float())
        out.dx.copy_(dx)
        out.dresidual.copy_(dx)


class Tail16(TorchAddRMSNorm):
    """Where N % 16 == 3, y's last 3 columns are x + residual, not normalised."""
    backend, variant = "fusedbug", "tail16"

    def _forward(self, x, residual, weight, bias, eps, params, out):
        s = x.float() + residual.float()  # before the call below writes them (in place)
        super()._forward(x, residual, weight, bias, eps, params, out)
        n = s.shape[1]
        if n % 16 == 3:
            out.y[:, n - 3:].copy_(s[:, n - 3:].to(out.y.dtype))


class Control(TorchAddRMSNorm):
    """The honest composition, claiming both invariances."""
    backend, variant, batch_invariant, backward_batch_invariant = "fusedbug", "control", True, True


FORWARD = {BatchScaled: "test_fused_batch_invariant", OrderByM: "test_fused_batch_invariant",
           Noisy: "test_fused_deterministic", Tail16: "test_fused_fuzz"}
BACKWARD = {NoisyBackward: "test_fused_backward_deterministic", BackwardOrderByM: "test_fused_backward_batch_invariant"}


def _pairs(kernel) -> dict[str, list]:
    return fused_properties.property_pairs("quick", [kernel])


def test_bit_diffs_compare_fp8():
    y = torch.tensor([1.0, 2.0, -0.5]).to(torch.float8_e4m3fn)
    moved = y.clone()
    moved.view(torch.int8)[1] += 1  # the next fp8 value
    d, = properties.bit_diffs(FusedOutputs(y=y), FusedOutputs(y=moved))
    assert (d.output, d.differ, d.max_ulps) == ("y", 1, 1)


def test_each_check_runs_in_every_declared_convention():
    kernel = TorchAddRMSNorm()
    pairs = _pairs(kernel)
    for fixture in ("fused_determinism_case", "fused_batch_case"):
        assert {c.write for c, _ in pairs[fixture]} == set(kernel.writes), fixture
    for fixture in ("fused_backward_determinism_case", "fused_backward_batch_case"):  # residual_out new or in residual
        assert {c.write for c, _ in pairs[fixture]} == {"new", "in_place"}, fixture


def test_the_forward_bugs_pass_the_oracle_where_their_checks_run():
    for planted in FORWARD:
        kernel = planted()
        pairs = _pairs(kernel)
        for case, _ in pairs["fused_determinism_case"] + pairs["fused_batch_case"]:
            result = check_fused(kernel, case)
            assert result.ok, f"{planted.variant}: {result.failure_message()}"


def test_the_drawn_bug_is_beyond_the_catalogue():
    """Tail16 passes every quick catalogue case of its op: only a draw finds it."""
    kernel = Tail16()
    for case in fused_catalogue("quick"):
        if case.op == kernel.op:
            assert case.n % 16 != 3
            assert check_fused(kernel, case).ok, case.id


def test_each_bug_caught_in_process():
    """Each property bug fails its own check on the quick profile's cases, its twin passes."""
    for planted, test in {**FORWARD, **BACKWARD}.items():
        if test == "test_fused_fuzz":
            continue
        backward = "backward" in test
        for honest in (False, True):
            kernel = Control() if honest else planted()
            fixture = ("fused_backward_" if backward else "fused_") + ("batch_case" if "batch" in test else
                                                                      "determinism_case")
            caught = any(_fails(test, kernel, case) for case, _ in _pairs(kernel)[fixture])
            assert caught != honest, f"{kernel.name} on {test}: caught={caught}"


def _fails(test: str, kernel, case) -> bool:
    if "batch" in test:
        judge = fused_properties.backward_batch_invariance if "backward" in test else fused_properties.batch_invariance
        result = judge(kernel, case, "cpu", quick=True)
        return not result.invariant and not result.nondeterministic
    judge = fused_properties.backward_determinism if "backward" in test else fused_properties.determinism
    return bool(judge(kernel, case, "cpu"))


PLUGIN = textwrap.dedent('''
    from impls.registry import register
    from tests.test_fused_properties import BACKWARD, FORWARD, Control

    for cls in (*FORWARD, *BACKWARD, Control):
        register(cls())
''')


def test_the_harness_fails_each_bug_in_its_own_check_and_reports_it(tmp_path):
    plugin = tmp_path / "fusedbugs.py"
    plugin.write_text(PLUGIN)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "harness/test_fused_properties.py", "harness/test_fuzz.py", "-q", "-n", "0",
         "-p", "no:randomly", "--backend-file", str(plugin), "--backend", "fusedbug", "--profile", "quick",
         "--report-dir", str(tmp_path / "run")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((tmp_path / "run" / "correctness.json").read_text())
    failed = {(r["test"], r["kernel"]) for r in doc["records"] if r["outcome"] == "failed"}
    assert failed == {(test, f"fusedbug.{cls.variant}") for cls, test in {**FORWARD, **BACKWARD}.items()}, failed
    assert {r["outcome"] for r in doc["records"]} <= {"passed", "failed", "skipped"}  # no harness error
    kinds = {r["kernel"]: r.get("failure_kind") for r in doc["records"] if r["outcome"] == "failed"
             and r["test"] != "test_fused_fuzz"}
    assert kinds == {"fusedbug.batch_scaled": "batch-variant", "fusedbug.order_by_m": "batch-variant",
                     "fusedbug.noisy": "nondeterministic", "fusedbug.noisy_backward": "nondeterministic",
                     "fusedbug.backward_order_by_m": "batch-variant"}, kinds
    drawn = next(r for r in doc["records"] if r["outcome"] == "failed" and r["test"] == "test_fused_fuzz")
    assert int(drawn["drawn_case"].split("-")[2].split("x")[-1]) % 16 == 3, drawn["drawn_case"]
    md = (tmp_path / "run" / "correctness.md").read_text()
    assert "## Determinism" in md and "## Batch invariance" in md
    assert "| fusedbug.order_by_m | invariant | no" in md and "| fusedbug.control | invariant | yes" in md


def test_fused_property_checks_peak_within_their_estimates(tmp_path):
    """The simulated card (as tests/test_fused_estimates.py): every property and drawn check of
    the eager composition peaks within its estimate (harness/running/estimate.py)."""
    args = [sys.executable, "-m", "pytest", "harness/test_fused_properties.py", "harness/test_fuzz.py", "--backend",
            "torch", "-n", "0", "-q", "-p", "no:randomly", "--simulate-gpu", "24GiB", "-k", "fused",
            "--report-dir", str(tmp_path)]
    ran = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    records = json.loads((tmp_path / "correctness.json").read_text())["records"]
    measured = [r for r in records if r.get("mem_peak") is not None]
    assert {r["test"] for r in measured} == {"test_fused_deterministic", "test_fused_backward_deterministic",
                                             "test_fused_batch_invariant", "test_fused_backward_batch_invariant",
                                             "test_fused_fuzz"}
    over = [(r["nodeid"], r["mem_peak"], r["mem_estimate"]) for r in measured if r["mem_peak"] > r["mem_estimate"]]
    assert not over, over
