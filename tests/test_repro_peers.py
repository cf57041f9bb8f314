"""Standalone repros (harness.repro) of the peers' kernels: every kernel of the plug-ins in
examples/ and of apex, torch.compile and TileLang declares its call (``repro_call``), or why it goes
through normdiff. A peer's repro imports torch and its library only: here, where the libraries are
not installed, it runs up to their import and stops there (exit 2) saying what to install.
torch.compile's library is torch, so its repros run whole; the in-place Triton example's repro of a
planted tail bug prints what the harness's check found, where the project cannot be imported
(tests/test_repro.py's bare Python)."""
from __future__ import annotations

import ast
import importlib.util
import sys
from collections import Counter
from pathlib import Path

import pytest

from harness.judging import fused_runner, runner
from harness.repro import generate, resolve
from impls import registry
from tests.test_repro import PROJECT, _lines, bare_python  # noqa: F401 (bare_python: the fixture)

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
PLUGINS = [str(EXAMPLES / f"{name}_backend.py") for name in ("liger", "quack", "flashinfer", "triton_fused")]
PEERS = ("liger", "quack", "flashinfer", "apex", "torch_compile", "tilelang", "myfused")
# Per peer: the module its repro imports first, what it says to install, and a plain, a fused and a
# backward check of it.
MISSING = {
    "liger": ("liger_kernel", "pip install liger-kernel==0.8.5", [
        "test_against_oracle[rms_norm-bfloat16-3x1000-normal-liger.fused]",
        "test_backward[layer_norm-bfloat16-17x1000-normal-dynormal-liger.fused]",
        "test_fused_against_oracle[add_rms_norm-bfloat16-17x1000-normal-liger.fused_add]",
        "test_fused_backward[add_rms_norm-bfloat16-17x129-normal-dynormal-liger.fused_add]"]),
    "quack": ("quack", "pip install quack-kernels==0.6.5 nvidia-cutlass-dsl==4.7.1", [
        "test_against_oracle[rms_norm-bfloat16-3x1000-normal-quack.default]",
        "test_backward[layer_norm-bfloat16-17x1000-normal-dynormal-quack.default]",
        "test_against_oracle[layer_norm-bfloat16-17x1000-normal-quack.tuned]",
        "test_fused_against_oracle[add_rms_norm-bfloat16-17x1000-normal-quack.residual]",
        "test_fused_backward[rms_norm-float32-17x1000-normal-w1-dynormal-quack.offset]"]),
    "flashinfer": ("flashinfer", "pip install flashinfer-python==0.7.2.post1 nvidia-cutlass-dsl==4.7.1", [
        "test_against_oracle[layer_norm-bfloat16-17x1000-normal-flashinfer.default]",
        "test_fused_against_oracle[add_rms_norm-bfloat16-17x1000-normal-inplace-flashinfer.fused_add]",
        "test_fused_against_oracle[rms_norm-bfloat16-17x1000-normal-e4m3s1-flashinfer.quant]",
        "test_fused_against_oracle[layer_norm-bfloat16-17x1000-normal-e4m3s1-flashinfer.layernorm_quant]"]),
    "apex": ("fused_layer_norm_cuda", "APEX_CUDA_EXT=1", [
        "test_against_oracle[rms_norm-bfloat16-3x1000-normal-apex.fused]",
        "test_backward[layer_norm-bfloat16-17x1000-normal-dynormal-apex.fused]"]),
}
TAIL_BUG = ("tl.store(xrow + cols, y.to(X.dtype.element_ty), mask=mask)",
            "tl.store(xrow + cols, y.to(X.dtype.element_ty), mask=mask & (cols < N - N % 8))")


@pytest.fixture(scope="module", autouse=True)
def plugins():
    registry.load_all(PLUGINS)


def imported(text: str) -> set[str]:
    """The top-level modules a repro imports: its import statements and importlib.import_module's."""
    names = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add(node.module or "")
        elif isinstance(node, ast.Call) and ast.unparse(node.func) == "importlib.import_module":
            names.add(node.args[0].value)
    return {n.split(".")[0] for n in names}


