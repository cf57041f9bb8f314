"""An unknown backend's error says what is registered and how each kind of backend is loaded:
built-ins with registry.load_all() (or load_builtins()), a plug-in file with --backend-file PATH
or registry.load_all([PATH]), and the plug-ins the project ships (registry.KNOWN_PLUGINS)."""
import subprocess
import sys
from pathlib import Path

import pytest

from impls import registry

ROOT = Path(__file__).resolve().parents[1]


def _says_how_to_load(message: str) -> None:
    assert "registry.load_all()" in message and "load_builtins()" in message
    assert "--backend-file PATH" in message and "registry.load_all([PATH])" in message
    for name, path in registry.KNOWN_PLUGINS.items():
        assert f"{name} ({path})" in message, name


def test_an_unknown_name_lists_the_registered_backends_and_how_to_load_others():
    registry.load_builtins()
    with pytest.raises(KeyError) as caught:
        registry.kernels(["nosuch"])
    message = str(caught.value)
    assert message.startswith("unknown backend(s) nosuch; registered: ")  # shown as is, not quoted
    registered = message.split("registered: ", 1)[1].split(".", 1)[0]
    assert set(registry.backends()) == set(registered.split(", "))
    _says_how_to_load(message)
    with pytest.raises(KeyError, match="unknown backend"):
        registry.get("add_rms_norm", "nosuch", "fused")


def test_a_shipped_plug_in_not_loaded_is_named_with_its_file(monkeypatch):
    registry.load_builtins()
    # One shipped plug-in this process has not loaded (another test may have loaded the real ones).
    monkeypatch.setitem(registry.KNOWN_PLUGINS, "notloaded", "examples/notloaded_backend.py")
    name, path = next((n, p) for n, p in registry.KNOWN_PLUGINS.items() if n not in registry.backends())
    with pytest.raises(KeyError) as caught:
        registry.kernels([name])
    assert f"{name}: a plug-in, load it with --backend-file {path}" in str(caught.value)


def test_nothing_loaded_says_so_and_how():
    """The first call of a script that forgot registry.load_all(): nothing is registered yet."""
    code = ("from impls import registry\n"
            "try:\n    registry.get('add_rms_norm', 'triton', 'fused')\n"
            "except KeyError as exc:\n    print(exc)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    message = proc.stdout.strip()
    assert message.startswith("unknown backend(s) triton; registered: none. "), message
    _says_how_to_load(message)
