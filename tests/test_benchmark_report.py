"""The benchmark suite: its report from a fixture JSON, and a real `pytest --benchmark-only` run on
the CPU that must produce the markdown, the JSON and the plots, with pytest-benchmark's own stats
holding the kernel times."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from harness.benchmarks import bench_forward, bench_sweep, timing
from harness.judging import shapes
from harness.benchmarks.arena import Arena
from harness.judging.cases import DTYPES
from harness.report import benchmark as report

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "data" / "benchmark_sample.json"


@pytest.fixture(scope="module")
def sample() -> dict:
    return json.loads(FIXTURE.read_text())


def _row_of(md: str, section: str, first_cell: str) -> list[str]:
    part = md.split(section, 1)[1]
    for line in part.splitlines():
        if line.startswith(f"| {first_cell} |"):
            return [c.strip() for c in line.strip("|").split("|")]
    raise AssertionError(f"no row {first_cell!r} under {section!r}")


def test_report_from_fixture(sample, tmp_path):
    paths = report.write_all(sample, tmp_path)
    md = (tmp_path / "benchmark.md").read_text()
    assert paths[0] == tmp_path / "benchmark.md"
    # Header: the device, the ceiling and the command of the run.
    assert "Synthetic GPU (test fixture)" in md and "4000 GB/s" in md and "--bench-repeat 2" in md
    # % of copy = bytes / median / ceiling; the fastest kernel of the shape is starred.
    rms = "### RMSNorm, bfloat16"
    row = _row_of(md, rms, "16384 x 4096")
    nbytes = timing.bytes_moved(16384, 4096, torch.bfloat16, True, False, 1)
    eager_pct = 100 * nbytes / 100e-6 / 1e9 / 4000
    assert row == ["16384 x 4096", f"{eager_pct:.1f}%", "83.9%", "**★ 93.2%**"]
    assert _row_of(md, rms, "65536 x 1024")[2] == "**★ 79.0%**"  # looped wins there
    assert _row_of(md, rms, "16384 x 131072")[3] == "-"  # rowwise did not run it
    # Speedup over the baseline on the same shape, in the detail table.
    assert "| 16384 x 4096 | ★ triton.rowwise | 72.0 | 3729 | 93.2% | 1.39x |" in md
    # Decode regime in µs, and the kernel that could not be captured in a graph is named.
    assert _row_of(md, "## Decode regime", "8 x 4096") == ["8 x 4096", "4.5 µs", "6.0 µs", "**★ 2.5 µs**"]
    assert "triton.looped: CUDA events, CUDA-graph capture failed" in md
    # Repeatability: rowwise moved 5% between the passes (over the 3% limit), the others 1%.
    rep = md.split("## Repeatability", 1)[1].split("## Skipped", 1)[0]
    assert "Largest move of a median from the first pass: 5.00% (triton.rowwise" in rep
    assert "| triton.rowwise | 2 | +5.00% | rms_norm-bfloat16-16384x4096 | **no** |" in rep
    assert "| torch.eager | 2 | +1.00% | rms_norm-bfloat16-16384x4096 | yes |" in rep
    # Skips counted per kernel and reason; failures listed, never in the tables.
    assert "## Skipped (4)" in md
    assert "| tilelang.fragment | tilelang compiled for sm_90, not executed (no GPU) | 3 |" in md
    assert "## Failed (2)" in md and "planted.ignores_weight" not in md.split("## Failed", 1)[0]
    # One plot per op and dtype with bandwidth results, each a real PNG linked from the markdown.
    for op in ("rms_norm", "layer_norm"):
        png = tmp_path / f"benchmark-{op}-bfloat16.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
        assert f"]({png.name})" in md


def test_plot_has_a_line_per_kernel_the_ceiling_and_a_log2_axis(sample):
    rows = [r for r in report.results(sample) if r["op"] == "rms_norm" and r["regime"] == "bandwidth" and r["repeat"] == 0]
    fig = report.figure(rows, "rms_norm", "bfloat16", 4000.0, "fixture")
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.xaxis.get_transform().base == 2
    labelled = {line.get_label(): line for line in ax.get_lines() if not line.get_label().startswith("_")}
    assert set(labelled) == {"torch.eager", "triton.rowwise", "triton.looped"}
    assert list(labelled["triton.looped"].get_xdata()) == [1024, 4096, 131072]
    ceiling = [line for line in ax.get_lines() if line.get_label() == "_copy ceiling"]
    assert ceiling and set(ceiling[0].get_ydata()) == {4000.0}


def test_render_again_from_the_saved_json(sample, tmp_path):
    report.write_all(sample, tmp_path / "a")
    out = tmp_path / "b"
    subprocess.run([sys.executable, "-m", "harness.report.benchmark", str(tmp_path / "a" / "benchmark.json"),
                    "--out", str(out)], check=True, cwd=ROOT, capture_output=True)
    assert (out / "benchmark.md").read_text() == (tmp_path / "a" / "benchmark.md").read_text()
    assert (out / "benchmark-rms_norm-bfloat16.png").exists()


def test_runs_split_over_commands_merge_into_one_report(sample, tmp_path):
    rms = {**sample, "benchmarks": [b for b in sample["benchmarks"] if b["extra_info"]["op"] == "rms_norm"]}
    layer = {**sample, "benchmarks": [b for b in sample["benchmarks"] if b["extra_info"]["op"] == "layer_norm"],
             "normdiff": {**sample["normdiff"], "skipped": [], "failed": [], "command": "second run"}}
    for name, doc in (("a.json", rms), ("b.json", layer)):
        (tmp_path / name).write_text(json.dumps(doc))
    subprocess.run([sys.executable, "-m", "harness.report.benchmark", str(tmp_path / "a.json"), str(tmp_path / "b.json"),
                    "--out", str(tmp_path / "merged")], check=True, cwd=ROOT, capture_output=True)
    md = (tmp_path / "merged" / "benchmark.md").read_text()
    assert "### RMSNorm, bfloat16" in md and "### LayerNorm, bfloat16" in md and "second run" in md
    assert "## Skipped (4)" in md and "## Failed (2)" in md
    assert len(json.loads((tmp_path / "merged" / "benchmark.json").read_text())["benchmarks"]) == len(sample["benchmarks"])


def test_sweep_shapes():
    full = bench_sweep.sweep("full", ["rms_norm"], ["bfloat16"], repeat=2)
    bw = [s for s in full if s.regime == "bandwidth"]
    assert all(s.m * s.n >= 2**26 and s.m >= 16384 for s in bw)
    assert sorted({s.n for s in bw}) == sorted(shapes.BANDWIDTH_N + shapes.BENCH_LONG_N)
    assert [s.repeat for s in bw] == [0] * (len(bw) // 2) + [1] * (len(bw) // 2)  # a second whole pass
    assert {(s.m, s.n) for s in full if s.regime == "decode"} == {(m, n) for m in (1, 8, 64) for n in (4096, 8192)}
    assert all(s.m * s.n <= 2**20 for s in bench_sweep.sweep("quick", ["rms_norm"], ["float32"]))


def test_unwritten_rows_outside_the_sample_are_caught():
    """The oracle sees a sample of rows; the NaN poison catches a row outside it left unwritten."""
    from impls import registry
    from impls.reference import reference

    registry.load_builtins()
    kernel = registry.get("rms_norm", "torch", "eager")
    s = bench_sweep.BenchShape("rms_norm", "float32", 8192, 1024, "bandwidth")
    x = torch.randn(s.m, s.n)
    w = torch.rand(s.n) + 0.5
    out = kernel(x, w, None, 1e-6)
    assert bench_forward.verify(kernel, s, x, w, None, 1e-6, out, "cpu")[0] == []
    sampled = set(bench_forward.sample_rows(s.m, s.n, "cpu").tolist())
    missing = next(i for i in range(s.m) if i not in sampled)
    out.y[missing] = float("nan")
    problems, _ = bench_forward.verify(kernel, s, x, w, None, 1e-6, out, "cpu")
    assert problems and "y: 1024 of" in problems[0]
    # And a wrong value inside the sample fails on the comparison with the oracle.
    out = kernel(x, w, None, 1e-6)
    out.y[0] = reference("rms_norm", x[:1], None, None, 1e-6).y.float()  # weight ignored on row 0
    assert any("out of tolerance" in p for p in bench_forward.verify(kernel, s, x, w, None, 1e-6, out, "cpu")[0])


# -- a real run on the CPU ------------------------------------------------------------------------
OUTSIDE = textwrap.dedent('''
    """Backends for the benchmark run test: a correct one that is slow (3 ms a call, 0.5 s to
    prepare) and a fast wrong one."""
    import time

    from impls.registry import register
    from tests.planted import Correct, IgnoresWeight


    class Slow(Correct):
        backend = "slowpoke"
        variant = "sleeps"

        def prepare(self, spec):
            time.sleep(0.5)  # compilation: must stay out of the timed calls

        def bench_callable(self, x, weight, bias, eps, out):
            return lambda: time.sleep(0.003)


    for op in ("rms_norm", "layer_norm"):
        register(Slow(op))
        register(IgnoresWeight(op))
''')


def _pytest(*args, cwd=ROOT):
    # The CPU path of the suite, also on a machine with a GPU (which would time Triton there).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:randomly", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    (tmp / "outside.py").write_text(OUTSIDE)
    # Paths outside the project go with "=": pytest takes a bare path argument as a rootdir candidate.
    # -m "not fused": the plain norms' rows (the fused ops' have their own, tests/test_bench_fused.py).
    proc = _pytest("--benchmark-only", "--backend", "torch,triton,slowpoke,planted", f"--backend-file={tmp / 'outside.py'}",
                   "--op", "rms_norm", "--dtype", "float32", "--profile", "quick", "-m", "not fused",
                   f"--report-dir={tmp / 'out'}",
                   f"--benchmark-json={tmp / 'raw.json'}", f"--benchmark-storage=file://{tmp / 'storage'}",
                   "--benchmark-save", "first")
    return tmp, proc


def test_benchmark_run_on_the_cpu(cpu_run):
    tmp, proc = cpu_run
    out = tmp / "out"
    log = proc.stdout[-4000:] + proc.stderr[-3000:]
    # The fast wrong kernel fails (3 shapes), nothing else does.
    assert proc.returncode == 1, log
    assert "3 failed" in proc.stdout and "wrong result, not timed" in proc.stdout, log
    doc = json.loads((out / "benchmark.json").read_text())
    raw = json.loads((tmp / "raw.json").read_text())
    names = sorted(b["name"] for b in doc["benchmarks"])
    assert names == sorted(b["name"] for b in raw["benchmarks"])  # the same document as --benchmark-json
    assert {b["extra_info"]["kernel"] for b in doc["benchmarks"]} == {"torch.eager", "slowpoke.sleeps"}
    # 3 forward shapes of each kernel, and torch.eager's backward (the only one with a backward)
    assert len(names) == 7
    backward = [b for b in doc["benchmarks"] if b["extra_info"]["regime"] == "backward"]
    assert [b["extra_info"]["kernel"] for b in backward] == ["torch.eager"]
    for b in doc["benchmarks"]:
        ei, st = b["extra_info"], b["stats"]
        tail = "-backward" if ei["regime"] == "backward" else ""
        assert b["group"] == f"{ei['op']}-{ei['dtype']}-{ei['m']}x{ei['n']}{tail}"
        assert ei["correct"] is True and ei["bytes"] > 0 and ei["ceiling_gbps"] > 0 and ei["timer"] == "wall"
        # pytest-benchmark's stats are the kernel clock's: its median is the timer's median.
        assert st["median"] == pytest.approx(ei["median_us"] / 1e6, rel=1e-12)
        assert ei["gbps"] == pytest.approx(ei["bytes"] / st["median"] / 1e9)
        assert ei["pct_of_copy"] == pytest.approx(100 * ei["gbps"] / ei["ceiling_gbps"])
        assert b["options"]["timer"] == "normdiff_kernel_clock"
        if ei["kernel"] == "slowpoke.sleeps":
            # 3 ms calls; the 0.5 s preparation is not in any timed round.
            assert 0.003 <= st["min"] and st["max"] < 0.1, st
            assert ei["prepare_s"] >= 0.5
        else:
            assert ei["speedup_vs_baseline"] == 1.0
    nd = doc["normdiff"]
    assert nd["final"] is True and nd["done"] == nd["collected"]
    reasons = {s["kernel"]: s["reason"] for s in nd["skipped"] if not s["pdl"]}  # PDL-on: tests/test_bench_pdl.py
    assert "not a timing" in reasons["triton.rowwise"]
    assert {f["kernel"] for f in nd["failed"]} == {"planted.ignores_weight"}
    md = (out / "benchmark.md").read_text()
    assert "### RMSNorm, float32" in md and "## Failed (3)" in md and "slowpoke.sleeps" in md
    assert "## Preparation" in md
    assert (out / "benchmark-rms_norm-float32.png").read_bytes()[:4] == b"\x89PNG"
    # The checks were all skipped by --benchmark-only: no correctness report replaces a real one.
    assert not (out / "correctness.md").exists() and not (out / "correctness.json").exists()


def test_benchmark_compare_still_works(cpu_run):
    tmp, _ = cpu_run
    proc = _pytest("benchmarks", "--benchmark-only", "--backend", "torch", "--op", "rms_norm", "--dtype", "float32",
                   "--profile", "quick", f"--report-dir={tmp / 'again'}",
                   f"--benchmark-storage=file://{tmp / 'storage'}", "--benchmark-compare", "0001", "-k", "512x1024")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "0001_first" in proc.stdout  # the saved run shows beside this one
    assert (tmp / "again" / "benchmark.md").exists()


def _row(kernel, pct, m=16384, n=4096, op="rms_norm", regime="bandwidth", median_s=None, repeat=0):
    """A row as benchmark_results gives it; the median follows % of copy (one shape moves the same
    bytes for every kernel: 100% is 10 µs), or is given (decode)."""
    median_s = median_s if median_s is not None else 1e-3 / pct if pct else 1e-4
    return {"op": op, "dtype": "bfloat16", "m": m, "n": n, "regime": regime, "repeat": repeat, "kernel": kernel,
            "group": f"{op}-bfloat16-{m}x{n}", "pct": pct, "median_s": median_s,
            "project": kernel.split(".")[0] in ("triton", "tilelang")}


def test_speed_targets_name_each_gap():
    from harness.report import targets

    rows = [
        # 16384 x 4096 RMSNorm: every target met.
        _row("triton.rowwise", 97.5), _row("tilelang.fragment", 96.0), _row("liger.fused", 95.0),
        # 16384 x 8192: the best project kernel is short, and a peer is ahead of TileLang.
        _row("triton.rowwise", 96.0, n=8192), _row("tilelang.splitk", 91.0, n=8192), _row("torch.eager", 93.0, n=8192),
        # Too few elements for a target, and a second pass: neither is judged.
        _row("triton.rowwise", 10.0, m=8, n=4096), _row("triton.rowwise", 10.0, repeat=1),
        # Decode: TileLang slower than the best peer.
        _row("tilelang.fragment", None, m=1, regime="decode", median_s=2e-6),
        _row("liger.fused", None, m=1, regime="decode", median_s=1.5e-6),
    ]
    bw = {t["n"]: t for t in targets.bandwidth(rows)}
    assert set(bw) == {4096, 8192}
    assert bw[4096]["gaps"] == []
    assert bw[8192]["gaps"] == ["best 96.0% < 97%", "tilelang 91.0% < 92%",
                                "tilelang 91.0% < torch.eager 93.0% (t 0.00%)"]
    dc = targets.decode(rows)
    assert len(dc) == 1 and dc[0]["gaps"] == ["tilelang 2.00 µs > liger.fused 1.50 µs (t 0.00%)"]
    md = "\n".join(targets.render(rows))
    assert "**1 of 2 shapes meet every target**" in md and "**0 of 1**" in md
    assert "project backends: tilelang, triton" in md  # from the rows' project flag
    # t printed beside each comparison: triton's second pass moved far (t capped at 2%), no other
    # kernel had one (t 0).
    assert "| rms_norm | bfloat16 | 16384 x 8192 | 96.0% | 91.0% tilelang.splitk | 96.0% triton.rowwise | " \
           "93.0% torch.eager | tilelang 0.00%, triton 2.00% |" in md
    assert "| rms_norm | bfloat16 | 1 x 4096 | 2.00 tilelang.fragment | - | 1.50 liger.fused | 0.00% |" in md


def test_long_row_targets_need_90_percent_best_and_85_each_backend():
    """N = 65536, 131072 and 262144: the best project kernel >= 90% of copy, each project
    backend >= 85% (both thresholds judged apart)."""
    from harness.report import targets

    rows = [
        _row("triton.split", 92.0, n=65536), _row("tilelang.cluster", 86.0, n=65536),  # met
        _row("triton.split", 89.5, n=131072), _row("tilelang.cluster", 87.0, n=131072),  # best short
        _row("triton.split", 91.0, n=262144), _row("tilelang.cluster", 84.0, n=262144),  # TileLang short
    ]
    bw = {t["n"]: t for t in targets.bandwidth(rows)}
    assert set(bw) == {65536, 131072, 262144}
    assert bw[65536]["gaps"] == []
    assert bw[131072]["gaps"] == ["best 89.5% < 90%"]
    assert bw[262144]["gaps"] == ["tilelang 84.0% < 85%"]


def test_the_project_is_what_kernels_declare_not_a_backend_name():
    from harness.report import targets

    # A plug-in that declares itself the project's is judged as the project; triton, not declared, is a peer.
    rows = [dict(_row("mine.fast", 98.0), project=True), dict(_row("triton.rowwise", 99.0), project=False)]
    bw, = targets.bandwidth(rows)
    assert list(bw["project"]) == ["mine"] and bw["peer"][0] == "triton.rowwise"
    assert "mine 98.0% < triton.rowwise 99.0% (t 0.00%)" in bw["gaps"]


def test_arena_places_a_shape_at_the_same_addresses_every_time():
    """Every shape's tensors come from one allocation at offsets fixed by the shape: no part
    overlaps another, and asking again (the second pass) gives the same addresses."""
    shapes = [bench_sweep.BenchShape(op, dt, m, n, "bandwidth") for op in ("rms_norm", "layer_norm")
              for dt in ("float32", "bfloat16") for m, n in ((512, 1024), (128, 4000), (3, 7))]
    arena = Arena(max(Arena.layout(s)[1] for s in shapes), "cpu")
    base = arena.buf.data_ptr()
    for s in shapes:
        views = arena.views(s)
        spans = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in views.values())
        assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:]))  # no overlap
        assert spans[-1][1] <= base + arena.buf.numel()
        assert views["x"].shape == (s.m, s.n) and views["x"].dtype == DTYPES[s.dtype]
        assert views["rstd"].dtype == torch.float32 and views["rstd"].shape == (s.m,)
        again = arena.views(s)
        assert {k: t.data_ptr() for k, t in again.items()} == {k: t.data_ptr() for k, t in views.items()}
    assert arena.buf.data_ptr() == base  # sized for the largest shape: never reallocated
    big = bench_sweep.BenchShape("rms_norm", "float32", 4096, 4096, "bandwidth")
    assert arena.views(big)["x"].shape == (4096, 4096)  # a shape it was not sized for: it grows
    assert arena.buf.numel() >= Arena.layout(big)[1]


def test_a_cpu_run_is_a_smoke_run_with_no_ranking():
    import copy
    import json
    from pathlib import Path

    from harness.report.benchmark import render_markdown

    doc = json.loads((Path(__file__).parent / "data" / "benchmark_sample.json").read_text())
    cpu = copy.deepcopy(doc)
    for b in cpu["benchmarks"]:
        b["extra_info"]["device"] = "CPU (x86_64, 2 threads)"
    md = render_markdown(cpu)
    assert "CPU smoke run" in md and md.count("★") == 1 and "Speed targets" not in md  # the one in the banner
    assert "★" in render_markdown(doc)  # a GPU run is ranked


def _host_row(kernel, regime, op, m, n, median_us, host=None, wall=None, project=False, entry=False, pct=None):
    return {"kernel": kernel, "regime": regime, "op": op, "dtype": "bfloat16", "m": m, "n": n, "repeat": 0,
            "median_s": median_us / 1e6, "host_us": host, "wall_us": wall, "project": project,
            "entry_point": entry, "call": f"{kernel}(x)", "pct": pct}


def test_host_targets_judge_the_entry_points_against_every_peer():
    """harness.report.host: host µs of each project entry point against every peer that ran, at the
    decode shapes and N 1024/2048; wall <= 1.15 x device at the bandwidth shapes; decode wall
    within 10% of the cheapest peer's. A variant that is not an entry point is never judged."""
    from harness.report import host

    rows = [
        # decode: the entry point beats Liger's host time but not eager's; its wall is 12% over Liger's
        _host_row("triton.auto", "decode", "rms_norm", 1, 4096, 1.5, host=19.0, wall=22.4, project=True, entry=True),
        _host_row("triton.looped", "decode", "rms_norm", 1, 4096, 1.4, host=99.0, wall=99.0, project=True),
        _host_row("liger.fused", "decode", "rms_norm", 1, 4096, 1.6, host=44.0, wall=20.0),
        _host_row("torch.eager", "decode", "rms_norm", 1, 4096, 3.0, host=10.5, wall=12.0),
        # bandwidth N = 1024: host met; wall 1.10 x device: met
        _host_row("triton.auto", "bandwidth", "rms_norm", 65536, 1024, 64.0, host=9.0, wall=70.4, project=True, entry=True),
        _host_row("liger.fused", "bandwidth", "rms_norm", 65536, 1024, 80.0, host=70.0, wall=90.0),
        _host_row("torch.eager", "bandwidth", "rms_norm", 65536, 1024, 100.0, host=13.0, wall=101.0),
        # bandwidth N = 4096: no host target; wall 1.30 x device: missed
        _host_row("triton.auto", "bandwidth", "rms_norm", 16384, 4096, 64.0, host=40.0, wall=83.2, project=True, entry=True),
    ]
    by = {(c["target"], c["where"]): c for c in host.check(rows)}
    decode_host = by[("host", "rms_norm bfloat16 1 x 4096")]["gaps"]
    assert decode_host == ["triton.auto 19.0 µs > torch.eager 10.5 µs (rows)"]  # Liger's 44 µs is beaten
    assert by[("decode wall", "rms_norm bfloat16 1 x 4096")]["gaps"]  # 22.4 > 1.1 x 20.0
    assert by[("host", "rms_norm bfloat16 65536 x 1024")]["gaps"] == []
    assert by[("wall", "rms_norm bfloat16 65536 x 1024")]["gaps"] == []
    assert by[("wall", "rms_norm bfloat16 16384 x 4096")]["gaps"] == ["triton.auto wall 83.2 µs = 1.30 x device"]
    assert ("host", "rms_norm bfloat16 16384 x 4096") not in by  # N 4096: no host target there
    assert not any("triton.looped" in g for c in by.values() for g in c["gaps"])
    md = "\n".join(host.render(rows))
    assert "Per-call cost, host included" in md and "`triton.auto`: `triton.auto(x)`" in md
    # A peer of any name counts: a plug-in's cheaper call is a gap, and its wall sets the decode wall's bar.
    rows.append(_host_row("mypeer.fast", "decode", "rms_norm", 1, 4096, 1.0, host=9.0, wall=21.0))
    by = {(c["target"], c["where"]): c for c in host.check(rows)}
    assert by[("host", "rms_norm bfloat16 1 x 4096")]["gaps"] == [
        "triton.auto 19.0 µs > mypeer.fast 9.0 µs (rows)", "triton.auto 19.0 µs > torch.eager 10.5 µs (rows)"]
    assert by[("decode wall", "rms_norm bfloat16 1 x 4096")]["gaps"] == [
        "triton.auto wall 22.4 µs > torch.eager 12.0 µs + 10%"]  # the cheapest peer's wall
    assert by[("host", "rms_norm bfloat16 1 x 4096")]["peers"] == ["liger.fused", "mypeer.fast", "torch.eager"]


