"""The warm-up (harness.warm) survives the kernels it warms: one that raises, one that leaves its
CUDA context unusable (a sticky error), one that kills its worker process. Each is reported as a
line of the summary and the warm-up still ends normally: the pytest run after it judges them."""
import os
import subprocess
import sys
import textwrap
from concurrent.futures import Future
from pathlib import Path

import pytest

from harness import warm

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def fresh_worker(monkeypatch):
    monkeypatch.setattr(warm, "_LOST", None)


def test_a_task_that_raises_is_reported_not_raised(fresh_worker):
    def task():
        raise ValueError("N=7 unsupported")

    assert warm._run("case A", task) == "case A: ValueError: N=7 unsupported"
    assert warm._run("case B", lambda: None) is None  # the worker goes on


def test_a_lost_cuda_context_refuses_the_workers_later_tasks(fresh_worker, monkeypatch):
    import torch

    def sticky():
        raise RuntimeError("CUDA error: an illegal instruction was encountered")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", sticky)
    first = warm._run("case A", lambda: None)
    assert "case A" in first and "illegal instruction" in first and "lost" in first
    ran = []
    later = warm._run("case B", lambda: ran.append(1))
    assert ran == [] and later.startswith("case B: not warmed") and "case A" in later


def test_a_dead_worker_is_an_outcome():
    done, failed = Future(), Future()
    done.set_result(None)
    failed.set_exception(RuntimeError("A process in the process pool was terminated abruptly"))
    assert warm.outcome(done) is None
    assert "terminated abruptly" in warm.outcome(failed)


DYING = textwrap.dedent('''
    import os
    from impls.registry import register
    from tests.planted import Correct

    class Raises(Correct):
        variant = "raises"
        def _forward(self, x, weight, bias, eps, out):
            raise RuntimeError("planted failure")

    class KillsItsProcess(Correct):
        variant = "kills"
        def _forward(self, x, weight, bias, eps, out):
            os._exit(3)  # as a segfault would: past Python, no exception

    register(Raises("rms_norm"))
    register(KillsItsProcess("layer_norm"))
''')


def test_warm_up_ends_normally_past_a_raising_and_a_dying_kernel(tmp_path):
    plugin = tmp_path / "dying_backend.py"
    plugin.write_text(DYING)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, "-m", "harness.warm", "--backend", "planted", "--backend-file", str(plugin),
         "--bench", "--profile", "quick", "--jobs", "1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    # Every task fails one way or another, and every one is counted: the raising kernel's by its
    # error, the dying kernel's and those its death took down with the worker as a failed worker.
    import re

    tasks = int(re.search(r"warming (\d+) benchmark shapes", proc.stdout).group(1))
    raised = int(re.search(r"warmed in \d+ s; (\d+) raised", proc.stdout).group(1))
    assert tasks > 2 and raised == tasks, out[-3000:]
    assert "a warm-up worker failed" in proc.stdout, out[-3000:]


def test_every_check_family_is_warmed_each_compile_key_once():
    """The checks' warm-up (no --bench) covers every family whose first calls compile: the oracle
    checks, the backward, batch invariance's other row counts and the drawn cases (torch.compile
    compiles per static shape, on the CPU too); each forward compile key of the catalogue once."""
    from dataclasses import replace

    from harness.judging import properties
    from harness.judging.cases import catalogue
    from harness.judging.runner import device_for
    from impls import registry

    work = list(warm.tasks(["torch_compile"], "quick", False, ()))
    families = {job[0] for _, _, job in work}
    assert {"check", "backward", "batch", "backward batch", "drawn"} <= families, families
    registry.load_builtins()
    kernel = next(k for k in registry.kernels(["torch_compile"]) if k.op == "rms_norm")
    device = device_for(kernel)
    wanted = {kernel.compile_key(c.spec(device)) for c in catalogue("quick") if c.op == "rms_norm"
              and not kernel.unsupported(c.spec(device))}
    warmed = [job[1] for _, key, job in work if key == (kernel.name, "rms_norm") and job[0] == "check"]
    assert {kernel.compile_key(c.spec(device)) for c in warmed} == wanted and len(warmed) == len(wanted)
    batch = next(job[1] for _, key, job in work if key == (kernel.name, "rms_norm") and job[0] == "batch")
    sizes = properties.batch_sizes(kernel, batch, device, quick=True)
    assert {kernel.compile_key(replace(batch.spec(device), rows=m)) for m in sizes} - wanted  # new shapes
    assert warm._drawn_tests(kernel) == ["test_fuzz", "test_fuzz_backward"]


def test_a_drawn_task_replays_the_checks_draws(monkeypatch):
    """The warm-up's drawn task runs harness/test_fuzz.py's own check from --fuzz-seed: the same
    cases the pytest run draws (each a shape class of its own)."""
    from harness import test_fuzz
    from harness.judging import runner
    from impls import registry

    registry.load_builtins()
    kernel = next(k for k in registry.kernels(["torch"]) if k.op == "rms_norm")
    seen = []
    real = runner.check
    monkeypatch.setattr(runner, "check", lambda k, case, **kw: seen.append(case.id) or real(k, case, **kw))
    warm._drawn(kernel, "test_fuzz", "quick", 0)
    again = list(seen)
    seen.clear()
    from types import SimpleNamespace

    state = SimpleNamespace(profile="quick", selection={"fuzz_seed": 0}, watch=None)
    test_fuzz.test_fuzz(kernel, state, SimpleNamespace(node=None))
    assert again == seen and len(set(seen)) >= 10
