"""Op families: the plain norms, the fused ones, and any family a plug-in brings. A family is one
object that owns what its kernels are judged and timed on: its catalogue and case ids, how its
cases pair with its kernels, its oracle check and backward check, the device memory each check
needs, and its benchmark rows. The plugin, the run's state, the memory estimate and the benchmarks
loop over the registered families; none of them names one.

A family registers itself (``register_family``) where it is defined: the project's two in
harness/families.py, an outside one in its plug-in file, beside its kernels (impls.contract's
``family`` names the family a kernel belongs to).
"""
from __future__ import annotations

from typing import Any


class Family:
    """What the harness asks of a family. A family of kernels without check files of its own is
    judged by the generic checks (harness/test_families.py), through the fixtures named here."""

    name: str = ""
    ops: tuple[str, ...] = ()
    # The fixtures its forward and backward checks take: (case, kernel) pairs.
    forward_fixture: str = "family_case_kernel"
    backward_fixture: str | None = "family_backward_case_kernel"
    kernel_fixture: str = "family_kernel"  # checks of a kernel on no case (bad input)

    def catalogue(self, profile: str) -> list:
        """The profile's forward cases (``harness.judging.cases.Case`` or a subclass)."""
        raise NotImplementedError

    def backward_catalogue(self, profile: str) -> list:
        return []

    def case_from_id(self, case_id: str):
        """The case an id names (its inputs follow from it): a failure reproduces from its id."""
        raise NotImplementedError

    def pairs(self, cases: list, kernels: list, backward: bool = False) -> list[tuple[Any, Any]]:
        """(case, kernel) for every check: by default each case with every kernel of its op, the
        kernels of one case together."""
        return [(c, k) for c in cases for k in kernels if k.op == c.op]

    def check(self, kernel, case, watch=None):
        """Run ``kernel`` on ``case`` and judge it: a harness.judging.runner.CheckResult."""
        raise NotImplementedError

    def check_backward(self, kernel, case, watch=None):
        raise NotImplementedError(f"the {self.name} family has no backward checks")

    def forget(self) -> None:
        """Drop what the family keeps of the last case (its inputs and oracle)."""

    def estimate(self, need: str, case, kernel, peers, device: str) -> dict[str, int]:
        """The device bytes, by part, that check kind ``need`` (a check's declared need, e.g.
        "oracle" or "backward") of ``kernel`` on ``case`` allocates at its peak."""
        raise NotImplementedError(f"the {self.name} family estimates no {need!r} check")

    def bench_items(self, config, kernels: list, profile: str, dtypes: tuple, repeat: int, bench_set: str) -> list:
        """The benchmark rows of these kernels (harness.benchmarks.bench_sweep.BenchItem), if any."""
        return []

    def run_bench(self, item, benchmark, ctx) -> None:
        raise NotImplementedError(f"the {self.name} family has no benchmarks")


_FAMILIES: dict[str, Family] = {}


def register_family(family: Family) -> Family:
    """Make ``family`` one the harness loops over (again for the same object: a no-op)."""
    held = _FAMILIES.get(family.name)
    if held is not None and type(held) is not type(family):
        raise ValueError(f"a family named {family.name!r} is already registered ({type(held).__name__})")
    _FAMILIES[family.name] = family
    return family


def families() -> list[Family]:
    return list(_FAMILIES.values())


def family(name: str) -> Family:
    try:
        return _FAMILIES[name]
    except KeyError:
        raise KeyError(f"no family {name!r} is registered (registered: {', '.join(_FAMILIES) or 'none'}); a "
                       "plug-in's family registers with harness.judging.family.register_family") from None


__all__ = ["Family", "families", "family", "register_family"]
