"""Every check of harness/ declares what it needs (``@pytest.mark.needs``), the memory estimate's
key: a check that forgot it would run unadmitted on a GPU shared by workers."""
from __future__ import annotations

import ast
from pathlib import Path

from harness.running.estimate import NEEDS
from tests.check_needs import HARNESS, declared


def test_every_check_declares_a_known_need():
    checks = {n.name for p in HARNESS.glob("test_*.py") for n in ast.parse(p.read_text()).body
              if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}
    needs = declared()
    assert checks and checks == set(needs), f"checks without a need: {sorted(checks - set(needs))}"
    assert set(needs.values()) <= set(NEEDS), {k: v for k, v in needs.items() if v not in NEEDS}


def test_a_check_of_a_plug_in_family_declares_its_need_too():
    source = (Path(HARNESS) / "test_families.py").read_text()
    assert source.count("@pytest.mark.needs(") == source.count("\ndef test_")
