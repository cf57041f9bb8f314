"""The fp8 output's store in sm_90 PTX, offline (tools/decode_fp8_candidates.py): the reciprocal of
the scale taken once, 16-byte vector stores; the probe's other forms beside."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[1]


def test_the_fp8_store_takes_no_division_and_stores_16_bytes_a_vector():
    """The fp8 output's two leads, held in sm_90 PTX (tools/decode_fp8_candidates.py offline): the
    kernels multiply by the reciprocal (no div.rn; the probe's divide candidates keep theirs) and
    store 16-byte vectors (TileLang's 8-byte candidate stores 8)."""
    pytest.importorskip("tilelang")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-m", "tools.decode_fp8_candidates"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = json.loads(run.stdout)
    for op in ("rms_norm", "add_rms_norm"):
        for kernel in ("triton.fused", "tilelang.fused"):
            counts = rows[f"{kernel}/{op}"]
            assert counts["div.rn"] == 0 and counts["cvt e4m3x2"] > 0, (kernel, op, counts)
            assert any(s.startswith("v4.") and s.endswith("32") for s in counts["stores"]), (kernel, op, counts)
        assert rows[f"probe_div.fused/{op}"]["div.rn"] > 0 and rows[f"probe_tldiv.fused/{op}"]["div.rn"] > 0
        assert "v4.u16" in rows[f"probe_tlvec8.fused/{op}"]["stores"]
