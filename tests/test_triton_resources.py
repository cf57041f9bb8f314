"""tools/triton_resources.py: the Triton kernels' registers and blocks per SM, compiled for sm_90
without a GPU. It runs as its own process (a pytest process may hold the interpreter's kernels,
which cannot be compiled). The register counts are Triton 3.6.0's (the pinned version); a newer
Triton may allocate differently, and then ROWWISE_ONE_ROW wants measuring again."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[1]


def test_blocks_per_sm_counts_registers_in_eights():
    from impls.gpu_limits import blocks_per_sm

    assert blocks_per_sm(64, 16) == 2
    assert blocks_per_sm(65, 16) == 1  # 72 allocated: 36864 of 65536 a block of 512 threads
    assert blocks_per_sm(32, 32) == 2
    assert blocks_per_sm(34, 32) == 1
    assert blocks_per_sm(16, 4) == 16  # the thread limit, 2048 an SM
    assert blocks_per_sm(16, 1) == 32  # at most 32 a SM
    assert blocks_per_sm(32, 4, shared=100 * 1024) == 2  # shared memory


def _run(tmp_path, *args):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "r.json"
    subprocess.run([sys.executable, "-m", "tools.triton_resources", *args, "--json", str(out)],
                   check=True, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    return json.loads(out.read_text())


@pytest.mark.skipif(not __import__("triton").__version__.startswith("3.6."),
                    reason="the register counts are Triton 3.6's (the H200's); another Triton allocates differently, "
                           "and ROWWISE_ONE_ROW then wants measuring on a GPU again")
def test_the_rowwise_form_chosen_holds_the_most_blocks_where_it_was_measured(tmp_path):
    """LayerNorm bf16: at 16384 the 1-D form takes more registers (one block of 512 threads a
    SM, 58.9% of copy against 92.7%), at 8192 the tile form does (three blocks of 256 against
    four, 88.8% against 96.8%); the launcher runs the form with more blocks at both."""
    rows = _run(tmp_path, "--op", "layer_norm", "--dtype", "bfloat16", "--ns", "8192,16384", "--forms")
    for n, chosen_kernel in ((8192, "layer_norm_row"), (16384, "layer_norm_rowwise")):
        chosen, other = (next(r for r in rows if r["n"] == n and r["chosen"] == c) for c in (True, False))
        assert chosen["kernel"] == chosen_kernel
        assert chosen["blocks_per_sm"] > other["blocks_per_sm"], (chosen, other)
        assert chosen["stack"] == 0 and 0 < chosen["registers"] <= 255


def test_the_interpreter_is_refused_with_the_reason():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    r = subprocess.run([sys.executable, "-m", "tools.triton_resources"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "TRITON_INTERPRET=1" in r.stderr


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_the_backward_kernels_compile_for_sm90_without_spills(tmp_path, op):
    """Every launch of the Triton backward (the one-tile row kernel, the long-row statistics pass
    and column blocks, the final dw/db reduction) compiles for sm_90 and holds no stack."""
    rows = _run(tmp_path, "--backward", "--op", op, "--dtype", "bfloat16", "--ns", "1000,8192,16384")
    assert {r["kernel"] for r in rows} == {"bwd_rows", "bwd_row_stats", "bwd_reduce"}
    for r in rows:
        assert r["stack"] == 0 and 0 < r["registers"] <= 255, r


def test_codegen_hash_hashes_a_build_and_compares_two_runs(tmp_path):
    """tools/codegen_hash.py (a refactor's proof that the generated code did not change): one
    Triton build's PTX hash, the same in a second run, and --compare fails where a hash differs."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    runs = []
    for name in ("a", "b"):
        out = tmp_path / f"{name}.json"
        subprocess.run([sys.executable, "-m", "tools.codegen_hash", "--backend", "triton", "--only",
                        "^rms_norm triton.rowwise bfloat16-4096-full-256$", "--json", str(out)],
                       check=True, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        runs.append(out)
    rows = json.loads(runs[0].read_text())["kernels"]
    assert [(r["kernel"], r["build"]) for r in rows] == [("rms_norm triton.rowwise", "bfloat16-4096-full-256")]
    assert len(rows[0]["sha256"]) == 64 and rows[0] == json.loads(runs[1].read_text())["kernels"][0]

    def compare():
        return subprocess.run([sys.executable, "-m", "tools.codegen_hash", "--compare", *map(str, runs)], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=300)
    assert compare().returncode == 0
    changed = json.loads(runs[1].read_text())
    changed["kernels"][0]["sha256"] = "0" * 64
    runs[1].write_text(json.dumps(changed))
    r = compare()
    assert r.returncode == 1 and "1 differ" in r.stdout, r.stdout


def test_codegen_hash_leaves_out_only_what_names_the_source():
    """The PTX hashed: without file and line records, debug labels and sections, and comments
    (moving a function changes them, not an instruction); every instruction kept."""
    from tools.codegen_hash import ptx_code

    def ptx(path, line):
        return (f'\t.file\t1 "{path}"\n\t.loc\t1 {line} 0  // {path}:{line}\n$L__tmp0:\n'
                "\tadd.s32 \t%r1, %r2, %r3;  // %bb.0\n\tst.global.b32 [%rd1], %r1;\n"
                f"\t.section\t.debug_info\n.b32 {line}\n")

    assert ptx_code(ptx("/a/_kernels.py", 12)) == ptx_code(ptx("/b/_split_kernels.py", 40))
    assert ptx_code(ptx("/a/k.py", 1)).split("\n") == ["\tadd.s32 \t%r1, %r2, %r3;", "\tst.global.b32 [%rd1], %r1;"]
    assert ptx_code(ptx("/a/k.py", 1)) != ptx_code(ptx("/a/k.py", 1).replace("add.s32", "sub.s32"))
