"""The tuned launch settings are data: each row cites its evidence as path@commit, and that
evidence exists in the repository's history."""
import shutil
import subprocess
from pathlib import Path

import pytest

from impls import tuned

ROOT = Path(__file__).resolve().parents[1]
FILES = sorted(ROOT.glob("impls/*/tuned_*.toml"))


def test_each_compiled_backend_has_a_tuned_file():
    assert {f.parent.name for f in FILES} == {"triton", "tilelang"}


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_row_cites_evidence_that_git_holds(path):
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the cited commits cannot be looked up")
    sources = {row["source"] for rows in tuned.load(path).values() for row in rows}
    assert sources
    missing = []
    for source in sorted(sources):
        file, commit = source.rsplit("@", 1)
        found = subprocess.run(["git", "cat-file", "-e", f"{commit}:{file}"], cwd=ROOT, capture_output=True)
        if found.returncode:
            missing.append(source)
    if missing and subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT,
                                  capture_output=True, text=True).stdout.strip() == "true":
        pytest.skip(f"a shallow clone lacks the history of {len(missing)} cited files")
    assert not missing, f"cited evidence not in git: {missing}"


def test_a_row_without_source_or_a_duplicate_row_is_refused(tmp_path):
    bad = tmp_path / "tuned_x.toml"
    bad.write_text('rowwise = [{op = "rms_norm", bytes = 2, block_n = 1024, rows = 1, warps = 4}]\n')
    with pytest.raises(ValueError, match="source"):
        tuned.load(bad)
    twice = tmp_path / "tuned_y.toml"
    row = '{op = "rms_norm", bytes = 2, block_n = 1024, rows = 1, warps = 4, source = "a.json@abcdef0"}'
    twice.write_text(f"rowwise = [{row}, {row}]\n")
    with pytest.raises(ValueError, match="two rows"):
        tuned.table(twice, "rowwise", ("op", "bytes", "block_n"), ("rows", "warps"))


def test_the_tables_hold_what_the_files_say():
    from impls.tilelang import plan
    from impls.triton import settings

    rows = tuned.load(settings.TUNED_FILE)
    assert len(settings.ROWWISE_TUNED) == len(rows["rowwise"])
    assert len(settings.LOOPED_TUNED) + len(settings.LOOPED_TUNED_FLOAT16) == len(rows["looped"])
    assert settings.DISPATCH[("rms_norm", 4)][-1] == (None, "split")  # up_to = 0: open-ended
    assert plan.TUNED[("fragment", 2, 8192)] == (64, None)  # min_blocks = 0: the rule's bound
    # the backward's rows: (rows per program, rows per tile, warps, maxnreg, stages), 0 where a row leaves one out
    assert len(settings.BWD_SETTINGS) == len(rows["backward"])
    assert settings.BWD_SETTINGS[("rms_norm", 2, 2048)] == (64, 1, 8, 64, 0)
    assert settings.BWD_SETTINGS[("layer_norm", 2, 1024)] == (128, 2, 4, 0, 3)


def test_optional_fields_take_their_defaults_where_a_row_leaves_them_out(tmp_path):
    f = tmp_path / "tuned_z.toml"
    row = '{{op = "rms_norm", bytes = 4, n = {n}, block_n = 8, warps = 1, {extra}source = "a.json@abcdef0"}}'
    f.write_text(f'split = [{row.format(n=8, extra="")}, {row.format(n=16, extra="hold_w = true, ")}]\n')
    got = tuned.table(f, "split", ("op", "bytes", "n"), ("block_n", "warps"),
                      optional={"hold_w": False, "x_cache": ".cg"})
    assert got == {("rms_norm", 4, 8): (8, 1, False, ".cg"), ("rms_norm", 4, 16): (8, 1, True, ".cg")}


def test_the_split_settings_carry_the_lagged_kernels_load_choices():
    import torch

    from impls.triton import settings

    held = settings.split_config(131072, torch.float32, "rms_norm")  # a row with hold_w = true
    ruled = settings.split_config(100000, torch.bfloat16, "layer_norm")  # no row: the rule
    for cfg, op in ((held, "rms_norm"), (ruled, "layer_norm")):
        assert (cfg.x_cache, cfg.w_evict) == (settings.SPLIT_X_CACHE, settings.SPLIT_W_EVICT)
        assert cfg.next_first == settings.SPLIT_NEXT_FIRST[op]  # the op's default where a row leaves it out
    assert held.hold_w and not ruled.hold_w


def test_no_split_row_needs_more_programs_a_row_than_the_rule_allows():
    """Every program of a row must be resident at once: SPLIT_MAX (64) programs run on any GPU the
    project targets, 128 would not on one of 114 SMs."""
    from impls.gpu_limits import cdiv
    from impls.triton import settings

    too_many = {k: v for k, v in settings.SPLIT_TUNED.items() if cdiv(k[2], v.block_n) > settings.SPLIT_MAX}
    assert not too_many
