"""The house rules, held: file and function sizes, no lab notebook in code comments, and the call
path's layering (docs/ARCHITECTURE.md). Each rule reads the source, so it holds for code added later."""
from __future__ import annotations

import ast
import io
import re
import shutil
import subprocess
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CODE_DIRS = ("impls", "harness", "normdiff", "tools")
SOURCE_SUFFIXES = (".py", ".sh", ".cpp")
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 80
# A kernel's own body may be longer: splitting it could change the generated code.
KERNEL_DECORATORS = re.compile(r"(^|\.)(jit|prim_func|macro)$")
HEX_WORD = re.compile(r"\b[0-9a-f]{7,40}\b")
ISO_DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
# The call path's owner (impls.callpath), the contract's call that reads it, and the entry points
# that skip a frame (impls.triton's, in its dispatch) are the only code that reaches a kernel's
# call-path caches.
CALL_PATH_READERS = {"impls/base.py", "impls/callpath.py", "impls/triton/dispatch.py"}
# impls.pdl: the launch switch the contract asks (it imports nothing of impls).
CONTRACT_MODULES = ("impls.contract", "impls.base", "impls.inputs", "impls.pdl")
LAYER_MODULES = ("impls.base", "impls.callpath", "impls.fastpath", "impls.native", "impls.registry")


def _sources(suffixes=SOURCE_SUFFIXES) -> list[Path]:
    return sorted(p for d in CODE_DIRS for p in (ROOT / d).rglob("*")
                  if p.suffix in suffixes and "__pycache__" not in p.parts)


def _rel(p: Path) -> str:
    return p.relative_to(ROOT).as_posix()


def test_no_file_over_the_line_limit():
    long = {_rel(p): n for p in _sources() if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES}
    assert not long, f"files over {MAX_FILE_LINES} lines: {long}"


def _is_kernel(node: ast.AST) -> bool:
    return any(KERNEL_DECORATORS.search(ast.unparse(d.func if isinstance(d, ast.Call) else d))
               for d in getattr(node, "decorator_list", ()))


def _own_lines(fn: ast.FunctionDef) -> int:
    """A function's lines less the kernel bodies nested in it (a program builder's program)."""
    nested = sum(n.end_lineno - n.lineno + 1 for n in ast.walk(fn) if n is not fn and _is_kernel(n))
    return fn.end_lineno - fn.lineno + 1 - nested


def long_functions(source: str) -> dict[str, int]:
    """Functions over the limit in ``source``, by name with their own lines (kernels exempt)."""
    found = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not _is_kernel(node):
            if (lines := _own_lines(node)) > MAX_FUNCTION_LINES:
                found[f"{node.name}:{node.lineno}"] = lines
    return found