def assert_standalone(text: str) -> None:
    """Compiles, imports nothing of the project, and the plug-in's helpers copied in clash with none
    of the repro's own names."""
    compile(text, "repro.py", "exec")
    assert not imported(text) & PROJECT, imported(text)
    for word in ("import impls", "from impls", "import harness", "from harness", "import normdiff", "from normdiff"):
        assert word not in text
    tree = ast.parse(text)
    defined = Counter(n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)))
    assigned = {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    assert not [n for n, c in defined.items() if c > 1 or n in assigned], defined


def test_every_peer_kernel_declares_its_standalone_call():
    kernels = registry.kernels(list(PEERS), family=None)
    assert {k.backend for k in kernels} == set(PEERS)
    for k in kernels:
        decl = k.repro_call()
        assert decl is not None and decl.forward.strip(), k.name
        assert not k.has_backward or (decl.backward or "").strip(), f"{k.name}: a backward without its call"
        through_normdiff = bool(imported(decl.imports) & PROJECT)
        assert through_normdiff == (k.backend == "tilelang"), k.name
        assert not through_normdiff or decl.note, f"{k.name} imports normdiff without saying why"


def _missing(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):
        return True


@pytest.mark.parametrize("node", [n for _, _, nodes in MISSING.values() for n in nodes])
def test_a_peer_s_repro_runs_up_to_its_library_s_import(tmp_path, bare_python, node):
    module, install, _ = next(v for v in MISSING.values() if node in v[2])
    if not _missing(module):
        pytest.skip(f"{module} is installed here: the repro would run its call")
    target = resolve(node)
    text = generate(target, "repro.py")
    assert_standalone(text)
    assert module in imported(text) and "2 where the kernel's library does not import" in text
    path = tmp_path / "repro.py"
    path.write_text(text)
    got = bare_python(path)
    assert got.returncode == 2 and not got.stdout, got.stdout + got.stderr
    said = got.stderr.splitlines()
    assert said[0] == f"ModuleNotFoundError: No module named '{module}'", got.stderr
    assert install in said[1] and target.kernel.name in said[1]


def test_tilelang_s_repro_goes_through_normdiff_and_says_why():
    text = generate(resolve("test_against_oracle[rms_norm-bfloat16-3x1000-normal-tilelang.fragment]"))
    header = text.split('"""')[1]
    assert "The call goes through normdiff" in header and "registry.get('rms_norm', 'tilelang', 'fragment')" in text


@pytest.mark.parametrize("node", [
    "test_against_oracle[rms_norm-float32-3x7-normal-torch_compile.inductor]",
    "test_backward[layer_norm-bfloat16-3x100-normal-dynormal-torch_compile.inductor]",
])
def test_torch_compile_s_repro_compiles_the_same_function_and_prints_what_the_check_found(tmp_path, bare_python,
                                                                                       node):
    target = resolve(node)
    text = generate(target, "repro.py")
    assert_standalone(text)
    assert "torch.compile(_rms_norm" in text or "torch.compile(_layer_norm_y" in text
    path = tmp_path / "repro.py"
    path.write_text(text)
    result = (runner.check_backward if target.backward else runner.check)(target.kernel, target.case)
    got = bare_python(path)
    assert got.returncode == (0 if result.ok else 1), got.stdout + got.stderr
    assert got.stdout.splitlines()[:-1] == _lines(result)


def _restore(backend: str, path: str) -> None:
    """The example's kernels registered again after a planted copy of it took their name."""
    registry.unregister(backend)
    module = sys.modules[registry.plugin_module(path)]
    registry.register(module.MyFusedAddRMSNorm)


@pytest.mark.parametrize("planted", [True, False], ids=["tail_bug", "honest"])
def test_the_in_place_triton_example_s_repro_shows_what_the_check_found(tmp_path, bare_python, planted):
    """The example with its store of y masked short of the row's tail (N % 8 left as x was), or as
    it is: the file holds the kernels and the library call, and runs without the project."""
    source = (EXAMPLES / "triton_fused_backend.py").read_text()
    mine = tmp_path / "my_fused.py"
    mine.write_text(source.replace(*TAIL_BUG) if planted else source)
    assert (source.replace(*TAIL_BUG) != source)
    registry.unregister("myfused")
    try:
        target = resolve("add_rms_norm-bfloat16-17x129-normal-inplace-myfused.inplace", [str(mine)])
        text = generate(target, "repro.py")
        result = fused_runner.check_fused(target.kernel, target.case)
    finally:
        _restore("myfused", PLUGINS[-1])
    assert_standalone(text)
    assert ("mask=mask & (cols < N - N % 8)" in text) is planted and "def fused_add_rmsnorm(" in text
    assert result.ok is not planted
    path = tmp_path / "repro.py"
    path.write_text(text)
    got = bare_python(path)
    assert got.returncode == (1 if planted else 0), got.stdout + got.stderr
    assert got.stdout.splitlines()[:-1] == _lines(result)
    if planted:
        assert any(line.startswith("y: ") and "x the allowed error" in line for line in _lines(result))
