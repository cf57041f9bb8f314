"""The installed entry point (harness.entry) with --backend-file passes every argument on to
pytest's own parsing, however long: an option's value longer than the system's file-name limit
(a long --backend list, a long -k expression) once crashed start-up probing it as a path."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ["--backend-file", "examples/triton_rms_backend.py"]
FILTER = ["--op", "rms_norm", "--dtype", "bfloat16", "--collect-only", "-q", "-n", "0", "-p", "no:randomly"]


def collect(*args):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "pytest", "harness", *PLUGIN, *args, *FILTER], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    return proc, proc.stdout + proc.stderr


def started(out: str) -> bool:
    return "Traceback" not in out and "OSError" not in out and "INTERNALERROR" not in out


def test_a_long_backend_list_reaches_pytest():
    names = []
    while len(",".join(names)) < 400:
        names.append(("torch", "mytriton")[len(names) % 2])
    proc, out = collect("--backend", ",".join(names))
    assert started(out) and proc.returncode == 0, out[-3000:]
    assert "tests collected" in out and "mytriton" in out


def test_a_long_k_expression_reaches_pytest():
    expression = "not (" + " or ".join(f"nosuch{i:03d}" for i in range(60)) + ")"
    assert len(expression) >= 400
    proc, out = collect("--backend", "torch", "-k", expression)
    assert started(out) and proc.returncode == 0, out[-3000:]
    assert "tests collected" in out


def test_a_long_test_path_is_pytests_usage_error():
    proc, out = collect("harness/" + "q" * 400, "--backend", "torch")
    assert started(out) and proc.returncode == 4, out[-3000:]  # pytest's own: file or directory not found
    assert "file or directory not found" in out
