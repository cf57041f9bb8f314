"""What a repro is of: a check's node id (or ``CASE-KERNEL``) read back into the case, the kernel
and the check (the plain or the fused family, the forward or the backward), and where the harness
saw it: a run's report, or this machine."""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from harness.judging.cases import Case, case_from_id
from harness.judging.fused_cases import FusedCase, fused_case_from_id
from harness.judging.runner import device_for
from impls import registry
from impls.fused import is_fused

# The checks a repro reproduces: test name -> (fused, backward).
CHECKS = {"test_against_oracle": (False, False), "test_backward": (False, True), "test_fuzz": (False, False),
          "test_fuzz_backward": (False, True), "test_fused_against_oracle": (True, False),
          "test_fused_backward": (True, True)}
_NODE = re.compile(r"^(?:(?P<file>[^:]*)::)?(?:(?P<test>test_\w+)\[)?(?P<param>[^\]]+)\]?$")


@dataclass
class Target:
    nodeid: str
    test: str
    case: Case
    kernel: object
    fused: bool
    backward: bool
    device: str
    environment: dict = field(default_factory=dict)  # where the harness saw it (a report's) or this machine's
    record: dict | None = None  # the report's record of the check, when read from a report
    backend_files: tuple[str, ...] = ()

    @property
    def source(self) -> str:
        return "the report" if self.record is not None else "this machine"


def split_param(param: str) -> tuple[str, str]:
    """``CASE-KERNEL`` (the check's parameter id) into the case id and the kernel's name."""
    case_id, _, kernel = param.rpartition("-")
    if not case_id or "." not in kernel:
        raise ValueError(f"not CASE-KERNEL: {param!r} (e.g. rms_norm-bfloat16-3x1000-normal-torch.eager)")
    return case_id, kernel


def parse_case(case_id: str, fused: bool | None) -> Case:
    """A case id as the plain catalogue's, else as the fused one's (or as ``fused`` says)."""
    if fused is None:
        try:
            case = case_from_id(case_id)
            if case.op in ("rms_norm", "layer_norm"):
                return case
        except ValueError:
            pass
        return fused_case_from_id(case_id)
    return fused_case_from_id(case_id) if fused else case_from_id(case_id)


def resolve(nodeid: str, backend_files=(), report: dict | None = None, case_id: str | None = None,
            backward: bool = False) -> Target:
    """The check ``nodeid`` names (with a run's ``report`` document: its record, environment and
    plug-in files). ``case_id``: a drawn case (a fuzz check's, which its node id does not carry)."""
    m = _NODE.match(nodeid.strip())
    if not m:
        raise ValueError(f"not a check's node id: {nodeid!r}")
    test = m["test"] or ("test_backward" if backward else "test_against_oracle")
    if test not in CHECKS:
        raise ValueError(f"{test}: a repro reproduces the oracle checks ({', '.join(CHECKS)}), not this one")
    record = None
    if report is not None:
        record = next((r for r in report.get("records", ()) if r.get("nodeid") == nodeid
                       or r.get("nodeid", "").endswith(nodeid)), None)
        backend_files = tuple(backend_files) + tuple((report.get("selection") or {}).get("backend_file") or ())
    registry.load_all(list(dict.fromkeys(backend_files)))
    fused, is_bwd = CHECKS[test]
    if test.startswith("test_fuzz"):
        kernel_name = m["param"].split("-")[-1]
        case_id = case_id or (record or {}).get("drawn_case")
        if not case_id:
            raise ValueError(f"{nodeid}: a drawn case; give it with --case (the report's *drawn case*)")
    else:
        found_case, kernel_name = split_param(m["param"])
        case_id = case_id or found_case
        if m["test"] is None:
            fused = None
    case = parse_case(case_id, fused)
    backend, _, variant = kernel_name.partition(".")
    kernel = registry.get(case.op, backend, variant)
    fused = is_fused(kernel)
    if fused and not isinstance(case, FusedCase):
        case = fused_case_from_id(case.id)
    env = (report or {}).get("environment") or local_environment(kernel)
    device = device_for(kernel)
    if report is not None:
        gpu = str(env.get("gpu") or "")
        device = "cuda" if gpu and not gpu.startswith("none") and "cuda" in kernel.devices else "cpu"
    return Target(nodeid, test, case, kernel, fused, is_bwd, device, env, record, tuple(backend_files))


def local_environment(kernel) -> dict:
    from harness.running.run import environment

    return environment([kernel])


def plugin_file(kernel) -> str | None:
    """The file a plug-in kernel was loaded from (None for a built-in module's)."""
    module = sys.modules.get(type(kernel).__module__)
    name = getattr(module, "__name__", "")
    if name.startswith("normdiff_plugin_") and getattr(module, "__file__", None):
        return str(Path(module.__file__).resolve())
    return None
