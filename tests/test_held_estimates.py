"""Admission counts a case's cache only while the worker holds it (harness.running.estimate.as_held,
memory_watch._need): a property check admitted in a worker that holds no cache of its case is
estimated without one, beside a held cache with exactly that cache; an oracle check with what it
adds to what is held. Held under the simulated card: every check's measured peak stays within the
estimate its admission used, and the property checks that ran without a cache were admitted at
their own needs, not the worst case of every kernel's cache."""
import json
import subprocess
import sys
from pathlib import Path

from harness.judging.cases import catalogue
from harness.running import estimate
from tests.check_needs import need_of
from impls import registry

ROOT = Path(__file__).resolve().parent.parent


def _kernels(op: str):
    registry.load_builtins()
    return [k for k in registry.kernels(["torch", "triton"]) if k.op == op]


def test_a_property_check_counts_the_cache_held_and_nothing_more():
    case = max((c for c in catalogue("full") if c.op == "layer_norm" and c.rows * c.n < 2**26), key=lambda c: c.rows * c.n)
    kernel, *peers = _kernels("layer_norm")
    worst = estimate.check_estimate(need_of("test_deterministic"), case, kernel, peers=peers)
    assert worst.parts["held"] > 0  # a catalogue case: the worst case counts every kernel's cache
    clean = estimate.as_held(worst, need_of("test_deterministic"), case, kernel, 0)
    assert clean.total == worst.total - worst.parts["held"]
    assert estimate.as_held(worst, need_of("test_deterministic"), case, kernel, 12345).total == clean.total + 12345


def test_an_oracle_check_counts_what_it_adds_to_the_cache_held():
    case = next(c for c in catalogue("full") if c.op == "rms_norm" and c.shape == (1025, 4096) and c.dist == "normal")
    kernel, *peers = _kernels("rms_norm")
    worst = estimate.check_estimate(need_of("test_against_oracle"), case, kernel, peers=peers)
    first = estimate.held_bytes(False, case, (), judged=(kernel,))
    assert estimate.as_held(worst, need_of("test_against_oracle"), case, kernel, 0).parts["held"] == first < worst.parts["held"]
    held = estimate.as_held(worst, need_of("test_against_oracle"), case, kernel, 10**12)  # never above the worst case
    assert held.total == worst.total


def test_checks_peak_within_the_estimates_admission_used(tmp_path):
    """Oracle checks, then the property checks of the same cases (their cache held, or dropped
    when the case changed), forward and backward, on the simulated card."""
    args = [sys.executable, "-m", "pytest", "harness/test_differential.py", "harness/test_properties.py",
            "harness/test_backward.py", "harness/test_fuzz.py", "--backend", "torch", "--op", "layer_norm", "--dtype", "float32",
            "--profile", "quick", "-n", "0", "-q", "-p", "no:randomly", "--simulate-gpu", "24GiB",
            "--report-dir", str(tmp_path)]
    ran = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    records = json.loads((tmp_path / "correctness.json").read_text())["records"]
    measured = [r for r in records if r.get("mem_peak") is not None]
    assert {"test_against_oracle", "test_deterministic", "test_backward", "test_backward_deterministic",
            "test_fuzz", "test_fuzz_backward"} <= {r["test"] for r in measured}
    over = [(r["nodeid"], r["mem_peak"], r["mem_estimate"]) for r in measured if r["mem_peak"] > r["mem_estimate"]]
    assert not over, over
    # A property check's admission counted the cache held, never the worst case of every kernel's.
    from harness.judging.cases import backward_catalogue
    kernels = {k.name: k for k in _kernels("layer_norm")}
    cases = {c.id: c for c in catalogue("quick") + backward_catalogue("quick")}
    below = 0
    for r in measured:
        if need_of(r["test"]) in estimate.PROPERTY_NEEDS and r["case"] in cases:
            worst = estimate.check_estimate(need_of(r["test"]), cases[r["case"]], kernels[r["kernel"]], peers=[])
            below += r["mem_estimate"] < worst.total
    assert below > 0