def test_host_target_uses_the_paired_figures_where_a_row_has_them():
    """A paired measurement (entry point and peers timed in interleaved rounds) decides over the
    rows' own host µs, both ways: a row above eager's row passes when paired below it, and a row
    below fails when paired above. A peer missing from the pairs falls back to the rows."""
    from harness.report import host

    def rows(paired):
        entry = _host_row("triton.auto", "decode", "rms_norm", 8, 4096, 1.5, host=14.0, wall=14.0, project=True,
                          entry=True)
        return [dict(entry, paired=paired),
                _host_row("liger.fused", "decode", "rms_norm", 8, 4096, 1.6, host=80.0, wall=80.0),
                _host_row("torch.eager", "decode", "rms_norm", 8, 4096, 3.0, host=13.0, wall=14.0)]

    where = ("host", "rms_norm bfloat16 8 x 4096")
    by = {(c["target"], c["where"]): c for c in host.check(rows({"triton.auto": 10.0, "torch.eager": 11.0}))}
    assert by[where]["gaps"] == []  # paired below eager, though its row (14.0) is above eager's (13.0)
    by = {(c["target"], c["where"]): c for c in host.check(rows({"triton.auto": 12.0, "torch.eager": 11.5,
                                                                  "liger.fused": 70.0}))}
    assert by[where]["gaps"] == ["triton.auto 12.0 µs > torch.eager 11.5 µs (paired)"]
    by = {(c["target"], c["where"]): c for c in host.check(rows(None))}
    assert by[where]["gaps"] == ["triton.auto 14.0 µs > torch.eager 13.0 µs (rows)"]
    md = "\n".join(host.render(rows({"triton.auto": 10.0, "torch.eager": 11.0})))
    assert "10.0 vs torch.eager 11.0" in md and "paired host µs" in md


