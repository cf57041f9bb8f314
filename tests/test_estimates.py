"""The memory estimate against the peaks of a GPU run (tests/data/peaks/): each check's estimate
recomputed from its node id alone, for the run's backend selection, as a worker on the GPU
computes it (MemoryWatch.estimate: the kernel, its peers of the op, device "cuda").

What counts:
- every row with a measured peak must be at or below its estimate, skipped checks included: a
  check its kernel refused still held what its worker held (the case's cache), and one skipped
  part-way (batch invariance on a nondeterministic kernel) had allocated;
- the median of estimate / peak over the checks that ran to an outcome (passed, failed, known
  issue) with a peak of PEAK_LARGE or more stays at most MEDIAN_MAX: admission must not hold
  back large checks for memory they never use. A refused check's peak says nothing of its needs.
"""
from __future__ import annotations

import json
import lzma
import statistics
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.judging import properties
from harness.running import memory_watch
from tests.check_needs import need_of
from harness.judging.cases import backward_catalogue, catalogue
from harness.running.memory import GIB, fmt
from impls import registry

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "peaks"
RUNS = sorted(DATA.glob("*.json"))
RAN = ("passed", "failed", "known issue")
OUTCOMES = RAN + ("skipped",)
PEAK_LARGE = 1 * GIB
MEDIAN_MAX = 1.5
# The checks parametrised by case and kernel (ids "<case id>-<kernel>"); the others by op and
# kernel ("<op>-<kernel>[-...]").
CASE_TESTS = ("test_against_oracle", "test_deterministic", "test_batch_invariant", "test_backward",
              "test_backward_deterministic", "test_backward_batch_invariant")


def selection(meta: dict) -> list:
    """The run's kernels: its built-in backends and those its backend files register."""
    registry.load_builtins()
    names = list(meta["backends"]["built-in"])
    for path in meta["backends"]["backend files"]:
        registry.load_file(ROOT / path)
        names += [name for name, known in registry.KNOWN_PLUGINS.items() if known == path]
    return registry.kernels(names)


def full_cases(profile: str) -> dict:
    """Every case a check of the profile draws from, by id (as HarnessState.case_index)."""
    cases = (catalogue(profile) + backward_catalogue(profile) + properties.batch_cases(profile)
             + properties.backward_batch_cases(profile))
    return {c.id: c for c in cases}


def parse(nodeid: str, cases: dict, kernels: dict):
    """(test, case or None, kernel) of a check's node id."""
    test, params = nodeid.split("::", 1)[1].split("[", 1)
    params = params.removesuffix("]")
    if test in CASE_TESTS:
        case_id, name = params.rsplit("-", 1)
        case = cases.get(case_id)
        assert case is not None, f"{nodeid}: case {case_id} is not in the catalogues (refresh {DATA.name}/)"
        op = case.op
    else:
        case = None
        op, name = params.split("-")[:2]
    kernel = kernels.get((name, op))
    assert kernel is not None, f"{nodeid}: no {op} kernel {name} in the selection"
    return test, case, kernel


def read_rows(meta: dict) -> list[tuple[str, str, int]]:
    lines = lzma.open(DATA / meta["file"], "rt").read().splitlines()
    assert lines[0].split("\t") == ["nodeid", "outcome", "mem_peak"], lines[0]
    rows = [(nid, outcome, int(peak)) for nid, outcome, peak in (line.split("\t") for line in lines[1:])]
    assert len(rows) == meta["rows"], f"{meta['file']}: {len(rows)} rows, its metadata says {meta['rows']}"
    return rows


@pytest.mark.parametrize("run", RUNS, ids=[p.stem for p in RUNS])
def test_estimates_hold_the_measured_peaks(run):
    meta = json.loads(run.read_text())
    rows = read_rows(meta)
    kernels = selection(meta)
    watch = SimpleNamespace(state=SimpleNamespace(all_kernels=kernels))  # what MemoryWatch.estimate reads
    cases, by_name = full_cases(meta["profile"]), {(k.name, k.op): k for k in kernels}
    checked = []  # (estimate, peak, outcome, nodeid, parts)
    for nodeid, outcome, peak in rows:
        assert outcome in OUTCOMES, f"{nodeid}: outcome {outcome!r}"
        test, case, kernel = parse(nodeid, cases, by_name)
        est = memory_watch.MemoryWatch.estimate(watch, {"test": test, "needs": need_of(test)}, kernel, case)
        checked.append((est.total, peak, outcome, nodeid, est))
    assert len(checked) == len(rows) > 0

    under = sorted((c for c in checked if c[0] < c[1]), key=lambda c: c[0] - c[1])
    lines = [f"  {nid}: estimate {fmt(e)} < peak {fmt(p)} ({p / e:.2f}x; {est.describe()})"
             for e, p, _, nid, est in under[:15]]
    assert not under, (f"{len(under)} of {len(checked)} checks of {run.stem} peaked above their estimate "
                       f"({meta['card']}, {meta['commit']}); the furthest:\n" + "\n".join(lines))

    large = sorted((e / p, nid) for e, p, outcome, nid, _ in checked if outcome in RAN and p >= PEAK_LARGE)
    assert large, f"{run.stem}: no check that ran peaked at {fmt(PEAK_LARGE)} or more"
    median = statistics.median(r for r, _ in large)
    worst = "\n".join(f"  {nid}: {r:.2f}x" for r, nid in large[-10:])
    assert median <= MEDIAN_MAX, (f"{run.stem}: the median estimate is {median:.2f}x the peak over {len(large)} "
                                  f"checks of {fmt(PEAK_LARGE)} or more (at most {MEDIAN_MAX}); the furthest "
                                  f"above:\n{worst}")
    print(f"{run.stem}: {len(checked)} checks, none above its estimate; {len(large)} of {fmt(PEAK_LARGE)} or more, "
          f"estimate / peak median {median:.2f}, {large[0][0]:.2f} to {large[-1][0]:.2f}")


def test_node_ids_parse_to_the_right_check():
    """The parser against ids the harness makes (harness/plugin.py and the test modules: a case id
    then the kernel's name; an op then the kernel's and the check's parameters)."""
    registry.load_builtins()
    kernels = {(k.name, k.op): k for k in registry.kernels(["torch"])}
    cases = full_cases("full")
    case = next(c for c in cases.values() if c.row_pad and c.dy_dist)  # an id of many parts
    test, got, kernel = parse(f"harness/test_backward.py::test_backward[{case.id}-torch.eager]", cases, kernels)
    assert (test, got.id, kernel.name, kernel.op) == ("test_backward", case.id, "torch.eager", case.op)
    test, got, kernel = parse("harness/test_bad_input.py::test_rejects_bad_input[layer_norm-torch.eager-nan_eps-warm]",
                              cases, kernels)
    assert (test, got, kernel.op) == ("test_rejects_bad_input", None, "layer_norm")
    with pytest.raises(AssertionError, match="not in the catalogues"):
        parse("harness/test_properties.py::test_deterministic[rms_norm-float32-3x5-nowhere-torch.eager]",
              cases, kernels)
