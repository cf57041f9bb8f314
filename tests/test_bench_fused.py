"""The fused ops' benchmarks (harness/benchmarks/bench_fused.py): bytes per op, convention and fp8
output; the headline rows; a CPU run of just the fused benchmarks (eager torch timed, every other
kernel skipped with its reason, each in-place call starting from the same inputs); the targets and
the report on fused rows."""
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from harness.benchmarks import bench_fused
from harness.benchmarks.arena import Arena
from harness.benchmarks.bench_fused import FusedShape, fused_bytes
from harness.judging.shapes import BANDWIDTH_ELEMENTS, bandwidth_rows
from impls.fused import ADD_OPS, FUSED_OPS, FusedParams, FusedSpec, validate_fused

ROOT = Path(__file__).resolve().parents[1]
BF16, F32, E4M3 = torch.bfloat16, torch.float32, torch.float8_e4m3fn


# -- bytes ----------------------------------------------------------------------------------------
def test_bytes_per_op_convention_and_fp8():
    m, n = 16384, 4096
    e = m * n
    # add_rms_norm bf16: x and residual read, y and residual_out written (2 bytes each), weight read.
    assert fused_bytes("add_rms_norm", m, n, BF16, BF16, BF16, BF16) == 4 * 2 * e + 2 * n
    # ... and its rstd where the kernel writes it.
    assert fused_bytes("add_rms_norm", m, n, BF16, BF16, BF16, BF16, stats=1) == 4 * 2 * e + 2 * n + 4 * m
    # A float32 residual stream: residual read and residual_out written at 4 bytes.
    assert fused_bytes("add_rms_norm", m, n, BF16, BF16, F32, F32) == 2 * 2 * e + 2 * 4 * e + 2 * n
    # rms_norm with an fp8 y: x read (2 bytes), y written at one byte an element, weight read.
    assert fused_bytes("rms_norm", m, n, BF16, E4M3) == 2 * e + e + 2 * n
    # add_layer_norm: the bias read too, mean and rstd written.
    assert fused_bytes("add_layer_norm", m, n, BF16, BF16, BF16, BF16, has_bias=True, stats=2) == \
        4 * 2 * e + 2 * 2 * n + 8 * m


def expected_bytes(ei: dict) -> int:
    """A row's bytes from its recorded call, counted apart from fused_bytes."""
    size = lambda name: torch.empty(0, dtype=getattr(torch, name)).element_size()  # noqa: E731
    e, n = ei["m"] * ei["n"], ei["n"]
    x = size(ei["dtype"])
    total = e * x + e * size(ei["out_dtype"] or ei["dtype"]) + n * x * (2 if "layer_norm" in ei["op"] else 1)
    if ei["op"] in ADD_OPS:  # residual read, residual_out written: the same in place
        total += e * size(ei["residual_dtype"]) + e * size(ei["residual_out_dtype"])
    return total + 4 * ei["m"] * len({"mean", "rstd"} & set(ei["outputs"]))


