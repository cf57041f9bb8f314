"""A kernel author's first hour, run as they would run it: a subprocess, a temporary directory as
the working directory, their plug-in file outside the repository.

- ``--backend-file PATH`` works from any directory (the installed pytest11 entry point,
  harness/entry.py), for the checks and the benchmarks, and leaves other projects' runs alone;
- ``normdiff.rms_norm`` / ``layer_norm`` in a plain script run the kernel the docs name (Triton
  under its interpreter without a GPU) whatever the script imported first, or warn once naming
  the kernel that ran;
- a plug-in kernel that runs Triton under the interpreter gets the built-ins' benchmark reason
  (examples/triton_rms_backend.py is the plug-in).
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from impls import registry

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "triton_rms_backend.py"
NOT_A_TIMING = "triton runs under its interpreter on this machine: not a timing"

pytest.importorskip("triton")


def _env() -> dict:
    """The environment a user's shell has: no interpreter chosen, no project on the path."""
    drop = ("TRITON_INTERPRET", "PYTHONPATH", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER")
    return {k: v for k, v in os.environ.items() if k not in drop}


def _run(args: list[str], cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def outside(tmp_path) -> tuple[Path, Path]:
    """(a working directory, the author's plug-in file in a folder of its own), both outside the
    repository."""
    work, plug = tmp_path / "work", tmp_path / "myplug" / "my_triton_rms.py"
    work.mkdir()
    plug.parent.mkdir()
    shutil.copy(EXAMPLE, plug)
    return work, plug


# -- 1. plug-ins from anywhere -------------------------------------------------------------------
def test_the_installed_project_declares_the_pytest_entry_point():
    found = [ep for ep in importlib.metadata.entry_points(group="pytest11") if ep.value == "harness.entry"]
    assert found, "reinstall the project (pip install -e .): its pytest11 entry point is missing"


def test_the_checks_run_from_another_directory(outside, tmp_path):
    """`pytest harness --backend-file PATH` (space form) from a directory without the project."""
    work, plug = outside
    r = _run(["-m", "pytest", "harness", "--backend-file", str(plug), "--backend", "mytriton",
              "--report-dir", str(tmp_path / "checks"), "-n", "0", "-k", "test_differential and 4096"], work)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"rootdir: {ROOT}" in r.stdout and "configfile: pyproject.toml" in r.stdout
    assert "mytriton: triton" in r.stdout and "under the interpreter" in r.stdout
    doc = json.loads((tmp_path / "checks" / "correctness.json").read_text())
    ran = [rec for rec in doc["records"] if rec.get("kernel") == "mytriton.rowwise" and rec.get("outcome") == "passed"]
    assert ran, doc["records"][:3]


def test_the_benchmarks_run_from_another_directory_and_skip_interpreted_timings(outside, tmp_path):
    """`pytest --benchmark-only --backend-file PATH --backend NAME`, no test path: the project's
    benchmarks, each row skipped with the reason the built-in Triton kernels give."""
    work, plug = outside
    r = _run(["-m", "pytest", "--benchmark-only", "--backend-file", str(plug), "--backend", "mytriton",
              "--report-dir", str(tmp_path / "bench")], work)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "benchmarks/test_bench.py" in r.stdout and "passed" not in r.stdout.splitlines()[-1]
    assert f": {NOT_A_TIMING}" in r.stdout, r.stdout[-2000:]
    assert not list(work.iterdir()), "the run wrote into the working directory"


def test_the_option_alone_with_equals_runs_the_checks(outside, tmp_path):
    work, plug = outside
    r = _run(["-m", "pytest", f"--backend-file={plug}", "--backend", "mytriton", "--collect-only", "-q",
              "--report-dir", str(tmp_path / "c")], work)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ids = [line for line in r.stdout.splitlines() if "::" in line]
    assert ids and all(line.startswith("harness/") for line in ids), ids[:5]
    assert any("mytriton.rowwise" in line for line in ids)


def test_other_projects_runs_are_left_alone(tmp_path):
    """A project with its own configuration and its own --backend-file option: the entry point
    neither acts nor loads anything of normdiff's."""
    project = tmp_path / "other"
    project.mkdir()
    (project / "pyproject.toml").write_text("[tool.pytest.ini_options]\naddopts = \"-p no:cacheprovider\"\n")
    (project / "conftest.py").write_text(textwrap.dedent("""
        def pytest_addoption(parser):
            parser.addoption("--backend-file", default=None)
    """))
    (project / "test_mine.py").write_text(textwrap.dedent("""
        import sys

        def test_nothing_of_normdiff_is_loaded(pytestconfig):
            assert pytestconfig.getoption("backend_file") == "x.py"
            assert str(pytestconfig.rootpath) == %r
            loaded = [m for m in ("harness.plugin", "harness.bench", "impls", "normdiff") if m in sys.modules]
            assert not loaded, loaded
    """ % str(project)))
    r = _run(["-m", "pytest", "test_mine.py", "--backend-file", "x.py", "-p", "no:xdist"], project)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "1 passed" in r.stdout


# -- 2. the public API runs the kernel its docs name ---------------------------------------------
SCRIPT = """
import json, warnings
import torch
{first}
import normdiff

from impls.triton import _launch
launched = []
for method in ("launch", "_bwd_launch"):  # every Triton launch, forward and backward, by kernel name
    def counted(self, name, *a, _run=getattr(_launch.TritonKernel, method), **kw):
        launched.append(name)
        return _run(self, name, *a, **kw)
    setattr(_launch.TritonKernel, method, counted)
warnings.simplefilter("error", normdiff.KernelFallbackWarning)

x = torch.randn(6, 200, requires_grad=True)
w = torch.rand(200, requires_grad=True)
y = normdiff.rms_norm(x, w)
y.sum().backward()
ln = normdiff.layer_norm(x.detach(), kernel="triton.rowwise")
ref = torch.nn.functional.rms_norm(x.detach(), (200,), w.detach(), eps=1e-6)
print(json.dumps({{"auto": normdiff.kernel_name("rms_norm"), "named": normdiff.kernel_name("layer_norm", "triton.rowwise"),
                  "interpreted": _launch.state().interpreted, "launched": launched,
                  "error": (y - ref).abs().max().item(), "grad": bool(x.grad.abs().sum() > 0)}}))
"""


@pytest.mark.parametrize("first", ["", "import triton", "import triton.language as tl\nimport torch._dynamo"],
                         ids=["torch-first", "triton-first", "triton-language-and-dynamo-first"])
def test_a_users_script_runs_triton_under_the_interpreter(tmp_path, first):
    if __import__("torch").cuda.is_available():
        pytest.skip("with a GPU the kernels run compiled: the interpreter's case is the CPU's")
    (tmp_path / "mine.py").write_text(SCRIPT.format(first=first))
    r = _run(["mine.py"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["auto"] == "triton.invariant" and got["named"] == "triton.rowwise" and got["interpreted"]
    # the forward of auto, its backward, and the named LayerNorm all launched Triton kernels
    assert any(n.startswith("rms_norm") for n in got["launched"]), got["launched"]
    assert any(n.startswith("layer_norm") for n in got["launched"]), got["launched"]
    assert any("bwd" in n for n in got["launched"]), got["launched"]
    assert got["error"] < 1e-5 and got["grad"]


FALLBACK = """
import warnings
import torch
{first}
import normdiff

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for _ in range(3):
        normdiff.rms_norm(torch.randn(4, 64))
print(normdiff.kernel_name("rms_norm"))
print(len(caught), caught[0].category.__name__ if caught else "", caught[0].message if caught else "")
try:
    normdiff.rms_norm(torch.randn(4, 64), kernel="triton.rowwise")
except RuntimeError as exc:
    print("refused:", exc)
"""


@pytest.mark.parametrize("first,why", [
    ('import sys; sys.modules["triton"] = None', "triton not importable"),
    ("import triton, impls.triton; impls.triton.availability()", "TRITON_INTERPRET=1"),
], ids=["no-triton", "kernels-already-compiled"])
def test_where_triton_cannot_run_auto_warns_once_naming_the_kernel_that_ran(tmp_path, first, why):
    if __import__("torch").cuda.is_available():
        pytest.skip("with a GPU triton.invariant runs compiled")
    (tmp_path / "mine.py").write_text(FALLBACK.format(first=first))
    r = _run(["mine.py"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    name, warned, refused = r.stdout.strip().splitlines()[-3:]
    assert name == "torch.eager"
    assert warned.startswith("1 KernelFallbackWarning") and "runs torch.eager" in warned and why in warned, warned
    assert refused.startswith("refused:") and "triton.rowwise" in refused and why in refused, refused


# -- 3. a Triton plug-in's interpreted timings ---------------------------------------------------
def test_an_interpreted_triton_plug_in_gets_the_builtins_benchmark_reason():
    import impls.triton

    registry.load_builtins()
    if impls.triton.availability() is not None or not impls.triton._launch.state().interpreted:
        pytest.skip(f"the built-in Triton kernels do not run interpreted here: {impls.triton.availability()}")
    builtin = registry.get("rms_norm", "triton", "rowwise").bench_unavailable()
    assert builtin == NOT_A_TIMING == registry.INTERPRETED
    registry.load_file(EXAMPLE)
    try:
        assert registry.get("rms_norm", "mytriton").bench_unavailable() == builtin
    finally:
        registry.unregister("mytriton")


def test_the_reason_follows_what_a_kernel_runs():
    """Declaring triton in ``packages`` counts while the interpreter is on; a kernel without
    Triton, or with its own ``bench_unavailable``, is left as it is."""
    import triton

    from impls.base import NormKernel

    class Declared(NormKernel):
        op, backend, variant, packages = "rms_norm", "first_hour_declared", "x", ("triton",)

    class Plain(NormKernel):
        op, backend, variant = "rms_norm", "first_hour_plain", "x"

    class Own(Declared):
        backend = "first_hour_own"

        def bench_unavailable(self):
            return "its own reason"

    try:
        for cls in (Declared, Plain, Own):
            registry.register(cls)
        on = bool(triton.knobs.runtime.interpret)
        assert registry.get("rms_norm", "first_hour_declared").bench_unavailable() == (NOT_A_TIMING if on else None)
        assert registry.get("rms_norm", "first_hour_plain").bench_unavailable() is None
        assert registry.get("rms_norm", "first_hour_own").bench_unavailable() == "its own reason"
    finally:
        for name in ("first_hour_declared", "first_hour_plain", "first_hour_own"):
            registry.unregister(name)