def test_host_target_compares_the_paired_calls_round_by_round():
    """With the rounds kept, the target is the median of (entry point - peer) in the same round,
    not the two calls' medians (given here as 99 against 1, to show they do not decide): an entry
    point 1 µs cheaper than eager in every round passes in a host whose state moves both by 5 µs
    from round to round, and one 0.5 µs dearer in every round fails."""
    from harness.report import host

    noisy = [False] * 4 + [True] * 11  # the host's state, round by round
    me = [10.0 + 5 * q for q in noisy]
    eager = [11.0 + 5 * q for q in noisy]
    entry = _host_row("triton.auto", "decode", "rms_norm", 8, 4096, 1.5, host=14.0, wall=14.0, project=True,
                      entry=True)
    peers = [_host_row("liger.fused", "decode", "rms_norm", 8, 4096, 1.6, host=80.0, wall=80.0),
             _host_row("torch.eager", "decode", "rms_norm", 8, 4096, 3.0, host=13.0, wall=14.0)]
    where = ("host", "rms_norm bfloat16 8 x 4096")

    def gaps(mine, theirs):
        r = dict(entry, paired={"triton.auto": 99.0, "torch.eager": 1.0},  # the medians are not what decides
                 paired_rounds={"triton.auto": mine, "torch.eager": theirs, "liger.fused": [80.0] * 15})
        return {(c["target"], c["where"]): c for c in host.check([r, *peers])}[where]["gaps"]

    assert gaps(me, eager) == []
    assert gaps([e + 0.5 for e in eager], eager) == [
        "triton.auto +0.5 µs a call against torch.eager (median of 15 paired rounds)"]


