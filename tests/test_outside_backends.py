"""Outside backends come in through a file or an entry point, with no edit to the project, and
their failures land in the report with a command that reproduces them."""
import json
import os
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from impls import registry

ROOT = Path(__file__).resolve().parents[1]
FILTER = ["--op", "rms_norm", "--dtype", "bfloat16", "--profile", "quick"]


def run_harness(*args, env_extra=None, cwd=ROOT, test=None):
    env = {**os.environ, **(env_extra or {})}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "pytest", str(test or ROOT / "harness" / "test_differential.py"), "-q", "-p", "no:randomly",
         *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=600,
    )


def test_backend_from_a_file_runs_like_a_builtin(tmp_path):
    proc = run_harness("--backend-file", str(ROOT / "examples" / "outside_backend.py"), "--backend", "mynorm",
                       "--report-dir", str(tmp_path), *FILTER)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((tmp_path / "correctness.json").read_text())
    kernels = {r["kernel"] for r in doc["records"]}
    assert kernels == {"mynorm.float32"}
    assert all(r["outcome"] == "passed" for r in doc["records"])
    assert "mynorm" in (tmp_path / "correctness.md").read_text()


BUGGY = textwrap.dedent('''
    from impls.registry import register
    from tests.planted import IgnoresWeight
    register(IgnoresWeight("rms_norm"))
''')


