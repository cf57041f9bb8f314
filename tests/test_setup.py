"""Set-up: the doctor names what can run here and why not, a kernel that needs an aten operator
this torch lacks is skipped with that reason, and the declared ranges are what CI tests."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.judging import runner
from harness.judging.cases import catalogue
from impls import base, registry

ROOT = Path(__file__).resolve().parents[1]


def doctor(*args):
    proc = subprocess.run([sys.executable, "-m", "harness.doctor", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_doctor_names_every_backend_and_why_not_on_a_cpu_machine():
    if torch.cuda.is_available():
        pytest.skip("written for the CPU machine (CI); on a GPU the statuses differ")
    text = doctor()
    assert len(text.splitlines()) <= 40  # one screen
    doc = json.loads(doctor("--json"))
    machine = {m["item"]: m for m in doc["machine"]}
    assert machine["torch"]["state"].startswith(torch.__version__)
    assert machine["gpu"]["state"] == "none visible" and machine["gpu"]["fix"]
    assert "interpreter mode" in machine["triton"]["state"]
    assert {"python", "nvcc", "tilelang", "pytest-xdist"} <= set(machine)
    rows = {b["backend"]: b for b in doc["backends"]}
    assert set(registry.BUILTIN_MODULES and ("torch", "triton", "tilelang", "apex", "torch_compile", "liger")) <= set(rows)
    assert rows["torch"]["runs"] == "yes" and rows["torch"]["device"] == "cpu"
    assert rows["triton"]["runs"] == "partly" and any("interpreter" in w for w in rows["triton"]["why_not"])
    assert rows["apex"]["runs"] == "no" and "fused_layer_norm_cuda" in rows["apex"]["why_not"][0]
    tilelang = rows["tilelang"]["why_not"][0]
    assert "compiled for sm_90, not executed" in tilelang or "pip install" in tilelang
    assert rows["liger"]["load"] == "--backend-file examples/liger_backend.py --backend liger"
    assert "liger-kernel" in rows["liger"]["why_not"][0]
    for row in rows.values():  # every backend that cannot run says why
        assert row["runs"] == "yes" or row["why_not"]


def test_a_missing_aten_operator_skips_the_kernel_with_that_reason(monkeypatch):
    registry.load_all()
    kernel = registry.get("rms_norm", "torch", "eager")
    assert kernel.requires_torch_ops == ("_fused_rms_norm",)
    from impls import contract

    real = contract.torch_has_op
    monkeypatch.setattr(contract, "torch_has_op", lambda name: name != "_fused_rms_norm" and real(name))
    why = kernel.unavailable()
    assert why.startswith(f"torch {torch.__version__} lacks aten._fused_rms_norm") and "newer torch" in why
    case = next(c for c in catalogue("quick") if c.op == "rms_norm")
    assert runner.check(kernel, case).skipped == why  # skipped with the reason, never a crash in the call
    with pytest.raises(base.UnsupportedCase, match="lacks aten._fused_rms_norm"):
        kernel(torch.ones(2, 8), None, None, 1e-6)
    assert registry.get("layer_norm", "torch", "eager").unavailable() is None  # the other op still runs
    from harness.running.run import backend_status

    note, why_backend = backend_status(registry.kernels(["torch"]))["torch"]
    assert why_backend is None and "rms_norm torch.eager unavailable: torch" in note


def test_declared_ranges_are_the_ones_ci_tests():
    from harness.doctor import declared_range

    assert declared_range("triton") == "<3.10,>=3.6"
    assert declared_range("tilelang") == "==0.1.15"
    ci = (ROOT / ".ci" / "run").read_text()
    assert "triton-range" in ci  # the range's ends, each in its own virtual environment


CPU_TORCH_INDEX = ("--index-url", "https://download.pytorch.org/whl/cpu")


def _commands(text: str) -> list[list[str]]:
    """The shell commands of ``text`` (one a line or joined by &&), split as the shell would, with
    pip called as ``pip`` and its -q dropped."""
    import shlex

    out = []
    for line in text.splitlines():
        line = line.split(" #")[0].strip()
        if not line or line.startswith("#"):
            continue
        for part in line.split("&&"):
            words = [w for w in shlex.split(part) if w != "-q"]
            if words[:3] == ["python", "-m", "pip"]:
                words = words[2:]
            out.append(words)
    return out


def test_ci_installs_what_the_readme_cpu_set_up_says():
    """.ci/run installs with the README's CPU commands, word for word, but for torch's index URL: a
    user's `pip install torch==2.13.0` from PyPI is the multi-GB CUDA build, so the README takes
    torch from PyTorch's CPU index, which the CI machine cannot reach (its CPU wheel is local). The
    same project install follows, naming its Triton (a CPU torch pins none), then the doctor."""
    import re

    readme = (ROOT / "README.md").read_text()
    block = re.search(r"\*\*CPU only\*\*.*?```sh\n(.*?)```", readme, re.S).group(1)
    documented = _commands(block)
    ci_text = (ROOT / ".ci" / "run").read_text()
    ci_setup = ci_text[:ci_text.index("python -m harness.doctor") + len("python -m harness.doctor")]
    ci = [c for c in _commands(ci_setup) if c[:2] == ["pip", "install"] or c[:3] == ["python", "-m", "harness.doctor"]]
    ci = [c for c in ci if c != ["pip", "install", "--upgrade", "pip"]]  # pip itself, nothing of the project's
    torch_line = documented[0]
    assert torch_line[:3] == ["pip", "install", "torch==2.13.0"] and "--index-url" in torch_line, documented
    i = torch_line.index("--index-url")
    assert tuple(torch_line[i:i + 2]) == CPU_TORCH_INDEX
    assert "--index-url" not in ci[0] and "--extra-index-url" not in ci[0], ci[0]
    assert [torch_line[:i] + torch_line[i + 2:], *documented[1:]] == ci, (documented, ci)
    # The one Triton named (a CPU torch pins none) is inside the declared range, and the README says which.
    from packaging.specifiers import SpecifierSet

    from harness.doctor import declared_range

    pins = [w.removeprefix("triton==") for c in documented for w in c if w.startswith("triton")]
    assert len(pins) == 1 and pins[0] in SpecifierSet(declared_range("triton")), pins
    assert f"Triton {pins[0]}" in readme
