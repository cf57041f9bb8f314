"""Programmatic dependent launch in the benchmarks (impls.pdl): at decode a kernel that can launch
with PDL is timed with it on and off, two ids and two rows; a PDL-on timing that cannot launch
with PDL here is skipped with the reason, never run as off; the decode targets compare like with
like; the report puts PDL on and off side by side; FlashInfer's plug-in passes the switch."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from harness import bench
from harness.benchmarks import bench_fused, bench_sweep
from impls import pdl
from impls.base import NormKernel
from impls.fused import FusedNormKernel

ROOT = Path(__file__).resolve().parents[1]


class _Launches(NormKernel):
    backend, variant, op, pdl = "pdltoy", "launches", "rms_norm", True


class _Plain(NormKernel):
    backend, variant, op = "pdltoy", "plain", "rms_norm"


class _FusedLaunches(FusedNormKernel):
    backend, variant, op, pdl = "pdltoy", "fused", "add_rms_norm", True


# -- the parametrisation --------------------------------------------------------------------------
def test_decode_gives_a_pdl_kernel_two_ids_and_any_other_one():
    shapes = bench_sweep.sweep("quick", ["rms_norm"], ["float32"])
    items = bench_sweep.items(shapes, [_Launches(), _Plain()], "torch.eager")
    ids = [it.id for it in items]
    assert len(ids) == len(set(ids))
    decode = next(s for s in shapes if s.regime == "decode")
    at_decode = [it.id for it in items if it.shape == decode]
    assert at_decode == [f"{decode.group}-pdltoy.launches-pdl", f"{decode.group}-pdltoy.launches-nopdl",
                         f"{decode.group}-pdltoy.plain"]
    assert [it.pdl for it in items if it.shape == decode] == [True, False, None]
    # Bandwidth (and backward): once, as the kernel launches by default, no PDL part in the id.
    assert all(it.pdl is None and not it.id.endswith("pdl") for it in items if it.shape.regime != "decode")
    assert sum(it.kernel.variant == "launches" for it in items if it.shape.regime == "bandwidth") == \
        sum(s.regime == "bandwidth" for s in shapes)
    # The fused rows alike.
    fshapes = bench_fused.sweep("quick", ("add_rms_norm",), ("bfloat16",))
    fitems = bench_fused.items(fshapes, [_FusedLaunches()], bench_fused.BASELINE)
    fdecode = [it for it in fitems if it.shape.regime == "decode"]
    assert fdecode and {it.id.rsplit("-", 1)[1] for it in fdecode} == {"pdl", "nopdl"}
    assert len(fdecode) == 2 * sum(s.regime == "decode" for s in fshapes)
    assert all(it.pdl is None for it in fitems if it.shape.regime == "bandwidth")


def test_a_pdl_on_timing_is_skipped_where_pdl_cannot_launch_never_run_as_off(monkeypatch):
    decode = next(s for s in bench_sweep.sweep("quick", ["rms_norm"], ["float32"]) if s.regime == "decode")
    on, off = bench_sweep.with_pdl(decode, _Launches())
    info: dict = {}
    with pytest.raises(pytest.skip.Exception) as skipped:
        with bench.launch(on, "cpu", info):
            raise AssertionError("timed")
    assert str(skipped.value) == f"PDL on: {pdl.unavailable('cpu')}" and info == {}
    with bench.launch(off, "cpu", info):
        assert not pdl.switched_on()
    assert info == {"pdl": False} and pdl.switched_on() == (os.environ.get(pdl.ENV, "1") != "0")
    # Where PDL can launch: the block runs with the switch forced on and the row says so; the
    # switch is put back after. NORMDIFF_PDL=0 for the process skips the PDL-on timing too.
    monkeypatch.setattr(pdl, "unavailable", lambda device: None)
    before = pdl.switched_on()
    with bench.launch(on, "cuda", info):
        assert pdl.enabled("cuda")
    assert info == {"pdl": True} and pdl.switched_on() == before
    with pdl.forced(False):
        with pytest.raises(pytest.skip.Exception, match="PDL on: NORMDIFF_PDL=0: PDL is off for this process"):
            with bench.launch(on, "cuda", {}):
                pass
    # Default items record what the kernel does by default; a backward row records nothing.
    default = bench_sweep.BenchItem(bench_sweep.BenchShape("rms_norm", "float32", 512, 1024, "bandwidth"), _Launches())
    with pdl.forced(True), bench.launch(default, "cuda", info):
        pass
    assert info == {"pdl": True}
    backward = bench_sweep.BenchItem(bench_sweep.BenchShape("rms_norm", "float32", 512, 1024, "backward"), _Launches())
    got: dict = {}
    with bench.launch(backward, "cuda", got):
        pass
    assert got == {}


# -- a CPU run ------------------------------------------------------------------------------------
PLUGIN = textwrap.dedent('''
    from impls.registry import register
    from impls.torch_eager import TorchRMSNorm
    from impls.torch_fused import TorchAddRMSNorm


    @register
    class Launches(TorchRMSNorm):
        backend, variant, pdl = "pdlpeer", "eager", True


    @register
    class FusedLaunches(TorchAddRMSNorm):
        backend, variant, pdl = "pdlpeer", "fused", True
''')


def test_a_cpu_run_produces_both_ids_and_skips_the_pdl_on_ones(tmp_path):
    (tmp_path / "peer.py").write_text(PLUGIN)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:randomly", "benchmarks", "--benchmark-only", "-rs",
         "--backend", "torch,pdlpeer", f"--backend-file={tmp_path / 'peer.py'}", "--op", "rms_norm,add_rms_norm",
         "--dtype", "float32", "--profile", "quick", "--bench-rounds", "3", f"--report-dir={tmp_path / 'out'}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    doc = json.loads((tmp_path / "out" / "benchmark.json").read_text())
    why = f"PDL on: {pdl.unavailable('cpu')}"
    skipped = [s for s in doc["normdiff"]["skipped"] if s["kernel"].startswith("pdlpeer.")]
    assert skipped and all(s["reason"] == why and s["pdl"] is True and s["regime"] == "decode" for s in skipped)
    assert {s["kernel"] for s in skipped} == {"pdlpeer.eager", "pdlpeer.fused"}
    assert why in proc.stdout
    timed = {b["name"].split("[", 1)[1].rstrip("]"): b["extra_info"] for b in doc["benchmarks"]}
    assert not any(name.endswith("-pdl") for name in timed)  # never run as off under a PDL-on id
    assert all(ei["pdl"] is False for name, ei in timed.items() if ei["regime"] != "backward")
    decode = {name for name, ei in timed.items() if ei["regime"] == "decode"}
    for kernel in ("pdlpeer.eager", "pdlpeer.fused"):
        mine = {name for name in decode if f"-{kernel}" in name}
        assert mine and all(name.endswith(f"-{kernel}-nopdl") for name in mine), decode
    for kernel in ("torch.eager", "torch.fused"):  # cannot launch with PDL: one id, no PDL part
        theirs = {name for name in decode if name.endswith(f"-{kernel}")}
        assert theirs and not any(name.endswith((f"-{kernel}-pdl", f"-{kernel}-nopdl")) for name in decode)
    assert any(name.endswith("-pdlpeer.eager") and ei["regime"] == "bandwidth" for name, ei in timed.items())


# -- the targets and the report -------------------------------------------------------------------
def _row(kernel, us, pdl_on, project=None, m=1, n=4096, case=None):
    """A decode row as harness.report.benchmark_results gives it (``pdl``: None for a row from
    before PDL was recorded)."""
    fused = case is not None
    return {"family": "fused" if fused else "plain", "case": case or "rms_norm", "title": case or "RMSNorm",
            "op": (case or "rms_norm").split("-")[0], "dtype": "bfloat16", "m": m, "n": n, "regime": "decode",
            "repeat": 0, "kernel": kernel, "group": f"{case or 'rms_norm'}-bfloat16-{m}x{n}", "pct": None,
            "median_s": us * 1e-6, "pdl": pdl_on,
            "project": kernel.split(".")[0] in ("triton", "tilelang") if project is None else project}


def test_decode_targets_compare_pdl_with_pdl_and_no_pdl_with_no_pdl():
    """Each side on its own: a comparison across the sides would call these verdicts wrongly."""
    from harness.report import targets

    met = [_row("triton.auto", 1.00, True), _row("triton.auto", 1.20, False),
           _row("fi.default", 1.05, True), _row("fi.default", 1.30, False), _row("liger.fused", 1.25, False)]
    (t,) = targets.decode(met)
    # Mixed (the project's 1.20 without PDL against the peer's 1.05 with it) this would be a gap.
    assert t["gaps"] == [] and set(t["sides"]) == {"with PDL", "without PDL"}
    assert t["sides"]["with PDL"]["peer"] == ("fi.default", pytest.approx(1.05e-6))
    assert t["sides"]["without PDL"]["peer"] == ("liger.fused", pytest.approx(1.25e-6))  # a peer without PDL counts
    missed = [_row("triton.auto", 1.00, True), _row("triton.auto", 1.50, False),
              _row("fi.default", 1.10, True), _row("fi.default", 1.60, False), _row("liger.fused", 1.20, False)]
    (t,) = targets.decode(missed)
    # Mixed (the project's 1.00 with PDL against the peers' best 1.10) this would be met.
    assert t["gaps"] == ["without PDL: triton 1.50 µs > liger.fused 1.20 µs (t 0.00%)"]
    md = "\n".join(targets.render(missed))
    assert "| rms_norm | bfloat16 | 1 x 4096 | with PDL | 1.00 triton.auto | 1.10 fi.default | 0.00% | met |" in md
    assert ("| rms_norm | bfloat16 | 1 x 4096 | without PDL | 1.50 triton.auto | 1.20 liger.fused | 0.00% | "
            "triton 1.50 µs > liger.fused 1.20 µs (t 0.00%) |") in md
    assert "**0 of 1 shapes**" in md and "like with like" in md


def test_a_side_without_rows_is_said_and_never_counted_as_met():
    from harness.report import targets

    # No peer launches with PDL (LayerNorm's): that side is shown, not judged; the other decides.
    no_peer = [_row("triton.auto", 1.0, True), _row("triton.auto", 1.1, False), _row("liger.fused", 2.0, False)]
    (t,) = targets.decode(no_peer)
    assert t["gaps"] == [] and t["sides"]["with PDL"]["note"] == "not judged: no peer ran"
    assert "| with PDL | 1.00 triton.auto | - | - | not judged: no peer ran |" in "\n".join(targets.render(no_peer)) \
        or "not judged: no peer ran" in "\n".join(targets.render(no_peer))
    slow = [_row("triton.auto", 1.0, True), _row("triton.auto", 2.5, False), _row("liger.fused", 2.0, False)]
    assert targets.decode(slow)[0]["gaps"][0].startswith("without PDL: triton ")
    # Only a side nobody judged: the shape is left out, never met.
    assert targets.decode([_row("triton.auto", 1.0, True), _row("liger.fused", 2.0, True)])[0]["gaps"] == []
    only_on = targets.decode([_row("triton.auto", 1.0, True), _row("liger.fused", 2.0, False)])
    assert only_on[0]["gaps"] == ["without PDL: no project kernel ran"]
    no_project = [_row("triton.auto", 1.0, False), _row("fi.default", 2.0, True), _row("fi.default", 2.1, False)]
    assert targets.decode(no_project)[0]["gaps"] == ["with PDL: no project kernel ran"]
    # Rows from before PDL was recorded: one comparison, as before.
    old = [_row("triton.auto", 1.0, None), _row("liger.fused", 1.2, None)]
    (t,) = targets.decode(old)
    assert t["gaps"] == [] and list(t["sides"]) == [None] and t["peer"] == ("liger.fused", pytest.approx(1.2e-6))
    assert "launch |" not in "\n".join(targets.render(old)) and "Programmatic" not in "\n".join(targets.render(old))


def test_fused_decode_targets_compare_each_side_apart():
    from harness.report import targets

    case = "add_rms_norm-in_place"
    rows = [_row("triton.fused", 2.0, True, case=case), _row("triton.fused", 2.6, False, case=case),
            _row("fi.fused_add", 2.1, True, case=case), _row("fi.fused_add", 2.5, False, case=case),
            _row("torch.fused", 9.0, False, case=case)]
    (t,) = targets.fused(rows)
    assert t["gaps"] == ["without PDL: triton.fused 2.60 µs > fi.fused_add 2.50 µs (t 0.00%)"]
    assert t["sides"]["with PDL"]["gaps"] == [] and t["sides"]["with PDL"]["best"] == ("triton.fused", "2.00 µs")
    md = "\n".join(targets.render(rows))
    assert "| decode | add_rms_norm-in_place | bfloat16 | 1 x 4096 | with PDL | 2.00 µs triton.fused |" in md
    assert "decode: **0 of 1**" in md
    only_off = [r for r in rows if r["kernel"] != "fi.fused_add" or not r["pdl"]]
    (u,) = targets.fused(only_off)
    assert u["gaps"] == [t["gaps"][0]] and u["sides"]["with PDL"]["note"] == "not judged: no peer ran"


def test_the_report_puts_pdl_on_and_off_side_by_side():
    from harness.report import targets

    rows = [_row("triton.auto", 1.0, True), _row("triton.auto", 1.5, False), _row("fi.default", 1.1, True),
            _row("fi.default", 1.4, False), _row("liger.fused", 1.2, False),
            _row("triton.fused", 2.0, True, case="add_rms_norm-new"),
            _row("triton.fused", 2.5, False, case="add_rms_norm-new"),
            _row("torch.fused", 9.0, False, case="add_rms_norm-new")]
    from harness.report import pdl_rows

    pairs = {(p["case"], p["kernel"]): p for p in pdl_rows.pdl_pairs(rows)}
    assert set(pairs) == {("rms_norm", "triton.auto"), ("rms_norm", "fi.default"), ("add_rms_norm-new", "triton.fused")}
    assert pairs[("rms_norm", "triton.auto")]["overlap_s"] == pytest.approx(0.5e-6)
    md = "\n".join(targets.render(rows))
    assert "### Programmatic dependent launch" in md
    assert "Launched with PDL in this run: `fi.default`, `triton.auto`, `triton.fused`" in md
    assert "| rms_norm | bfloat16 | 1 x 4096 | triton.auto | 1.00 | 1.50 | +0.50 µs (+33%) |" in md
    assert "| add_rms_norm-new | bfloat16 | 1 x 4096 | triton.fused | 2.00 | 2.50 | +0.50 µs (+20%) |" in md
    # A decode table keyed by kernel names a kernel timed both ways by its launch.
    named = [r["kernel"] for r in pdl_rows.pdl_columns([r for r in rows if r["case"] == "rms_norm"])]
    assert named == ["triton.auto (PDL)", "triton.auto (no PDL)", "fi.default (PDL)", "fi.default (no PDL)",
                     "liger.fused"]
    # No row launched with PDL (every PDL-on timing skipped, a card before sm_90): said, that side
    # not judged, the other judged.
    off = [r for r in rows if not r["pdl"]]
    md = "\n".join(targets.render(off))
    assert "No row launched with PDL in this run" in md
    assert "| rms_norm | bfloat16 | 1 x 4096 | with PDL | - | - | - | not judged: nothing ran |" in md
    assert targets.decode(off)[0]["sides"]["with PDL"]["note"] == "not judged: nothing ran"
    # The project's PDL row skipped where a peer's ran: a gap on that side.
    lost = [r for r in rows if not (r["pdl"] and r["kernel"] == "triton.auto")]
    assert "with PDL: no project kernel ran" in targets.decode([r for r in lost if r["case"] == "rms_norm"])[0]["gaps"]


# -- FlashInfer's plug-in -------------------------------------------------------------------------
@pytest.fixture
def flashinfer(monkeypatch):
    """examples/flashinfer_backend.py on the stand-ins of flashinfer.norm (tests/peer_fakes.py)."""
    from impls import registry
    from impls.base import OptionalImport
    from tests import peer_fakes

    path = ROOT / "examples" / "flashinfer_backend.py"
    registry.load_file(path)
    module = sys.modules[f"normdiff_plugin_{path.stem}"]
    for name, mod in peer_fakes.modules().items():
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(module, "FLASHINFER", OptionalImport("flashinfer.norm", missing="stand-in"))
    return module


def test_flashinfer_passes_the_switch_and_declares_pdl_where_its_call_takes_it(flashinfer, monkeypatch):
    from impls import registry
    from impls.fused import FusedOutputs, FusedParams
    from tests import peer_fakes

    kernels = {k.variant + "/" + k.op: k for k in registry.kernels(["flashinfer"], family=None)}
    declared = {name for name, k in kernels.items() if k.pdl}
    assert declared == {"default/rms_norm", "fused_add/add_rms_norm", "gemma_fused_add/add_rms_norm",
                        "fused_add_quant/add_rms_norm", "gemma/rms_norm", "quant/rms_norm"}
    monkeypatch.setattr(pdl, "unavailable", lambda device: None)  # as on a GPU that has PDL

    def aligned(*shape):  # rows as FlashInfer's compact kernel takes them (128-byte starts)
        buf = torch.randn(shape[0] * shape[-1] + 64).to(torch.bfloat16)
        skip = (-buf.data_ptr() % 128) // buf.element_size()
        return buf[skip:skip + shape[0] * shape[-1]].view(*shape)

    x, r, w = aligned(4, 256), aligned(4, 256), aligned(1, 256)[0]
    for on in (True, False):
        peer_fakes.LOG.clear()
        with pdl.forced(on):
            rms = kernels["default/rms_norm"]
            rms.bench_callable(x, w, None, 1e-6, None)()
            rms._call(x, w, None, 1e-6)
            add = kernels["fused_add/add_rms_norm"]
            add.bench_fused_callable(x, r, w, None, 1e-6, FusedParams(write="in_place"), None)()
            add._forward(x, r, w, None, 1e-6, FusedParams(write="in_place"), FusedOutputs(x, r))
        assert [(name, kw.get("enable_pdl")) for name, _, kw in peer_fakes.LOG] == [
            ("rmsnorm", on), ("rmsnorm", on), ("fused_add_rmsnorm", on), ("fused_add_rmsnorm", on)]


def test_the_written_report_judges_and_shows_both_launches(tmp_path):
    from harness.report import benchmark as report
    from harness.report import publish

    def bench(kernel, us, pdl_on, project):
        ei = {"op": "rms_norm", "dtype": "bfloat16", "m": 1, "n": 4096, "regime": "decode", "repeat": 0,
              "kernel": kernel, "project": project, "bytes": 16384, "ceiling_gbps": 3000.0, "timing": "graph",
              "timer": "graph", "device": "Synthetic GPU #0", "pdl": pdl_on}
        launch = "" if kernel in ("liger.fused", "torch.eager") else "-pdl" if pdl_on else "-nopdl"
        return {"name": f"test_bench[rms_norm-bfloat16-1x4096-{kernel}{launch}]", "group": "rms_norm-bfloat16-1x4096",
                "stats": {"median": us * 1e-6, "rounds": 50}, "extra_info": ei}

    doc = {"benchmarks": [bench("torch.eager", 5.0, False, False), bench("triton.auto", 1.0, True, True),
                          bench("triton.auto", 1.5, False, True), bench("fi.default", 1.1, True, False),
                          bench("fi.default", 1.4, False, False), bench("liger.fused", 1.2, False, False)],
           "normdiff": {"selection": {"baseline": "torch.eager"}, "skipped": [], "failed": []}}
    report.write_all(doc, tmp_path)
    md = (tmp_path / "benchmark.md").read_text()
    assert "| rms_norm | bfloat16 | 1 x 4096 | with PDL | 1.00 triton.auto | 1.10 fi.default | 0.00% | met |" in md
    assert "without PDL | 1.50 triton.auto | 1.20 liger.fused | 0.00% | triton 1.50 µs > liger.fused" in md
    assert "| rms_norm | bfloat16 | 1 x 4096 | triton.auto | 1.00 | 1.50 | +0.50 µs (+33%) |" in md
    decode = md.split("## Decode regime", 1)[1]
    assert "triton.auto (PDL)" in decode and "triton.auto (no PDL)" in decode and "| liger.fused |" in decode
    assert publish.benchmark_markdown(publish.slim_benchmark(doc)) == md
    # Comparing two runs keeps a kernel's two launches apart (neither hides the other).
    from harness.report import compare

    slower = {**doc, "benchmarks": [dict(b, stats={**b["stats"], "median": b["stats"]["median"] * 2})
                                    if b["extra_info"]["pdl"] else b for b in doc["benchmarks"]]}
    moved = {(k, g) for k, g, *_ in compare.compare_speed(doc, slower)["moved"]}
    assert moved == {("triton.auto (PDL)", "rms_norm-bfloat16-1x4096"), ("fi.default (PDL)", "rms_norm-bfloat16-1x4096")}