def test_no_function_over_the_line_limit():
    long = {f"{_rel(p)}:{name}": n for p in _sources((".py",)) for name, n in long_functions(p.read_text()).items()}
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (a kernel's own body is exempt): {long}"


def test_the_function_rule_exempts_kernel_bodies_only():
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    assert long_functions(f"def plain():\n{body}\n") == {"plain:1": MAX_FUNCTION_LINES + 1}
    assert not long_functions(f"@triton.jit\ndef kernel():\n{body}\n")
    builder = f"def build(plan):\n    @T.prim_func\n    def main():\n{body.replace('    ', '        ')}\n    return main\n"
    assert not long_functions(builder)


def comment_texts(path: Path) -> list[tuple[int, str]]:
    """(line, text) of each comment and docstring in a source file."""
    text = path.read_text()
    if path.suffix != ".py":
        marker = "//" if path.suffix == ".cpp" else "#"
        return [(i, line.split(marker, 1)[1]) for i, line in enumerate(text.splitlines(), 1) if marker in line]
    found = [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(text).readline)
             if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                found.append((node.body[0].lineno, doc))
    return found


def _commits(words: set[str]) -> set[str]:
    """The words among ``words`` that name a commit (or an ambiguous prefix of several) here."""
    if not words:
        return set()
    listing = subprocess.run(["git", "cat-file", "--batch-check"], input="\n".join(sorted(words)) + "\n",
                             capture_output=True, text=True, cwd=ROOT, check=True).stdout.splitlines()
    # Each line reads "<object> <type> <size>", "<word> ambiguous" or "<word> missing".
    return {w for w, line in zip(sorted(words), listing) if line.split()[1:2] in (["commit"], ["ambiguous"])}


def test_no_commit_hash_or_dated_measurement_in_code_comments():
    """Provenance lives in git, docs/perf-notes.md and the tuned tables' ``source`` fields."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the project's git history to tell a commit hash from another hex word")
    notes = [(f"{_rel(p)}:{line}", text) for p in _sources() for line, text in comment_texts(p)]
    hashes = _commits({w for _, text in notes for w in HEX_WORD.findall(text)})
    found = [f"{where}: {w}" for where, text in notes for w in HEX_WORD.findall(text) if w in hashes]
    found += [f"{where}: {d}" for where, text in notes for d in ISO_DATE.findall(text)]
    assert not found, "commit hashes or dates in code comments or docstrings:\n" + "\n".join(found)


def test_the_notebook_rule_sees_a_hash_and_a_date(tmp_path):
    head = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    if head.returncode:
        pytest.skip("needs the project's git history")
    probe = tmp_path / "probe.py"
    probe.write_text(f'"""Measured at {head.stdout.strip()}."""\nx = 1  # on 2026-12-04: 97%\n')
    texts = " ".join(t for _, t in comment_texts(probe))
    assert _commits(set(HEX_WORD.findall(texts))) == {head.stdout.strip()} and ISO_DATE.search(texts)


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports by name, at any level (inside functions too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return names


def _module_path(name: str) -> Path:
    base = ROOT.joinpath(*name.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def test_the_contract_imports_no_layer_above_it():
    """impls.base defines the contract and the validated call (with impls.inputs, the call's types
    and validation); the call path and the backends sit above it."""
    for contract in CONTRACT_MODULES:
        above = {n for n in _imports(_module_path(contract)) if n.startswith("impls")
                 and not any(n == c or n.startswith(c + ".") for c in CONTRACT_MODULES)}
        assert not above, f"{contract} imports {sorted(above)}"


def test_only_the_triton_backend_imports_it():
    """The shared layers ask a kernel for what they need (launch_hooks), never a backend by name."""
    wrong = {_rel(p) for p in (ROOT / "impls").rglob("*.py")
             if "triton" not in p.relative_to(ROOT / "impls").parts[:1]
             and any(n == "impls.triton" or n.startswith("impls.triton.") for n in _imports(p))}
    assert not wrong, f"modules outside impls/triton/ importing it: {sorted(wrong)}"


def test_the_layers_import_no_backend_and_form_no_cycle():
    for layer in LAYER_MODULES:
        imported = _imports(_module_path(layer))
        assert not {n for n in imported if n.split(".")[:2] in (["impls", "triton"], ["impls", "tilelang"])}, layer
        for other in LAYER_MODULES:
            if other != layer and other in imported:
                assert layer not in _imports(_module_path(other)), f"{layer} and {other} import each other"


def test_no_code_reaches_into_the_call_path_caches():
    """Tests and tools use impls.callpath's state, plans, native_table and forget."""
    reach = re.compile(r"__dict__[^\n]*[\"'](_plans|_native|_calls)[\"']|\._calls\b|\._plans\b|\._native\b")
    found = [f"{_rel(p)}:{i}" for p in [*_sources((".py",)), *(ROOT / "tests").rglob("*.py")]
             if _rel(p) not in CALL_PATH_READERS and p != Path(__file__).resolve()
             for i, line in enumerate(p.read_text().splitlines(), 1) if reach.search(line)]
    assert not found, f"reaches into a kernel's call-path caches: {found}"


# Standard-library modules newer than some Pythons, with the release that added them.
STDLIB_SINCE = {"tomllib": (3, 11)}


def test_the_declared_python_floor_has_every_module_the_code_imports():
    """pyproject's requires-python is a promise: each module imported is in that Python."""
    import tomllib

    spec = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    floor = tuple(int(part) for part in re.fullmatch(r">=\s*(\d+\.\d+)", spec.strip()).group(1).split("."))
    newer = {f"{_rel(p)}: {name}" for p in [*_sources((".py",)), *(ROOT / "normdiff").rglob("*.py")]
             for name in _imports(p) if STDLIB_SINCE.get(name, (0, 0)) > floor}
    assert not newer, f"requires-python {spec}, but these need a newer Python: {sorted(newer)}"


def _eps_literal_defaults(source: str) -> list[str]:
    """Functions whose ``eps`` parameter defaults to a number written out (not DEFAULT_EPS)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args
            pairs = list(zip(args.args[len(args.args) - len(args.defaults):], args.defaults))
            pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
            found += [f"{getattr(node, 'name', 'lambda')}:{node.lineno}" for a, d in pairs
                      if a.arg == "eps" and isinstance(d, ast.Constant) and isinstance(d.value, float)]
    return found


def test_eps_defaults_come_from_default_eps():
    """An op's default eps is impls.base.DEFAULT_EPS, the one place (a literal elsewhere drifts)."""
    assert _eps_literal_defaults("def f(x, eps: float = 1e-5): pass") == ["f:1"]
    files = [*_sources((".py",)), *(ROOT / "examples").rglob("*.py")]
    found = [f"{_rel(p)}:{where}" for p in files for where in _eps_literal_defaults(p.read_text())]
    assert not found, f"eps defaults written as numbers: {found}"