def test_backward_targets_need_85_percent_and_every_peer_that_ran():
    """The best project backward >= 85% of copy and at least as fast as the backward of every peer
    that ran, whatever its name: a plug-in's peer counts as Liger's does."""
    from harness.report import targets

    def rows(peers):
        return [_host_row(k, "backward", "rms_norm", 65536, 1024, 1e3 / pct, project=p, pct=pct) for k, p, pct in
                (("tilelang.fragment", True, 88.0), ("triton.auto", True, 40.0), *peers)]

    (entry,) = targets.backward(rows([("liger.fused", False, 30.0), ("torch_compile.inductor", False, 89.0)]))
    assert entry["best"] == ("tilelang.fragment", 88.0)
    assert entry["gaps"] == ["tilelang.fragment 88.0% < torch_compile.inductor 89.0% (t 0.00%)"]
    assert entry["peers"] == [("liger.fused", 30.0), ("torch_compile.inductor", 89.0)]
    assert targets.backward(rows([("liger.fused", False, 30.0)]))[0]["gaps"] == []
    assert targets.backward(rows([("mypeer.fast", False, 90.0)]))[0]["gaps"] == [
        "tilelang.fragment 88.0% < mypeer.fast 90.0% (t 0.00%)"]
    level = rows([("mypeer.fast", False, 88.0)])  # the same median: at least as fast
    assert targets.backward(level)[0]["gaps"] == []
    level[0]["pct"], level[0]["median_s"] = 80.0, 1e-3 / 80.0
    assert targets.backward(level)[0]["gaps"][0] == "best 80.0% < 85%"
    md = "\n".join(targets.render(rows([("mypeer.fast", False, 50.0)])))
    assert "88.0% tilelang.fragment against mypeer.fast 50.0% (t 0.00%); met" in md


