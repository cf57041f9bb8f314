"""Standalone repros (harness.repro) of planted bugs (tests/plugins/repro_planted.py), run where the
project cannot be imported: a Python with torch's site-packages and nothing of normdiff (no
editable-install hook, no .pth, not the repository on the path; the test proves ``import impls``,
``import harness`` and ``import normdiff`` fail there). Each prints the same worst error and "x
allowed" as the harness's check, and exits 1; its honest twin exits 0."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.judging import fused_runner, runner
from harness.repro import generate, resolve

PLUGIN = str(Path(__file__).parent / "plugins" / "repro_planted.py")
PROJECT = {"impls", "harness", "normdiff", "tools", "examples", "benchmarks"}


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory):
    """Runs a file with a Python that sees torch's site-packages but nothing of the project."""
    site = Path(torch.__file__).resolve().parents[1]
    root = tmp_path_factory.mktemp("bare")
    lib = root / "site"
    lib.mkdir()
    for entry in site.iterdir():
        if entry.suffix == ".pth" or "normdiff" in entry.name or "__editable__" in entry.name or entry.name in PROJECT:
            continue
        (lib / entry.name).symlink_to(entry)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "TRITON"))}
    env["PYTHONPATH"] = str(lib)

    def run(path: Path) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-S", "-s", str(path)], capture_output=True, text=True, env=env,
                              cwd=path.parent, timeout=300)

    probe = root / "probe.py"
    probe.write_text("import importlib, torch\nfor m in ('impls', 'harness', 'normdiff'):\n"
                     "    try:\n        importlib.import_module(m)\n        print('imported', m)\n"
                     "    except ImportError:\n        pass\n")
    got = run(probe)
    assert got.returncode == 0 and "imported" not in got.stdout, got.stdout + got.stderr
    return run


def _repro(tmp_path, node: str) -> tuple:
    target = resolve(node, [PLUGIN])
    path = tmp_path / "repro.py"
    path.write_text(generate(target, path.name))
    check = fused_runner.check_fused if target.fused else runner.check
    return target, path, check


def _lines(result) -> list[str]:
    return [f"guard: {f.summary()}" for f in result.findings] + [e.summary() for e in result.errors]


@pytest.mark.parametrize("node, fails", [
    ("rms_norm-bfloat16-3x1000-normal-reproplant.padded", True),
    ("rms_norm-bfloat16-3x1000-normal-reproplant.honest", False),
    ("add_rms_norm-bfloat16-17x1000-normal-inplace-reproplant.inplace", True),
    ("add_rms_norm-bfloat16-17x1000-normal-inplace-reproplant.inplace_honest", False),
    ("rms_norm-float32-3x7-normal-reproplant.lastcol", True),
])
def test_the_repro_prints_what_the_check_found(tmp_path, bare_python, node, fails):
    target, path, check = _repro(tmp_path, node)
    result = check(target.kernel, target.case)
    assert result.ok is not fails
    got = bare_python(path)
    assert got.returncode == (1 if fails else 0), got.stdout + got.stderr
    printed = got.stdout.splitlines()
    assert printed[:-1] == _lines(result)  # every output's worst error and "x allowed", every guard line
    imports = [ln.split()[1] for ln in path.read_text().splitlines() if ln.startswith(("import ", "from "))]
    assert not {m.split(".")[0] for m in imports} & PROJECT, imports


def test_the_exception_form_shows_the_call_and_its_message(tmp_path, bare_python):
    target, path, check = _repro(tmp_path, "rms_norm-float32-3x7-normal-reproplant.refuses")
    with pytest.raises(ValueError) as raised:
        check(target.kernel, target.case)
    got = bare_python(path)
    assert got.returncode == 1
    assert got.stdout.splitlines()[0] == f"the call raised ValueError: {raised.value}"
    assert "refusing_rms_norm(x, weight, eps)" in path.read_text()


def test_a_kernel_without_a_declared_call_imports_its_plug_in_and_says_so(tmp_path, monkeypatch):
    target = resolve("rms_norm-bfloat16-3x1000-normal-reproplant.padded", [PLUGIN])
    monkeypatch.setattr(type(target.kernel), "repro_call", lambda self: None)
    text = generate(target)
    assert "declares no standalone call" in text and "registry.load_file('tests/plugins/repro_planted.py')" in text
    path = tmp_path / "repro.py"
    path.write_text(text)
    got = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300)
    assert got.returncode == 1 and got.stdout.splitlines()[:-1] == _lines(runner.check(target.kernel, target.case))


def test_the_first_hour_s_planted_bug_gives_a_repro_with_the_triton_kernel_inline(tmp_path, bare_python):
    """README's first hour: the Triton example with its sum divided by BLOCK_N, under the interpreter."""
    from impls import registry

    mine = tmp_path / "my_rms.py"
    source = (Path(__file__).parents[1] / "examples" / "triton_rms_backend.py").read_text()
    planted = source.replace("tl.sum(x * x, axis=0) / N + eps", "tl.sum(x * x, axis=0) / BLOCK_N + eps")
    assert planted != source
    mine.write_text(planted)
    registry.unregister("mytriton")
    try:
        target = resolve("rms_norm-bfloat16-3x1000-normal-mytriton.rowwise", [str(mine)])
        path = tmp_path / "repro.py"
        path.write_text(generate(target, path.name))
        result = runner.check(target.kernel, target.case)
    finally:
        registry.unregister("mytriton")
    assert "/ BLOCK_N + eps" in path.read_text()
    got = bare_python(path)
    assert got.returncode == 1, got.stderr
    assert got.stdout.splitlines()[:-1] == _lines(result)
