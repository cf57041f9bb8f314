"""The long-row kernels that cannot be checked without a GPU, checked as far as a CPU goes: the
TileLang candidates that tools/long_row_probe.py times (impls/tilelang/candidates) compile for
sm_90, and the lagged split kernels (which need every program of a row resident at once) compile
for sm_90 with the row they store carried in registers from one step to the next, and run under
the interpreter with one program a row (the registered ones and the Triton candidates,
impls/triton/candidates). The backends never import their candidates."""
import pytest

import impls.triton as tri
from impls.tilelang._long_plan import ONE_BARRIER_SUM

pytestmark = pytest.mark.skipif(tri.availability() is not None, reason=f"triton cannot run: {tri.availability()}")


def _compiled_offline(script: str) -> str:
    """What ``script`` prints, run in a process of its own without the interpreter (a pytest process
    may hold the interpreter's kernels, which cannot be compiled)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", script], cwd=root, env={**env, "PYTHONPATH": str(root)},
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


# test_lagged_split_carries_the_previous_row's compilations: the loop's carried values, the load
# forms, the order of the next row's load, the store-halves candidate's registers.
_LAGGED_SCRIPT = r'''
import itertools, triton, torch
from impls.triton import _kernels as k
from tools.triton_resources import compile_sm90
n = 65536
for (op, fn), hold in itertools.product((("rms_norm", k.rms_norm_split_lag), ("layer_norm", k.layer_norm_split_lag)),
                                       (False, True)):
    x = torch.empty(2, n, dtype=torch.bfloat16); w = torch.empty(n, dtype=torch.bfloat16)
    s = torch.empty(2, dtype=torch.float32)
    words = torch.empty(64, dtype=torch.int64); done = torch.empty(8, dtype=torch.int32)
    tensors = (x, w, x, s) if op == "rms_norm" else (x, w, w, x, s, s)
    meta = dict(HAS_WEIGHT=True, BLOCK_N=4096, ROUND_BF16=False, num_warps=4, SPLITS=16, SPLITS_P2=16, HOLD_W=hold)
    if op == "layer_norm":
        meta["HAS_BIAS"] = True
    ir = compile_sm90(fn, (*tensors, words, done, 2048, n, n, n, 1e-5, 132), meta).asm["ttir"]
    print(op, next(line for line in ir.splitlines() if "scf.while" in line and "bf16" in line))
# The settings' load choices at 2048 columns x 4 warps, 128 programs a row (Triton 3.6 once
# failed to compile RMSNorm there): the PTX's global load forms.
import re
from impls.triton.settings import SPLIT_W_EVICT, SPLIT_X_CACHE
n = 262144
x = torch.empty(2, n, dtype=torch.bfloat16); w = torch.empty(n, dtype=torch.bfloat16)
s = torch.empty(2, dtype=torch.float32); words = torch.empty(64, dtype=torch.int64); done = torch.empty(8, dtype=torch.int32)
meta = dict(HAS_WEIGHT=True, BLOCK_N=2048, ROUND_BF16=False, num_warps=4, SPLITS=128, SPLITS_P2=128,
            X_CACHE=SPLIT_X_CACHE, W_EVICT=SPLIT_W_EVICT)
ptx = compile_sm90(k.rms_norm_split_lag, (x, w, x, s, words, done, 2048, n, n, n, 1e-5, 132), meta).asm["ptx"]
print("loads", " ".join(sorted(set(re.findall(r"ld\.global[\w.:]*", ptx)))))
# NEXT_FIRST (settings.SPLIT_NEXT_FIRST): the loop's load of the next row before the first
# barrier of this row's reductions, else after them. Printed: x loads before the first barrier, of all.
n = 65536
x = torch.empty(2, n, dtype=torch.bfloat16); w = torch.empty(n, dtype=torch.bfloat16)
for nf in (False, True):
    meta = dict(HAS_WEIGHT=True, HAS_BIAS=True, BLOCK_N=2048, ROUND_BF16=False, num_warps=2, SPLITS=32, SPLITS_P2=32,
                X_CACHE=".cg", NEXT_FIRST=nf)
    compiled = compile_sm90(k.layer_norm_split_lag, (x, w, w, x, s, s, words, done, 2048, n, n, n, 1e-5, 132), meta)
    order = re.findall(r"ld\.global\.cg|bar\.sync", compiled.asm["ptx"])
    print("order", nf, order.index("bar.sync"), order.count("ld.global.cg"))
# The store-halves candidate (impls.triton.candidates.halves) at the same setting: registers and
# spills, against the registered kernel's (the last compiled above).
from impls.triton.candidates import halves as candidate
from tools.triton_resources import _usage
halves = compile_sm90(candidate.layer_norm_split_lag_halves, (x, w, w, x, s, s, words, done, 2048, n, n, n, 1e-5, 132),
                      meta)
print("registers", *_usage(compiled), *_usage(halves))
'''
# test_l2_prefetch_candidates_compile_for_sm90's: the prefetch sites and registers of l2_kernels'
# lagged kernels, and of the registered ones.
_L2_SCRIPT = r'''
import triton, torch
from impls.triton import _kernels as registered
from impls.triton.candidates import l2_kernels as k
from tools.triton_resources import compile_sm90, _usage
n, bn = 131072, 4096
x = torch.empty(2, n, dtype=torch.bfloat16); w = torch.empty(n, dtype=torch.bfloat16)
s = torch.empty(2, dtype=torch.float32); words = torch.empty(64, dtype=torch.int64); done = torch.empty(8, dtype=torch.int32)
base = dict(HAS_WEIGHT=True, BLOCK_N=bn, ROUND_BF16=False, num_warps=4, SPLITS=n // bn, SPLITS_P2=n // bn,
            X_CACHE=".cg", W_EVICT="evict_last", NEXT_FIRST=True)
for name, fn, hold in (("rms", k.rms_norm_split_lag, True), ("ln", k.layer_norm_split_lag, True),
                       ("rms_l2", k.rms_norm_split_lag, False), ("ln_l2", k.layer_norm_split_lag, False)):
    tensors = (x, w, x, s) if name.startswith("rms") else (x, w, w, x, s, s)
    meta = dict(base) if name.startswith("rms") else dict(base, HAS_BIAS=True)
    for ahead in (0, 1, 2):
        c = compile_sm90(fn, (*tensors, words, done, 2048, n, n, n, 1e-5, 132), dict(meta, L2_AHEAD=ahead, HOLD_NEXT=hold))
        print(name, ahead, c.asm["ptx"].count("cp.async.bulk.prefetch.L2.global"), *_usage(c))
    fn = getattr(registered, fn.__name__)  # the registered kernel: no prefetch, no HOLD_NEXT or L2_AHEAD
    if hold:
        c = compile_sm90(fn, (*tensors, words, done, 2048, n, n, n, 1e-5, 132), meta)
        print(name + "_registered", 0, c.asm["ptx"].count("cp.async.bulk.prefetch.L2.global"), *_usage(c))
'''


def test_tilelang_candidates_compile_for_sm90_without_spills():
    """The TileLang splitk_pipelined candidate built for sm_90 with nvcc at the probe's N, a padded
    N and float32: an sm_90 binary, registers within 255, no spills. It cannot run here; the
    probe's checks on the GPU are its first run."""
    from impls.tilelang import compiler

    tl, why = compiler.tilelang_module()
    if tl is None:
        pytest.skip(why)
    if compiler.nvcc_path() is None:
        pytest.skip("nvcc not found (CUDA_HOME or PATH): TileLang cannot compile CUDA kernels here")
    from impls.tilelang.candidates import compile_offline

    for dtype, n in (("bfloat16", 65536), ("bfloat16", 100000), ("float32", 262144)):
        r = compile_offline(dtype, n)
        assert "splitk_pipelined" in r["plan"], r
        assert r["sass_arch"] == "sm_90" and r["registers"] is not None and r["registers"] <= 255, r
        assert r["spill_stores"] == 0 and r["spill_loads"] == 0, r