def test_at_least_as_fast_allows_the_spread_between_passes_capped_at_2_percent():
    """median <= the peer's median x (1 + t): t the larger of the two kernels' spreads between the
    passes (the report's repeatability), capped at 2%; 0 where one pass ran. Bandwidth, decode
    and backward comparisons alike, each printing its t."""
    from harness.report import targets

    def run(project_pct, peer_pct, project_move, peer_move):
        rows = [_row("triton.rowwise", project_pct, n=8192), _row("liger.fused", peer_pct, n=8192),
                _row("triton.rowwise", 99.0, m=16384, n=4096), _row("liger.fused", 90.0, m=16384, n=4096)]
        if project_move is not None:  # a second pass at 4096: medians moved by the given fractions
            first = {r["kernel"]: r["median_s"] for r in rows if r["n"] == 4096}
            rows += [dict(_row(k, None, n=4096, repeat=1), median_s=first[k] * (1 + mv))
                     for k, mv in (("triton.rowwise", project_move), ("liger.fused", peer_move))]
        return {t["n"]: t for t in targets.bandwidth(rows)}[8192]

    slower = run(98.0, 99.0, None, None)  # one pass: t = 0, 1% slower is a gap
    assert slower["t"] == {"triton": 0.0} and slower["gaps"] == ["triton 98.0% < liger.fused 99.0% (t 0.00%)"]
    within = run(98.0, 99.0, 0.015, -0.004)  # t = 1.5%: 1.02% slower is within it
    assert within["t"] == {"triton": pytest.approx(0.015)} and within["gaps"] == []
    capped = run(97.0, 99.0, 0.0, 0.08)  # the peer moved 8%: t capped at 2%; 2.06% slower is a gap
    assert capped["t"] == {"triton": 0.02}
    assert capped["gaps"] == ["triton 97.0% < liger.fused 99.0% (t 2.00%)"]
    rows = [_row("triton.rowwise", 99.0), _row("liger.fused", 90.0), dict(_row("triton.rowwise", None, repeat=1),
                                                                          median_s=1e-3 / 99.0 * 1.01)]
    rows += [_row("triton.rowwise", None, m=1, regime="decode", median_s=2.015e-6),
             _row("liger.fused", None, m=1, regime="decode", median_s=2e-6)]
    (dc,) = targets.decode(rows)  # a decode shape takes the kernels' spreads from the bandwidth passes
    assert dc["t"] == {"triton": pytest.approx(0.01)} and dc["gaps"] == []
    md = "\n".join(targets.render(rows))
    assert "t per comparison: the larger of the two kernels' spreads" in md and "largest spread: 1.00%" in md
    assert "t = 0 throughout: one pass ran" in "\n".join(targets.render(rows[:2]))