def test_failure_is_reported_with_a_working_reproduction(tmp_path):
    plugin = tmp_path / "buggy_backend.py"
    plugin.write_text(BUGGY)
    proc = run_harness("--backend-file", str(plugin), "--backend", "planted", "--report-dir", str(tmp_path), *FILTER)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((tmp_path / "correctness.json").read_text())
    failed = [r for r in doc["records"] if r["outcome"] == "failed"]
    no_weight = [r for r in doc["records"] if "noaffine" in r["case"]]
    assert failed and all(r["outcome"] == "passed" for r in no_weight)  # no weight: no bug
    md = (tmp_path / "correctness.md").read_text()
    first = failed[0]
    assert first["nodeid"].split("::")[-1] in md and "max ulp err" in md
    # The report's command reproduces the failure on its own.
    from harness.report import repro_command
    cmd = shlex.split(repro_command(doc, first))
    # Leading NAME=value words are the environment the run depended on (TRITON_INTERPRET on CPU).
    prefix = [w.split("=", 1) for w in cmd[:cmd.index("pytest")]]
    assert all(len(kv) == 2 and kv[0].isupper() for kv in prefix), cmd
    cmd = cmd[len(prefix):]
    again = subprocess.run([sys.executable, "-m", *cmd, "-q", "--report-dir", str(tmp_path / "again")], cwd=ROOT,
                           env={**os.environ, **dict(prefix), "PYTHONPATH": str(ROOT)},
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 1 and "1 failed" in again.stdout, again.stdout[-3000:]


def test_backend_from_an_entry_point(tmp_path):
    # A minimal installed distribution: a module plus dist-info naming it in normdiff.backends.
    (tmp_path / "extnorm.py").write_text(textwrap.dedent('''
        from impls.base import NormKernel

        class Ext(NormKernel):
            op = "rms_norm"
            backend = "extnorm"
            variant = "eager"
            def _forward(self, x, weight, bias, eps, out):
                import torch
                y = torch.nn.functional.rms_norm(x.float(), (x.shape[1],), None, eps)
                out.y.copy_(y if weight is None else y * weight.float())

        def kernels():
            return [Ext()]
    '''))
    info = tmp_path / "extnorm-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: extnorm\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[normdiff.backends]\nextnorm = extnorm:kernels\n")
    proc = run_harness("--backend", "extnorm", "--report-dir", str(tmp_path), *FILTER,
                       env_extra={"PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((tmp_path / "correctness.json").read_text())
    assert {r["kernel"] for r in doc["records"]} == {"extnorm.eager"}


def test_unknown_backend_is_a_usage_error(tmp_path):
    proc = run_harness("--backend", "nosuch", "--report-dir", str(tmp_path))
    assert proc.returncode == 4
    assert "unknown backend nosuch" in proc.stderr


def test_backend_that_cannot_load_is_skipped_with_its_reason(tmp_path):
    """Without triton importable, its kernels still register, and every case is a skip that says
    why: counted as skipped in the report, never passed, never dropped."""
    # One process (-n 0): triton is hidden in this process only, a worker would import it.
    args = [str(ROOT / "harness" / "test_differential.py"), "-q", "--backend", "triton", "-n", "0",
            "--report-dir", str(tmp_path), *FILTER]
    code = f"import sys; sys.modules['triton'] = None; import pytest; sys.exit(pytest.main({args!r}))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((tmp_path / "correctness.json").read_text())
    records = doc["records"]
    assert records and all(r["outcome"] == "skipped" for r in records)
    assert all(r["reason"].startswith("triton not importable") for r in records)
    assert {r["kernel"] for r in records} == {"triton.rowwise", "triton.looped", "triton.split", "triton.auto",
                                             "triton.invariant"}
    md = (tmp_path / "correctness.md").read_text()
    assert f"**0 passed, 0 failed, 0 harness errors, {len(records)} skipped**" in md
    assert "unavailable: triton not importable" in md


def test_deselected_checks_are_not_counted(tmp_path):
    proc = run_harness("--backend-file", str(ROOT / "examples" / "outside_backend.py"), "--backend", "mynorm",
                       "--report-dir", str(tmp_path), "-k", "4000", *FILTER)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((tmp_path / "correctness.json").read_text())
    assert doc["records"] and all("4000" in r["nodeid"] and r["outcome"] == "passed" for r in doc["records"])
    assert doc["progress"] == {"final": True, "ran": len(doc["records"]), "collected": len(doc["records"])}
    assert "Incomplete" not in (tmp_path / "correctness.md").read_text()


KNOWN = textwrap.dedent('''
    from impls.registry import register
    from tests.planted import IgnoresWeight

    class Declared(IgnoresWeight):
        """Declares one case it fails (weight ignored) and one it passes (no weight)."""
        ISSUES = {"weight": "ignores its weight", "none": "declared, but this case passes"}  # by affine

        def known_issue(self, case, device, inputs=None):
            return self.ISSUES.get(case.affine)

        def known_issue_may_pass(self, case, device, inputs=None):
            return MAY_PASS and case.affine in self.ISSUES

    register(Declared("rms_norm"))
''')


@pytest.mark.parametrize("may_pass", [False, True])
def test_known_issues_are_counted_apart_and_must_keep_failing(tmp_path, may_pass):
    """A declared known issue that fails as declared is neither a pass nor a failure; one that
    passes is a failure (strict), so a fixed issue cannot stay declared, unless the kernel
    declares it machine-dependent (NormKernel.known_issue_may_pass: the torch.compile CPU drift
    that fails on one machine and passes on another), when a pass is recorded as passed."""
    plugin = tmp_path / "declared_backend.py"
    plugin.write_text(f"MAY_PASS = {may_pass}\n" + KNOWN)
    proc = run_harness("--backend-file", str(plugin), "--backend", "planted", "--report-dir", str(tmp_path),
                       "-k", "7x1000-normal", *FILTER)
    doc = json.loads((tmp_path / "correctness.json").read_text())
    outcomes = {r["case"]: r["outcome"] for r in doc["records"]}
    assert outcomes == {"rms_norm-bfloat16-7x1000-normal-weightonly": "known issue",
                        "rms_norm-bfloat16-7x1000-normal-noaffine": "passed" if may_pass else "failed"}, \
        proc.stdout[-3000:]
    assert proc.returncode == (0 if may_pass else 1), proc.stdout[-3000:]
    md = (tmp_path / "correctness.md").read_text()
    assert "1 known issues (declared, failing as declared)" in md and "ignores its weight" in md


def test_plugin_friction_fixes(tmp_path):
    """A backend file imports a module beside it; --backend takes a glob; a failing drawn case's
    report keeps the drawn case and its error; reproduce commands carry their environment."""
    (tmp_path / "mymath.py").write_text("def scale(n):\n    return 1.01 if n > 3000 else 1.0\n")
    (tmp_path / "my_backends.py").write_text(textwrap.dedent('''
        import torch
        from mymath import scale
        from impls.base import NormKernel
        from impls.registry import register

        class _Mine(NormKernel):
            op, variant, outputs = "rms_norm", "v", ("y", "rstd")
            def _forward(self, x, w, b, eps, out):
                rstd = torch.rsqrt(x.float().pow(2).mean(-1) + eps)
                y = x.float() * rstd[:, None] * scale(x.shape[1])
                out.y.copy_(y if w is None else y * w.float())
                out.rstd.copy_(rstd)

        @register
        class A(_Mine):
            backend = "my_a"

        @register
        class B(_Mine):
            backend = "my_b"
    '''))
    proc = subprocess.run([sys.executable, "-m", "pytest", str(ROOT / "harness" / "test_fuzz.py"), "-q", "-p", "no:randomly",
                           "-n", "0", "--backend-file", str(tmp_path / "my_backends.py"), "--backend", "my_*",
                           "--profile", "quick", "--report-dir", str(tmp_path / "r")],
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((tmp_path / "r" / "correctness.json").read_text())
    assert {r["kernel"] for r in doc["records"]} == {"my_a.v", "my_b.v"}  # the glob matched both
    backward = [r for r in doc["records"] if r["test"] == "test_fuzz_backward"]
    assert backward and all(r["outcome"] == "skipped" and r["reason"].endswith("has no backward") for r in backward)
    for r in (r for r in doc["records"] if r["test"] == "test_fuzz"):
        assert r["outcome"] == "failed" and r["drawn_case"].startswith("rms_norm-")
        assert int(r["drawn_case"].split("-")[2].split("x")[-1]) > 3000  # the drawn shape that fails
        assert r["errors"] and max(e["worst_ratio"] for e in r["errors"]) > 1
    from harness.report import repro_command

    assert repro_command(doc, doc["records"][0]).startswith("TRITON_INTERPRET=1 pytest ")


def test_a_wrong_variant_lists_the_valid_ones():
    registry.load_all()
    with pytest.raises(KeyError, match="rowwise"):
        registry.get("rms_norm", "triton", "nosuch")