@pytest.mark.parametrize("op,name", [("rms_norm", "tilelang.cluster"), ("layer_norm", "tilelang.layer_norm_cluster")])
def test_cluster_exchange_forms_compile_for_sm90(op, name):
    """The registered plan's exchange (Plan.mbar_exchange with Plan.relaxed_arrive) and the probe's
    other forms build for sm_90 without spills, a padded N and float32 at 262144 among them: the
    mbarrier forms send by st.async with no cluster barrier after it, the barrier forms sync the
    cluster after their remote stores, the relaxed forms arrive without the fence (and the
    mbarrier's initialisation is fenced before any arrive). They cannot run here; the GPU's
    harness checks and the probe are their first run."""
    import torch

    from impls import registry
    from impls.tilelang import compiler
    from impls.tilelang.plan import choose_vec
    from tools.long_row_candidates import candidates

    tl, why = compiler.tilelang_module()
    if tl is None:
        pytest.skip(why)
    if compiler.nvcc_path() is None:
        pytest.skip("nvcc not found (CUDA_HOME or PATH): TileLang cannot compile CUDA kernels here")
    registry.load_all()
    made = {lab: m for _, lab, m in candidates(op)}
    made[name + " registered"] = lambda: registry.get(op, "tilelang", name.split(".")[1])
    ln = op == "layer_norm"  # LayerNorm's plans sum the statistics on the way into shared memory
    other_stats = "stats from shared memory" if ln else "stats in load"
    one = ONE_BARRIER_SUM  # the registered plans' block sums
    #        label                       mbarrier relaxed stats   one-barrier dtype      N
    forms = (("registered",                True,   True,  ln,     one,    torch.bfloat16, 100000),
             ("registered",                True,   True,  ln,     one,    torch.float32, 262144),
             ("barrier exchange",          False,  False, ln,     one,    torch.bfloat16, 65536),
             ("barrier exchange relaxed",  False,  True,  ln,     one,    torch.float32, 262144),
             ("mbarrier exchange fenced",  True,   False, ln,     one,    torch.bfloat16, 100000),
             (other_stats,                 True,   True,  not ln, one,    torch.float32, 262144),
             ("AllReduce sums",            True,   True,  ln,     False,  torch.float32, 262144),
             ("2 rows" if ln else "1 row", True,   True,  ln,     one,    torch.float16, 65536))
    for label, mbar, relaxed, stats, one_sum, dtype, n in forms:
        plan = made[f"{name} {label}"]().plan_for(dtype, n, True, op == "layer_norm", choose_vec(dtype, n))
        assert (plan.mbar_exchange, plan.relaxed_arrive, plan.stats_in_load) == (mbar, relaxed, stats), label
        assert plan.one_barrier_sum == one_sum, label
        compiled = compiler.compile_plan(plan, compiler.SM90)
        src, r = compiled.source(), compiler.ptxas_report(compiled)
        assert r.sass_arch == "sm_90" and r.spill_stores == 0 and r.spill_loads == 0, (plan.describe(), r)
        # One-barrier sums: no AllReduce, one normdiff_block_sum a row and statistic, each called by
        # every thread (it holds a __syncthreads: under a thread guard it would hang the block), and
        # the partials put from registers, not staged in shared memory
        calls = [i for i, line in enumerate(src.splitlines()) if "= normdiff_block_sum(" in line]
        assert ("AllReduce" in src) != one_sum and bool(calls) == one_sum, plan.describe()
        assert not [i for i in calls if "threadIdx" in src.splitlines()[i - 1]], plan.describe()
        assert ("((float*)mine)[" in src) != (one_sum and mbar), plan.describe()
        assert ("st.async.shared::cluster" in src) == mbar, plan.describe()
        assert ("cluster_sync()" in src) != mbar, plan.describe()
        assert ("cluster_arrive_relaxed()" in src) == relaxed, plan.describe()
        if mbar:  # the peers complete on the mbarrier only after its initialisation is fenced
            assert src.index("fence_barrier_init()") < src.index("cluster_arrive"), plan.describe()