def test_report_names_no_backend():
    """harness/report/ judges kernels by what they declare (``NormKernel.project``), never by a
    backend's name: no backend of the project, of torch or of the example plug-ins is named in its
    code, comments or docstrings, but for the recorded exceptions below."""
    import re

    names = {"torch.eager", "torch_compile", "inductor", "apex", "triton", "tilelang"}
    for f in (ROOT / "examples").glob("*.py"):
        names |= set(re.findall(r'^\s+backend = "(\w+)"', f.read_text(), re.M))
    assert {"liger", "quack", "flashinfer"} <= names
    pattern = re.compile(r"\b(" + "|".join(re.escape(n) for n in sorted(names)) + r")\b|[\"']torch[\"']")
    allowed = {  # (file, what the line holds): why it may name one
        ("benchmark_results.py", '"baseline", "torch.eager")'):
            "the default of --bench-baseline (harness/bench.py) for a document that did not record its baseline",
        ("benchmark_markdown.py", "env.get('torch')"): "the environment's torch version, not a backend",
    }
    found = []
    for path in sorted((ROOT / "harness" / "report").glob("*.py")):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line) and not any(path.name == f and what in line for f, what in allowed):
                found.append(f"{path.name}:{i}: {line.strip()}")
    assert found == []
    assert pattern.search('PEERS = ("liger", "torch")') and pattern.search("impls.triton.rms_norm")