# -- the rows -------------------------------------------------------------------------------------
def test_headline_rows():
    shapes = bench_fused.sweep("full", FUSED_OPS, ("bfloat16",), repeat=1, bench_set="headline")
    got = {(s.op, s.write, s.out_dtype, s.m, s.n, s.regime) for s in shapes}
    want = set()
    for n in (4096, 8192):
        for w in ("in_place", "new"):
            want.add(("add_rms_norm", w, None, bandwidth_rows(n), n, "bandwidth"))
            want |= {("add_rms_norm", w, None, m, n, "decode") for m in (1, 64)}
    want.add(("rms_norm", "new", "float8_e4m3fn", bandwidth_rows(4096), 4096, "bandwidth"))
    # add_rms_norm to fp8 in out_y: the one convention a fused add and quantise writes (FlashInfer's)
    want.add(("add_rms_norm", "out_y", "float8_e4m3fn", bandwidth_rows(4096), 4096, "bandwidth"))
    assert got == want
    assert all(s.m * s.n >= BANDWIDTH_ELEMENTS for s in shapes if s.regime == "bandwidth")  # bandwidth bound
    fp8, add_fp8 = sorted((s for s in shapes if s.out_dtype), key=lambda s: s.op != "rms_norm")
    assert fp8.scale == 0.5 and fp8.case == "rms_norm-float8_e4m3fn" and fp8.dtype == "bfloat16"
    assert add_fp8.scale == 0.5 and add_fp8.case == "add_rms_norm-out_y-float8_e4m3fn"
    # Each convention a group of its own; the groups never take a plain row's name.
    assert len({s.group for s in shapes}) == len(shapes)
    assert all(s.group.startswith(f"{s.case}-bfloat16-") and s.case != s.op for s in shapes)
    # --bench-repeat: the bandwidth rows once per pass, decode once.
    again = bench_fused.sweep("full", FUSED_OPS, ("bfloat16",), repeat=2, bench_set="headline")
    assert len(again) == len(shapes) + sum(s.regime == "bandwidth" for s in shapes)
    # --op add_rms_norm: only its rows.
    assert {s.op for s in bench_fused.sweep("full", ("add_rms_norm",), ("bfloat16",), 1, "headline")} == {"add_rms_norm"}


@pytest.mark.parametrize("profile, bench_set", [("quick", "headline"), ("full", "headline"), ("full", "full")])
def test_every_row_is_a_valid_call(profile, bench_set):
    """Every shape of every set is a call the interface accepts (impls.fused.validate_fused) and
    lays out in the arena without overlap; the quick set keeps to the plain quick shapes."""
    from harness.judging import shapes as plain

    rows = bench_fused.sweep(profile, FUSED_OPS, ("float32", "float16", "bfloat16"), 1, bench_set)
    assert rows and len({(s.group, s.repeat, s.regime) for s in rows}) == len(rows)
    for s in rows:
        x = torch.randn(2, 8).to(s.x_dtype)
        r = torch.randn(2, 8).to(s.r_dtype) if s.add else None
        b = torch.zeros(8, dtype=s.x_dtype) if "layer_norm" in s.op else None
        validate_fused(s.op, x, r, torch.ones(8, dtype=s.x_dtype), b, 1e-6, s.params())
    if profile == "quick":
        assert {(s.m, s.n) for s in rows} <= {*plain.QUICK_BANDWIDTH, *plain.QUICK_DECODE}
    for s in {(s.case, s.dtype): s for s in rows if s.m * s.n <= 2**20}.values():
        views = Arena(Arena.layout(s)[1], "cpu").views(s)
        spans = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in views.values())
        assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:]))
        assert views["y"].dtype == s.y_dtype and views["x"].shape == (s.m, s.n)
        if s.add:  # residual_out's room holds float32, whatever dtype a kernel writes it in
            assert views["r_out"].dtype == torch.float32 and views["r_out"].shape == (s.m, s.n)


def test_the_phases_keep_plain_and_fused_rows_of_a_pass_together():
    from harness.benchmarks.bench_sweep import BenchShape

    plain = [BenchShape("rms_norm", "bfloat16", 16384, 4096, "bandwidth", r) for r in (0, 1)]
    plain += [BenchShape("rms_norm", "bfloat16", 1, 4096, "decode"), BenchShape("rms_norm", "bfloat16", 16384, 4096, "backward")]
    fused = bench_fused.sweep("full", ("add_rms_norm",), ("bfloat16",), 2, "headline")
    order = sorted(plain + fused, key=lambda s: bench_fused.phase(s, 2))
    regimes = [(s.regime, s.repeat) for s in order]
    assert regimes == sorted(regimes, key=lambda rr: {"bandwidth": rr[1], "decode": 2, "backward": 3}[rr[0]])
    assert order[0] is plain[0]  # plain first within a pass


class _InPlaceOnly(bench_fused.FusedNormKernel):
    backend, variant, op, writes = "mine", "inplace", "add_rms_norm", ("in_place",)


