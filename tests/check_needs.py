"""What each check function declares it needs (``@pytest.mark.needs``), read from the check files
themselves: the framework's tests that name checks by function (the GPU peaks data is keyed by
node id) ask the estimate with the check's own declaration."""
from __future__ import annotations

import functools
import importlib
from pathlib import Path

HARNESS = Path(__file__).resolve().parents[1] / "harness"


@functools.lru_cache(maxsize=None)
def declared() -> dict[str, str]:
    found = {}
    for path in sorted(HARNESS.glob("test_*.py")):
        module = importlib.import_module(f"harness.{path.stem}")
        for name, fn in vars(module).items():
            for mark in getattr(fn, "pytestmark", ()) if name.startswith("test_") else ():
                if mark.name == "needs":
                    found[name] = mark.args[0]
    return found


def need_of(test: str) -> str:
    return declared()[test]