def test_lagged_split_carries_the_previous_row():
    """The lagged split kernels store row i - 1 from x they loaded one step earlier. Triton 3.6
    dropped such a value from the loop's carried values when it started as the same tensor as
    the current row's, and read the current row in its place: on the H200 every row but each
    group's first came out scaled from the next row's x. Here, compiled for sm_90 (no GPU
    needed): the row loop carries two row tensors of x's dtype, the current and the previous,
    with the weight (and bias) loaded each row and held from the start (HOLD_W). And the load
    choices of the settings reach the PTX, at a shape Triton 3.6 once failed to compile,
    NEXT_FIRST puts the next row's load before this row's reductions, and the store-halves
    candidate (impls/triton/candidates/halves.py) compiles to fewer registers than the kernel it
    varies."""
    import re

    import torch

    from impls.triton import settings

    stdout = _compiled_offline(_LAGGED_SCRIPT)
    *lines, loads, after, first, registers = stdout.strip().splitlines()
    lag_regs, lag_spills, halves_regs, halves_spills = map(int, registers.split()[1:])
    assert halves_regs < lag_regs and lag_spills == halves_spills == 0, registers  # what the candidate is for
    # the next row's load: after this row's reductions, or (NEXT_FIRST) with the pre-loop load before them
    assert after.split()[1:] == ["False", "4", "8"] and first.split()[1:] == ["True", "8", "8"], (after, first)
    assert settings.SPLIT_NEXT_FIRST["layer_norm"] and settings.split_config(65536, torch.bfloat16, "layer_norm").next_first
    # x past L1, the weight kept in it (settings.SPLIT_X_CACHE, SPLIT_W_EVICT)
    assert loads.split()[1:] == ["ld.global.L1::evict_last.L2::cache_hint.v4.b32", "ld.global.cg.v4.b32"], loads
    assert len(lines) == 4  # both ops, the weight (and bias) loaded each row or held
    for line in lines:
        carried = re.search(r"\) : \((.*?)\) ->", line).group(1)
        assert carried.count("tensor<4096xbf16>") == 2, line