def test_paired_host_rounds_rotate_the_order_and_take_each_calls_median(monkeypatch):
    """harness.benchmarks.timing.paired_host_us: every round times every call once, each round starting
    with the next call (so none is always first after another's), and each figure is that call's
    median over the rounds, with the round-by-round figures handed back."""
    from harness.benchmarks import timing

    order, values = [], {"a": iter([9.0, 1.0, 2.0, 3.0, 4.0]), "b": iter([5.0, 5.0, 50.0, 5.0, 6.0])}

    def fake_host_call_us(fn, tools, calls=timing.HOST_CALLS):
        name = fn()
        order.append(name)
        return next(values[name])

    monkeypatch.setattr(timing, "host_call_us", fake_host_call_us)
    samples = {}
    got = timing.paired_host_us({"a": lambda: "a", "b": lambda: "b"}, tools=None, rounds=5, samples=samples)
    assert order == ["a", "b", "b", "a", "a", "b", "b", "a", "a", "b"]
    assert got == {"a": 3.0, "b": 5.0}  # medians: an outlier round (9.0, 50.0) does not move them
    assert samples == {"a": [9.0, 1.0, 2.0, 3.0, 4.0], "b": [5.0, 5.0, 50.0, 5.0, 6.0]}


def test_host_calls_shrink_with_device_time_and_pairs_only_where_judged():
    """A host measurement queues calls whose GPU work still runs after it: at long rows (ms a
    call) the calls are fewer, never under HOST_MIN_CALLS; short calls keep HOST_CALLS. Entry
    points are timed paired with their peers only at the shapes the host target judges."""
    from harness.benchmarks import timing
    from harness.benchmarks.bench_forward import host_target_shape
    from harness.benchmarks.bench_sweep import BenchShape

    assert timing.host_calls_for(2.0) == timing.HOST_CALLS
    assert timing.host_calls_for(60.0) == timing.HOST_CALLS
    assert timing.host_calls_for(500.0) == int(timing.HOST_GPU_SECONDS * 1e6 / 500.0) < timing.HOST_CALLS
    assert timing.host_calls_for(8000.0) == timing.HOST_MIN_CALLS
    judged = [BenchShape("rms_norm", "bfloat16", 65536, 1024, "bandwidth"),
              BenchShape("layer_norm", "float32", 32768, 2048, "bandwidth"),
              BenchShape("rms_norm", "bfloat16", 8, 4096, "decode")]
    unjudged = [BenchShape("rms_norm", "bfloat16", 16384, 4096, "bandwidth"),
                BenchShape("layer_norm", "bfloat16", 16384, 262144, "bandwidth"),
                BenchShape("rms_norm", "bfloat16", 65536, 1024, "backward")]
    assert all(host_target_shape(s) for s in judged)
    assert not any(host_target_shape(s) for s in unjudged)


