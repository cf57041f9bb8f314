"""docs/findings/: every file is a repro the current generator writes, and each one's inputs,
float64 reference and allowance run on the CPU (a GPU finding's inputs drawn on the CPU here): the
reference judged against itself is within its allowance. The call itself needs its library and
card (docs/findings/README.md says where each has run)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

FINDINGS = Path(__file__).resolve().parents[1] / "docs" / "findings"
FILES = sorted(FINDINGS.glob("*.py"))


def test_the_findings_page_lists_every_repro():
    page = (FINDINGS / "README.md").read_text()
    assert FILES and all(f"]({f.name})" in page for f in FILES)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_a_finding_s_reference_and_allowance_run_on_cpu_inputs(path):
    text = path.read_text()
    compile(text, str(path), "exec")
    head = text.split("# -- the call:")[0].replace("DEVICE = 'cuda'", "DEVICE = 'cpu'")
    ns: dict = {"__name__": "finding"}
    exec(compile(head, str(path), "exec"), ns)
    if "reference_fused" in ns:
        buffers, views, weight, bias = ns["draw_inputs"]()
        x, residual = views["x"][1], views["residual"][1] if "residual" in views else None
        (y, mean, rstd), exact, w_eff = ns["reference_fused"](x, residual, weight, bias, ns["EPS"])
        if "draw_fused_dy" in ns:
            dy, _ = ns["draw_fused_dy"]()
            src = x if residual is None else (x.double() + residual.double()).to(ns["RESIDUAL_OUT_DTYPE"])
            ref = ns["reference_backward"](ns["BASE_OP"], src, dy, w_eff, bias, ns["EPS"])
            floors = ns["backward_floors"](ns["BASE_OP"], src, dy, w_eff, ns["EPS"], ns["STAT_DTYPE"])
            found = ns["compare_grads"](ref, ref, floors, ns["DTYPE"])
        elif ns["OUT_DTYPE"] is not None:
            fmt, top = ns["OUT_DTYPE"], torch.finfo(ns["OUT_DTYPE"]).max
            got = (y / ns["SCALE"]).clamp(-top, top).float().to(fmt)
            found = [ns["fp8_compare"](got, y, ns["SCALE"], fmt, "nan", 0.0)]
        else:
            found = ns["compare_outputs"](ns["BASE_OP"], y, mean, rstd, (y, mean, rstd), ns["DTYPE"], ns["STAT_DTYPE"], w_eff)
    elif "draw_dy" in ns:
        x, _, weight, bias = ns["draw_inputs"]()
        dy, _ = ns["draw_dy"]()
        ref = ns["reference_backward"](ns["OP"], x, dy, weight, bias, ns["EPS"])
        found = ns["compare_grads"](ref, ref, ns["backward_floors"](ns["OP"], x, dy, weight, ns["EPS"], ns["STAT_DTYPE"]),
                                    ns["DTYPE"])
    else:
        x, _, weight, bias = ns["draw_inputs"]()
        y, mean, rstd = ns["reference"](ns["OP"], x, weight, bias, ns["EPS"])
        found = ns["compare_outputs"](ns["OP"], y, mean, rstd, (y, mean, rstd), ns["DTYPE"], ns["STAT_DTYPE"], weight)
    assert found and not any(failed for _, failed in found), found