@pytest.mark.parametrize("name, next_first, hold_next",
                         [(k, nf, True) for k in ("rms_norm_split_lag", "layer_norm_split_lag") for nf in (False, True)]
                         + [(k, True, False) for k in ("rms_norm_split_lag", "layer_norm_split_lag")]
                         + [("layer_norm_split_lag_halves", True, True)])
def test_lagged_split_rows_with_one_program_a_row(name, next_first, hold_next):
    """The lagged kernels' row logic where it can run without co-resident programs, on the
    interpreter too: one program a row (SPLITS = 1), so every wait is for the program's own
    partial, and two groups, so each program walks every other row with the store one row behind.
    Every row against float64 (rows of mean 100: the part's statistics are exact two-pass ones),
    and the exchange words left zero for the next launch."""
    import torch

    from impls.triton import _kernels
    from impls.triton._launch import state
    from impls.triton.candidates import halves, l2_kernels

    device = "cpu" if state().interpreted else "cuda"
    # the registered kernels, the store-halves candidate, and l2_kernels' without the next row held
    fn = getattr(halves if name.endswith("halves") else _kernels if hold_next else l2_kernels, name)
    m, n, block = 7, 1000, 1024
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(m, n, generator=g) * 3 + 100).to(device)
    w = torch.randn(n, generator=g).to(device)
    b = torch.randn(n, generator=g).to(device)
    y = torch.empty_like(x)
    mean, rstd = torch.empty(m, device=device), torch.empty(m, device=device)
    words = torch.zeros(64, dtype=torch.int64, device=device)
    done = torch.zeros(8, dtype=torch.int32, device=device)
    meta = dict(HAS_WEIGHT=True, BLOCK_N=block, SPLITS=1, SPLITS_P2=1, ROUND_BF16=False, NEXT_FIRST=next_first)
    if not hold_next:  # each step loads its own row; the prefetch is inline PTX (none on the interpreter)
        meta.update(HOLD_NEXT=False, L2_AHEAD=0 if device == "cpu" else 1)
    x64 = x.double()
    if name.startswith("rms"):
        fn[(2,)](x, w, y, rstd, words, done, m, n, n, n, 1e-5, 2, **meta)
        want_rstd = torch.rsqrt(x64.pow(2).mean(1) + 1e-5)
        want = x64 * want_rstd[:, None] * w.double()
    else:
        fn[(2,)](x, w, b, y, mean, rstd, words, done, m, n, n, n, 1e-5, 2, HAS_BIAS=True, **meta)
        want_rstd = torch.rsqrt(x64.var(1, unbiased=False) + 1e-5)
        want = (x64 - x64.mean(1, keepdim=True)) * want_rstd[:, None] * w.double() + b.double()
        torch.testing.assert_close(mean.double(), x64.mean(1), rtol=1e-6, atol=0)
    torch.testing.assert_close(rstd.double(), want_rstd, rtol=1e-5, atol=0)
    torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=1e-5)
    assert not words.any() and not done.any()