class _NewOnly(bench_fused.FusedNormKernel):
    backend, variant, op, writes = "mine", "new", "add_rms_norm", ("new",)


def test_a_kernel_is_skipped_with_its_reason_where_it_does_not_write_the_rows_convention():
    rows = {s.write: s for s in bench_fused.sweep("full", ("add_rms_norm",), ("bfloat16",), 1, "headline")
            if s.n == 4096 and s.regime == "bandwidth"}
    with pytest.raises(pytest.skip.Exception, match="mine.inplace does not write 'new' \\(writes in_place\\)"):
        bench_fused.fused_spec(_InPlaceOnly(), rows["new"])
    with pytest.raises(pytest.skip.Exception, match="mine.new does not write 'in_place' \\(writes new\\)"):
        bench_fused.fused_spec(_NewOnly(), rows["in_place"])
    spec, device = bench_fused.fused_spec(_InPlaceOnly(), rows["in_place"])
    assert isinstance(spec, FusedSpec) and spec.write == "in_place" and spec.residual_dtype == BF16 and device == "cpu"


def test_settle_restores_a_call_that_writes_its_inputs():
    calls, restores = [], []
    fn = bench_fused.restoring(lambda: calls.append(1), lambda: restores.append(len(calls)), every=4)
    for _ in range(10):
        fn()
    assert len(calls) == 10 and restores == [3, 7]  # before the 4th and the 8th call