def test_headline_set_covers_every_regime_and_the_budget_skips_what_cannot_fit():
    from harness.benchmarks.arena import shape_need
    from harness.benchmarks.bench_context import BenchContext
    from harness.benchmarks.bench_forward import CHECK_ELEMENTS
    from harness.report.host import judges_host
    from harness.judging.shapes import HEADLINE_LONG_N

    shapes = bench_sweep.sweep("full", ["rms_norm", "layer_norm"], ["bfloat16"], 1, "headline")
    regimes = {s.regime for s in shapes}
    assert regimes == {"bandwidth", "decode", "backward"}
    assert any(s.n in HEADLINE_LONG_N for s in shapes), "no long rows"
    assert any(judges_host(s.regime, s.n) and s.regime == "bandwidth" for s in shapes), "no host column at bandwidth"
    assert len(shapes) < len(bench_sweep.sweep("full", ["rms_norm", "layer_norm"], ["bfloat16"], 1, "full")) / 2

    class Config:
        def getoption(self, name):
            return None

    ctx = BenchContext(Config())
    long = next(s for s in shapes if s.n in HEADLINE_LONG_N)
    ctx._budget = shape_need(long, CHECK_ELEMENTS) - 1  # noqa: SLF001 (a card one byte too small for the long rows)
    assert ctx.fits(long).startswith("out of memory, not run: ") and "more than the budget" in ctx.fits(long)
    assert all(ctx.fits(s) is None for s in shapes if s.n not in HEADLINE_LONG_N)


def test_preparation_table_prints_a_declared_autotuning_cap():
    """A kernel that declares what bounds its autotuning (a plug-in's ``autotune_cap``, recorded by
    the benchmark as ``prepare_cap``) has it printed beside its preparation seconds; others show -."""
    from harness.report.benchmark_markdown import render_preparation

    cap = "autotuning: at most 16 of QuACK's launch configs per shape, those nearest its analytical heuristic"
    doc = {"benchmarks": [{"extra_info": {"kernel": "quack.tuned", "prepare_s": 30.0, "prepare_cap": cap}},
                          {"extra_info": {"kernel": "quack.tuned", "prepare_s": 10.5, "prepare_cap": cap}},
                          {"extra_info": {"kernel": "triton.auto", "prepare_s": 0.25, "prepare_cap": None}}]}
    md = "\n".join(render_preparation(doc))
    assert f"| quack.tuned | 2 | 40.5 | {cap} |" in md
    assert "| triton.auto | 1 | 0.2 | - |" in md
    assert "| kernel | benchmarks | seconds | cap |" in md