def test_probe_row_candidates_run_the_rows_they_name():
    """The probe's "1 row" RMSNorm candidate runs one row a block against the plan's two, not the
    registered plan (a comparison of a kernel with itself)."""
    import torch

    from impls import registry
    from tools.long_row_candidates import candidates

    registry.load_all()
    for op, label, rows in (("rms_norm", "tilelang.cluster", 2), ("rms_norm", "tilelang.cluster 1 row", 1),
                            ("layer_norm", "tilelang.layer_norm_cluster", 1),
                            ("layer_norm", "tilelang.layer_norm_cluster 2 rows", 2)):
        make = {lab: m for _, lab, m in candidates(op)}[label]
        plan = make().plan_for(torch.bfloat16, 65536, True, op == "layer_norm", 8)
        assert plan.rows_per_block == rows, label


def test_layer_norm_weight_and_bias_ahead_compile_for_sm90():
    """CandidatePlan.wb_ahead (the probe's 'wb ahead' candidates): the first chunks' weight and bias
    are loaded into registers before the block waits for its peers' partials, not after; sm_90
    builds without spills at a power-of-two N and a padded one. They run on a GPU only (the
    probe)."""
    import torch

    from impls.tilelang import compiler
    from impls.tilelang.candidates import candidate_plan
    from tools.long_row_candidates import candidates

    tl, why = compiler.tilelang_module()
    if tl is None:
        pytest.skip(why)
    if compiler.nvcc_path() is None:
        pytest.skip("nvcc not found (CUDA_HOME or PATH): TileLang cannot compile CUDA kernels here")
    labels = {lab for _, lab, _ in candidates("layer_norm")}
    assert {"tilelang.layer_norm_cluster wb ahead 2", "tilelang.layer_norm_cluster 3 blocks an SM"} <= labels
    for n, ahead in ((131072, 4), (100000, 2), (131072, 0)):  # 4 at 100000 spills 36 bytes (its masks)
        plan = candidate_plan("layer_norm_cluster", torch.bfloat16, n, True, True, 8, wb_ahead=ahead)
        compiled = compiler.compile_plan(plan, compiler.SM90)
        src, r = compiled.source(), compiler.ptxas_report(compiled)
        assert r.sass_arch == "sm_90" and r.spill_stores == 0 and r.spill_loads == 0, (plan.describe(), r)
        wait = src.index("bar[0].wait(0)")
        assert ("*(uint4*)(wa + " in src) == bool(ahead) == ("*(uint4*)(ba + " in src), plan.describe()
        if ahead:  # both loads ahead of the wait; the first chunk after it is chunk `ahead`
            assert src.index("*(uint4*)(wa + ") < wait and src.index("*(uint4*)(ba + ") < wait, plan.describe()
        else:
            assert "= *(uint4*)(W + " in src[wait:], plan.describe()


