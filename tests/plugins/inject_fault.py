"""A pytest plugin (``-p tests.plugins.inject_fault``) that makes the harness itself fail in one
check: ``NORMDIFF_FAULT=WHERE@NODEID[;WHERE@NODEID...]`` raises a RuntimeError from WHERE while the
check whose node id ends with NODEID runs. WHERE is ``module:attribute`` (a function or method the
harness calls, e.g. ``harness.running.ledger:GpuLedger.admit``, ``harness.judging.inputs:make_inputs``,
``impls.reference:reference``), replaced wherever a harness module imported it."""
from __future__ import annotations

import functools
import importlib
import os
import sys

import pytest

_RUNNING: list[str] = [""]


def _faults() -> list[tuple[str, str]]:
    spec = os.environ.get("NORMDIFF_FAULT", "")
    return [tuple(part.split("@", 1)) for part in spec.split(";") if "@" in part]


def _wrap(original, where: str, target: str):
    @functools.wraps(original)
    def faulty(*args, **kwargs):
        if _RUNNING[0].endswith(target):
            raise RuntimeError(f"injected fault at {where}")
        return original(*args, **kwargs)

    return faulty


def _install(where: str, target: str) -> None:
    module_name, _, path = where.partition(":")
    owner = importlib.import_module(module_name)
    *parents, name = path.split(".")
    for part in parents:
        owner = getattr(owner, part)
    original = getattr(owner, name)
    faulty = _wrap(original, where, target)
    setattr(owner, name, faulty)
    if not parents:  # a function: also where a module imported it by name
        for mod in list(sys.modules.values()):
            if getattr(mod, "__name__", "").startswith(("harness", "impls")) and getattr(mod, name, None) is original:
                setattr(mod, name, faulty)


def pytest_configure(config):
    for where, target in _faults():
        _install(where, target)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logstart(nodeid, location):
    _RUNNING[0] = nodeid