# -- a CPU run ------------------------------------------------------------------------------------
# A peer plug-in of the kind FlashInfer's is: add_rms_norm in place only (eager torch's work), each
# call logging the sums of the x and residual it starts from.
PLUGIN = textwrap.dedent('''
    import os

    from impls.registry import register
    from impls.torch_fused import TorchAddRMSNorm


    @register
    class InPlaceOnly(TorchAddRMSNorm):
        backend = "inplacepeer"
        variant = "fused_add"
        writes = ("in_place",)

        def _forward(self, x, residual, weight, bias, eps, params, out):
            with open(os.environ["FUSED_INPUTS_LOG"], "a") as f:
                f.write(f"{x.shape[0]}x{x.shape[1]} {x.float().sum().item():.9e} {residual.float().sum().item():.9e}\\n")
            super()._forward(x, residual, weight, bias, eps, params, out)
''')


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fused")
    (tmp / "peer.py").write_text(PLUGIN)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "FUSED_INPUTS_LOG": str(tmp / "inputs.log"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    t0 = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:randomly", "benchmarks", "--benchmark-only", "-m", "fused",
         "--backend", "torch,triton,tilelang,inplacepeer", f"--backend-file={tmp / 'peer.py'}",
         "--op", "add_rms_norm,rms_norm", "--dtype", "bfloat16", "--profile", "quick", "--bench-rounds", "3",
         f"--report-dir={tmp / 'out'}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    return tmp, proc, time.time() - t0


def test_a_cpu_run_of_the_fused_benchmarks(cpu_run):
    tmp, proc, seconds = cpu_run
    log = proc.stdout[-4000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, log
    doc = json.loads((tmp / "out" / "benchmark.json").read_text())
    rows = [b["extra_info"] for b in doc["benchmarks"]]
    # -m fused: no plain row; eager torch and the in-place peer timed (the peer at its one convention).
    assert rows and all(ei["family"] == "fused" for ei in rows)
    timed = {(ei["kernel"], ei["case"], ei["regime"]) for ei in rows}
    assert timed == {("torch.fused", "add_rms_norm-in_place", "bandwidth"), ("torch.fused", "add_rms_norm-new", "bandwidth"),
                     ("torch.fused", "add_rms_norm-in_place", "decode"), ("torch.fused", "add_rms_norm-new", "decode"),
                     ("torch.fused", "rms_norm-float8_e4m3fn", "bandwidth"),
                     ("torch.fused", "add_rms_norm-out_y-float8_e4m3fn", "bandwidth"),
                     ("inplacepeer.fused_add", "add_rms_norm-in_place", "bandwidth"),
                     ("inplacepeer.fused_add", "add_rms_norm-in_place", "decode")}
    for ei in rows:
        assert ei["bytes"] == expected_bytes(ei), ei
        assert ei["correct"] and ei["timer"] == "wall" and ei["rounds"] == 3 and ei["pct_of_copy"] > 0
        assert ei["baseline"] == "torch.fused"
        assert ("restored" in ei["inputs"]) == (ei["write"] != "new")  # in place and out_y write residual
        assert ei["screen_rel_l2"]["y"] < 0.1  # the fp8 row's bound; a bfloat16 y's is 0.02
    # Every other kernel skipped with its reason: Triton interpreted, TileLang without a GPU, the
    # in-place peer at the rows of new outputs.
    from impls import registry

    registry.load_builtins()
    project = {k.name for k in registry.kernels(["triton", "tilelang"], family="fused") if k.op in ("add_rms_norm", "rms_norm")}
    from impls import pdl

    skipped = doc["normdiff"]["skipped"]
    # A PDL-on timing (a kernel that can launch with PDL, at decode) is skipped with PDL's reason here.
    why = {f"PDL on: {pdl.unavailable(device)}" for device in ("cpu", "cuda")}  # a CUDA-only kernel's: no CUDA here
    assert all(s["reason"] in why for s in skipped if s["pdl"])
    reasons = {(s["kernel"], s["reason"]) for s in skipped if not s["pdl"]}
    assert {k for k, _ in reasons} == project | {"inplacepeer.fused_add"}
    assert all(why.strip() for _, why in reasons)
    for k, why in reasons:
        if k.startswith("triton."):
            assert why == "triton runs under its interpreter on this machine: not a timing", (k, why)
            assert "SKIPPED" in proc.stdout and "not a timing" in proc.stdout
        elif k.startswith("tilelang."):
            assert "not executed" in why or "CUDA" in why, (k, why)
    assert ("inplacepeer.fused_add", "inplacepeer.fused_add does not write 'new' (writes in_place)") in reasons
    # In place: every call (the screened one, warm-up and timed rounds) started from the same x and
    # residual, restored outside the timed span.
    by_shape: dict = {}
    for line in (tmp / "inputs.log").read_text().splitlines():
        shape, sums = line.split(" ", 1)
        by_shape.setdefault(shape, []).append(sums)
    assert set(by_shape) == {"512x1024", "8x4096"}
    assert all(len(v) >= 1 + 2 + 3 and len(set(v)) == 1 for v in by_shape.values()), by_shape
    md = (tmp / "out" / "benchmark.md").read_text()
    assert "### add_rms_norm (fused), in place, bfloat16" in md and "% of copy" in md
    assert "### rms_norm (fused), float8_e4m3fn output, scale 0.5, bfloat16" in md
    assert "**CPU smoke run.**" in md and "residual read and residual_out written" in md
    assert seconds < 240, seconds


# -- targets and the report -----------------------------------------------------------------------
def _row(kernel, pct=None, case="add_rms_norm-in_place", m=16384, n=4096, regime="bandwidth", median_s=None,
         repeat=0, family="fused"):
    """A row as harness.report.benchmark_results gives it; the median follows % of copy (100% is
    10 µs), or is given (decode)."""
    op = case.split("-")[0]
    return {"family": family, "case": case if family == "fused" else op, "title": case, "op": op,
            "dtype": "bfloat16", "m": m, "n": n, "regime": regime, "repeat": repeat, "kernel": kernel,
            "group": f"{case}-bfloat16-{m}x{n}", "pct": pct, "median_s": median_s or 1e-3 / pct,
            "project": kernel.split(".")[0] in ("triton", "tilelang"), "baseline": "torch.fused"}


def test_targets_judge_fused_rows():
    from harness.report import targets

    rows = [
        # in place: met (96% >= 95%, as fast as the in-place peer).
        _row("triton.fused", 96.0), _row("tilelang.fused", 90.0), _row("flashinfer.fused_add", 95.5),
        # new outputs at the same shape: a peer ahead (compared on this convention only).
        _row("triton.fused", 96.0, "add_rms_norm-new"), _row("liger.fused_add", 97.0, "add_rms_norm-new"),
        # fp8 rms_norm: short of 95%; a plain rms_norm row at the same M x N is no part of it.
        _row("triton.fused", 93.0, "rms_norm-float8_e4m3fn"), _row("torch.fused", 40.0, "rms_norm-float8_e4m3fn"),
        _row("triton.rowwise", 97.5, "rms_norm", family="plain"),
        # no project kernel ran: a gap; too few elements for a bandwidth target: not judged.
        _row("torch.fused", 50.0, "add_rms_norm-out_y"), _row("triton.fused", 10.0, m=64, n=1024),
        # decode: slower than the best peer; a second decode shape with no peer is not judged.
        _row("triton.fused", median_s=3e-6, m=1, regime="decode"),
        _row("flashinfer.fused_add", median_s=2e-6, m=1, regime="decode"),
        _row("triton.fused", median_s=3e-6, m=64, regime="decode"),
    ]
    got = {(t["regime"], t["case"], t["m"]): t for t in targets.fused(rows)}
    assert set(got) == {("bandwidth", "add_rms_norm-in_place", 16384), ("bandwidth", "add_rms_norm-new", 16384),
                        ("bandwidth", "rms_norm-float8_e4m3fn", 16384), ("bandwidth", "add_rms_norm-out_y", 16384),
                        ("decode", "add_rms_norm-in_place", 1)}
    assert got[("bandwidth", "add_rms_norm-in_place", 16384)]["gaps"] == []
    assert got[("bandwidth", "add_rms_norm-in_place", 16384)]["best"] == ("triton.fused", "96.0%")
    assert got[("bandwidth", "add_rms_norm-new", 16384)]["gaps"] == [
        "triton.fused 96.0% < liger.fused_add 97.0% (t 0.00%)"]
    assert got[("bandwidth", "rms_norm-float8_e4m3fn", 16384)]["gaps"] == ["best 93.0% < 95%"]
    assert got[("bandwidth", "add_rms_norm-out_y", 16384)]["gaps"] == ["no project fused kernel ran"]
    assert got[("decode", "add_rms_norm-in_place", 1)]["gaps"] == [
        "triton.fused 3.00 µs > flashinfer.fused_add 2.00 µs (t 0.00%)"]
    # The margin rule: a second pass that moved triton.fused by 1.5% excuses its 1.04% loss there.
    moved = rows + [_row("triton.fused", 96.0 / 1.015, "add_rms_norm-new", repeat=1)]
    t = {(t["regime"], t["case"], t["m"]): t for t in targets.fused(moved)}[("bandwidth", "add_rms_norm-new", 16384)]
    assert t["t"] == pytest.approx(0.015, rel=1e-3) and t["gaps"] == []
    # The plain targets never see a fused row, the fused ones never a plain row.
    plain = targets.bandwidth(rows)
    assert [(p["op"], p["n"]) for p in plain] == [("rms_norm", 4096)] and plain[0]["gaps"] == []
    md = "\n".join(targets.render(rows))
    assert "### Fused ops" in md and "**1 of 4** meet every target" in md and "decode: **0 of 1**" in md
    assert "| bandwidth | rms_norm-float8_e4m3fn | bfloat16 | 16384 x 4096 | 93.0% triton.fused | - | " \
           "93.0% triton.fused | 40.0% torch.fused | 0.00% | best 93.0% < 95% |" in md


def test_the_report_shows_fused_rows_with_gbps_and_percent_of_copy(tmp_path):
    from harness.report import benchmark as report

    def bench(kernel, case, median, project, write="in_place", out_dtype=None):
        op = case.split("-")[0]
        nbytes = fused_bytes(op, 16384, 4096, BF16, E4M3 if out_dtype else BF16, BF16 if op in ADD_OPS else None)
        ei = {"op": op, "dtype": "bfloat16", "m": 16384, "n": 4096, "regime": "bandwidth", "repeat": 0,
              "kernel": kernel, "project": project, "bytes": nbytes, "ceiling_gbps": 3000.0, "family": "fused",
              "case": case, "case_title": f"{op} (fused), {write}", "baseline": "torch.fused", "timing": "events",
              "timer": "events", "device": "Synthetic GPU #0", "write": write, "out_dtype": out_dtype}
        return {"name": f"test_bench[{case}-{kernel}]", "group": f"{case}-bfloat16-16384x4096",
                "stats": {"median": median, "rounds": 40}, "extra_info": ei}

    doc = {"benchmarks": [bench("torch.fused", "add_rms_norm-in_place", 400e-6, False),
                          bench("triton.fused", "add_rms_norm-in_place", 200e-6, True)],
           "normdiff": {"selection": {"baseline": "torch.eager"}, "skipped": [], "failed": []}}
    report.write_all(doc, tmp_path)
    md = (tmp_path / "benchmark.md").read_text()
    nbytes = doc["benchmarks"][1]["extra_info"]["bytes"]
    gbps = nbytes / 200e-6 / 1e9
    assert "### add_rms_norm (fused), in_place, bfloat16" in md
    assert f"| 16384 x 4096 | ★ triton.fused | 200.0 | {gbps:.0f} | {100 * gbps / 3000:.1f}% | 2.00x |" in md
    assert "vs torch.fused" in md and "### Fused ops" in md
    assert (tmp_path / "benchmark-add_rms_norm-in_place-bfloat16.png").read_bytes()[:4] == b"\x89PNG"
    # Published (the slimmed JSON): the same rows, so the same markdown.
    from harness.report import publish

    slim = publish.slim_benchmark(doc)
    assert report.results(slim) == report.results(doc)
    assert publish.benchmark_markdown(slim) == md


def test_two_passes_with_every_peer_plug_in(cpu_run, tmp_path):
    """--bench-repeat 2 with the peers' plug-ins loaded beside a peer that runs here: each bandwidth
    row timed in both passes, the peers that cannot run here skipped with their reasons, and the
    speed targets' t taken from the passes' spread."""
    tmp = cpu_run[0]
    files = ["examples/liger_backend.py", "examples/quack_backend.py", "examples/flashinfer_backend.py", str(tmp / "peer.py")]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "FUSED_INPUTS_LOG": str(tmp_path / "inputs.log"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:randomly", "benchmarks", "--benchmark-only", "-m", "fused",
         "--backend", "torch,inplacepeer,liger,quack,flashinfer", *(f"--backend-file={f}" for f in files),
         "--op", "add_rms_norm", "--dtype", "bfloat16", "--profile", "quick", "--bench-rounds", "3",
         "--bench-repeat", "2", f"--report-dir={tmp_path / 'out'}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    doc = json.loads((tmp_path / "out" / "benchmark.json").read_text())
    passes = {(ei["kernel"], ei["case"], ei["repeat"]) for ei in (b["extra_info"] for b in doc["benchmarks"])
              if ei["regime"] == "bandwidth"}
    for kernel, case in (("inplacepeer.fused_add", "add_rms_norm-in_place"), ("torch.fused", "add_rms_norm-out_y-float8_e4m3fn")):
        assert {(kernel, case, 0), (kernel, case, 1)} <= passes, passes
    skipped = {s["kernel"].split(".")[0] for s in doc["normdiff"]["skipped"]}
    assert {"liger", "quack", "flashinfer"} <= skipped
    # Each kernel's spread between the passes, the t of every comparison it is in (the CPU's smoke
    # report ranks nothing; on a GPU the speed targets print it per target).
    from harness.report import benchmark_results, targets

    spreads = targets.pass_spreads(benchmark_results.results(doc))
    assert {"inplacepeer.fused_add", "torch.fused"} <= set(spreads)
    assert targets.margin(spreads, "inplacepeer.fused_add", "torch.fused") <= targets.MARGIN_CAP