def test_l2_prefetch_candidates_compile_for_sm90():
    """The bulk prefetch into L2 (the probe's 'L2 ahead' and 'L2 only' candidates), compiled for
    sm_90 (no GPU needed): the lagged split kernels of impls/triton/candidates/l2_kernels.py issue
    one cp.async.bulk.prefetch.L2 a step (and L2_AHEAD - 1 before their loop) and none at
    L2_AHEAD = 0, at the registers they take without it (within 2; registers on Triton 3.6 only);
    without the next row held (HOLD_NEXT off) they prefetch L2_AHEAD rows before the loop, and
    LayerNorm takes fewer registers (RMSNorm no more), without spills; the registered lagged
    kernels issue none. The TileLang cluster candidates call the prefetch before their first load
    of x, within 2 registers of the registered plan, without spills."""
    import re

    stdout = _compiled_offline(_L2_SCRIPT)
    got = {(name, int(a)): tuple(map(int, rest)) for name, a, *rest in (line.split() for line in stdout.splitlines())}
    # The register counts are Triton 3.6's (the H200's); another Triton allocates differently (3.9:
    # RMSNorm 72 registers at L2_AHEAD 0, 84 at 2), so there only the sites and no spills are checked.
    regs_checked = __import__("triton").__version__.startswith("3.6.")
    for name in ("rms", "ln"):  # at L2_AHEAD = 0 with the next row held: the registered kernel
        assert got[name + "_registered", 0] == got[name, 0], (name, got[name + "_registered", 0], got[name, 0])
        regs0 = got[name, 0][1]
        for ahead, sites in ((0, 0), (1, 1), (2, 2)):
            count, regs, spills = got[name, ahead]
            assert count == sites and spills == 0, (name, ahead, got[name, ahead])
            assert regs <= regs0 + 2 or not regs_checked, (name, ahead, got[name, ahead], regs0)
    for ahead, sites in ((0, 0), (1, 2), (2, 3)):  # without the next row held: its first L2_AHEAD rows too
        count, regs, spills = got["ln_l2", ahead]
        assert count == sites and spills == 0, (ahead, got["ln_l2", ahead])
        assert regs < got["ln", 0][1] or not regs_checked, (ahead, got["ln_l2", ahead], got["ln", 0])
        count, regs, spills = got["rms_l2", ahead]
        assert count == sites and spills == 0, (ahead, got["rms_l2", ahead])
        assert regs <= got["rms", 0][1] or not regs_checked, (ahead, got["rms_l2", ahead], got["rms", 0])

    import torch

    from impls.tilelang import compiler
    from impls.tilelang.candidates import candidate_plan
    from tools.long_row_candidates import candidates

    tl, why = compiler.tilelang_module()
    if tl is None:
        pytest.skip(why)
    if compiler.nvcc_path() is None:
        pytest.skip("nvcc not found (CUDA_HOME or PATH): TileLang cannot compile CUDA kernels here")
    for op, variant in (("rms_norm", "cluster"), ("layer_norm", "layer_norm_cluster")):
        labels = {lab for _, lab, _ in candidates(op)}
        assert {f"tilelang.{variant} L2 ahead 1", "triton.split L2 ahead 1", "triton.split L2 only"} <= labels, op
        for dtype, n, vec in ((torch.bfloat16, 131072, 8), (torch.float32, 100000, 4)):
            reports = []
            for ahead in (0, 1):  # 0: the registered plan
                plan = candidate_plan(variant, dtype, n, True, op == "layer_norm", vec, l2_ahead=ahead)
                compiled = compiler.compile_plan(plan, compiler.SM90)
                src, r = compiled.source(), compiler.ptxas_report(compiled)
                assert r.sass_arch == "sm_90" and r.spill_stores == 0 and r.spill_loads == 0, (plan.describe(), r)
                body = src[src.index("__global__"):]
                assert ("normdiff_prefetch_l2(X" in body) == bool(ahead), plan.describe()
                if ahead:
                    first_load = re.search(r"\*\(\w+\*\)\(X \+ ", body)  # a vector load of x
                    assert body.index("normdiff_prefetch_l2(X") < first_load.start(), plan.describe()
                reports.append(r.registers)
            assert reports[1] <= reports[0] + 2, (op, dtype, reports)


def test_gpu_run_longprobe_selects_the_open_candidates():
    """tools/gpu_run.sh longprobe's default selections (PROBE_LN, PROBE_RMS) name labels the probe
    has: the registered kernels of both backends and every L2-prefetch candidate of the op, so a
    renamed label cannot silently drop out of the next GPU session's probe."""
    import re
    from pathlib import Path

    from tools.long_row_candidates import candidates

    src = (Path(__file__).resolve().parents[1] / "tools" / "gpu_run.sh").read_text()
    for op, var, own in (("layer_norm", "PROBE_LN", "tilelang.layer_norm_cluster"), ("rms_norm", "PROBE_RMS", "tilelang.cluster")):
        only = re.search(rf"\${{{var}-'(.*?)'}}", src).group(1)
        labels = [label for _, label, _ in candidates(op)]
        chosen = {label for label in labels if re.search(only, label)}
        assert {own, "triton.split"} <= chosen, (op, sorted(chosen))
        assert {label for label in labels if "L2 " in label and not label.endswith("4")} <= chosen, (op, sorted(chosen))
        assert {label for label in labels if "rows in turn" in label} <= chosen, (op, sorted(chosen))


def test_layer_norm_rows_in_turn_compile_for_sm90():
    """CandidatePlan.seq_rows (the probe's 'rows in turn' candidates): sm_90 builds without spills in every
    dtype and at a padded N; the weight and bias are read from global memory only before the row
    loop (the rows read them from shared memory), the loop alternates two mbarriers with the
    parity of its row pairs, and every row starts with a barrier (its load overwrites the segment
    the last row's y pass read). They run on a GPU only (the probe)."""
    import re

    import torch

    from impls.tilelang import compiler
    from impls.tilelang.candidates import candidate_plan

    tl, why = compiler.tilelang_module()
    if tl is None:
        pytest.skip(why)
    if compiler.nvcc_path() is None:
        pytest.skip("nvcc not found (CUDA_HOME or PATH): TileLang cannot compile CUDA kernels here")
    for dtype, n, vec in ((torch.bfloat16, 131072, 8), (torch.float16, 100000, 8), (torch.float32, 65536, 4)):
        plan = candidate_plan("layer_norm_cluster", dtype, n, True, True, vec, segment_bytes=16384, max_cluster=16,
                              seq_rows=8)
        assert plan.seq_rows == 8 and plan.min_blocks, plan
        compiled = compiler.compile_plan(plan, compiler.SM90)
        src, r = compiled.source(), compiler.ptxas_report(compiled)
        assert r.sass_arch == "sm_90" and r.spill_stores == 0 and r.spill_loads == 0, (plan.describe(), r)
        body = src[src.index("__global__"):]
        loop = body.index("for (int k = 0; k < 8; ++k) {")
        assert re.search(r"\(W \+ ", body[:loop]) and re.search(r"\(B \+ ", body[:loop]), plan.describe()
        assert not re.search(r"[(\[]W \+ |[(\[]B \+ |W\[|B\[", body[loop:]), plan.describe()
        assert "bar[(k & 1)].wait(((k & 3) >> 1))" in body[loop:], plan.describe()
        assert body[loop:].split("\n", 2)[1].strip() == "__syncthreads();", plan.describe()


def test_candidate_backend_registers_the_probe_candidates_as_backends():
    """tools/candidate_backend.py (the probe's candidates through the harness's catalogue): each
    open candidate becomes a backend of its own, with the variant it varies and the probe's plan
    or launch setting (not the registered kernel's), and the registered kernels stay as they are."""
    import subprocess
    import sys
    from pathlib import Path

    script = r'''
import torch
from impls import registry
registry.load_all(["tools/candidate_backend.py"])
for k in registry.kernels():
    if not k.backend.startswith("candidate_"):
        continue
    if k.backend.startswith("candidate_tilelang"):
        p = k.plan_for(torch.bfloat16, 131072, True, k.op == "layer_norm", 8)
        print(k.op, k.name, "plan", getattr(p, "seq_rows", 0), getattr(p, "l2_ahead", 0), p.rows_per_block)
    else:
        c = k.config(131072, torch.bfloat16)
        print(k.op, k.name, "config", c.l2_ahead, c.hold_next, k.kernel_name(131072))
own = registry.get("layer_norm", "tilelang", "layer_norm_cluster").plan_for(torch.bfloat16, 131072, True, True, 8)
cfg = registry.get("layer_norm", "triton", "split").config(131072, torch.bfloat16)
print("own", type(own).__name__, type(cfg).__name__, hasattr(own, "l2_ahead") or hasattr(cfg, "l2_ahead"))
'''
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {line.split()[1]: line.split() for line in proc.stdout.splitlines() if not line.startswith("own")}
    assert rows["candidate_tilelang_layer_norm_cluster_8_rows_in_turn.layer_norm_cluster"][3:] == ["8", "0", "1"]
    assert rows["candidate_tilelang_layer_norm_cluster_8_rows_in_turn_l2_ahead.layer_norm_cluster"][3:] == ["8", "1", "1"]
    assert rows["candidate_tilelang_cluster_l2_ahead_2.cluster"][3:5] == ["0", "2"]
    assert rows["candidate_triton_split_l2_ahead_1.split"][3:] == ["1", "True", "rms_norm_split_lag"]
    assert rows["candidate_triton_split_l2_only.split"][3:] == ["1", "False", "rms_norm_split_lag"]
    assert proc.stdout.splitlines()[-1].split()[1:] == ["Plan", "LaunchConfig", "False"]  # the registered kernels' own


def test_probe_schedule_budget_and_again_on_the_cpu(tmp_path, monkeypatch):
    """tools/long_row_probe's main loop without a GPU (its GPU calls stood in for, the kernels
    torch's eager ones): every candidate runs at each N with --again's second reading in reverse
    order, the mean of the two in its row; with a budget of nothing left every run is skipped
    as 'budget', at every N alike. (The probe's timing and kernels are the GPU's; here only its
    schedule and bookkeeping.)"""
    import json
    import types

    import torch

    from harness.judging import inputs as hc
    from harness.benchmarks import timing as real_timing
    from impls import base, registry
    from tools import long_row_probe as probe

    registry.load_all()
    readings = iter(range(1000))
    fake = types.SimpleNamespace(
        GpuTools=lambda: None, copy_ceiling_gbps=lambda device, tools: (0.001,),
        gpu_time_ms=lambda fn, tools: (fn(), 1.0 + 0.01 * next(readings))[1], bytes_moved=real_timing.bytes_moved)
    monkeypatch.setattr(probe, "timing", fake)
    monkeypatch.setattr(probe, "make_inputs", lambda case, device: hc.make_inputs(case, "cpu"))
    monkeypatch.setattr(probe, "spec_of", lambda op, x, device, w, b: base.spec_of(op, x, "cpu", w, b))
    monkeypatch.setattr(probe, "bandwidth_rows", lambda n: 16)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "cpu stand-in")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    eager = lambda op: lambda: registry.get(op, "torch", "eager")  # noqa: E731
    monkeypatch.setattr(probe, "candidates", lambda op: [(1, "a", eager(op)), (1, "b", eager(op)), (2, "c", eager(op))])

    out = tmp_path / "run"
    assert probe.main(["--out", str(out), "--ops", "layer_norm", "--ns", "512,1024", "--tiers", "1", "--bench-rows",
                       "--dtype", "float32", "--again", "--budget", "1000"]) in (0, None)
    doc = json.loads((out / "long_rows.json").read_text())
    got = [(r["n"], r["kernel"]) for r in doc["results"]]
    assert got == [(512, "a"), (512, "b"), (1024, "a"), (1024, "b")], got
    for r in doc["results"]:
        assert r["ok"] and r["repeat_bitwise"] and r["alone_bitwise"], r
        assert r["pct_of_copy_mean"] == pytest.approx((r["pct_of_copy"] + r["pct_of_copy_again"]) / 2)
    # the second readings come in reverse order: b's before a's, so a's is the later (slower) one
    by = {(r["n"], r["kernel"]): r for r in doc["results"]}
    assert by[512, "a"]["pct_of_copy_again"] < by[512, "b"]["pct_of_copy_again"]

    out = tmp_path / "none"
    probe.main(["--out", str(out), "--ops", "layer_norm", "--ns", "512,1024", "--tiers", "2", "--bench-rows",
                "--budget", "0"])
    doc = json.loads((out / "long_rows.json").read_text())
    assert [r.get("skipped") for r in doc["results"]] == ["budget"] * 6, doc["results"]


def test_rows_in_turn_plan_counts_the_weight_and_bias_segments():
    """The probe's 'rows in turn' plans (candidate_plan with seq_rows): 16 KB segments in clusters of
    up to 16, with the shared memory of the weight and bias counted in the launch bound; without
    seq_rows the same overrides give a plain Plan, which the registered program builds."""
    import torch

    from impls.tilelang._long_plan import cluster_size
    from impls.tilelang.candidates import CandidatePlan, candidate_plan
    from impls.tilelang.plan import Plan

    def plan(dtype, n, vec, seq_rows):
        return candidate_plan("layer_norm_cluster", dtype, n, True, True, vec, segment_bytes=16384, max_cluster=16,
                              seq_rows=seq_rows)

    on = plan(torch.bfloat16, 131072, 8, 8)
    assert isinstance(on, CandidatePlan) and on.variant == "layer_norm_cluster_rows"
    assert (on.seq_rows, on.padded, cluster_size(on)) == (8, 8192, 16), on
    assert on.min_blocks == 4  # three 16 KB segments a block: four blocks an SM
    off = plan(torch.bfloat16, 131072, 8, 0)
    assert type(off) is Plan and off.variant == "layer_norm_cluster" and off.padded == on.padded
    wide = plan(torch.float32, 262144, 4, 8)
    assert wide.seq_rows == 8 and wide.min_blocks is None  # 192 KB a block: one an SM, no bound
    assert plan(torch.float32, 262144, 4, 0).min_blocks == 2  # 64 KB a block: two an SM (the registers' bound)


def test_the_backends_do_not_import_their_candidates():
    """The kernels users run carry no candidate: loading the built-in backends imports neither
    impls.triton.candidates nor impls.tilelang.candidates (only the probe's tools do)."""
    import subprocess
    import sys
    from pathlib import Path

    script = ("import sys; from impls import registry; registry.load_builtins(); "
              "print(sorted(m for m in sys.modules if m.startswith('impls.') and 'candidates' in m))")
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[]", proc.stdout
