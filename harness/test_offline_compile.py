"""Kernels that compile for a GPU without one (``NormKernel.offline_builds``: TileLang's, for
sm_90) are built on any machine with their compiler, over the builds each declares (padded and
odd N, long rows, the capacity edge, every affine combination, decode plans; the quick profile
leaves out float16 builds that bfloat16 ones repeat). Each build's
compiler numbers (registers, shared memory, spills) go to the report's "compiled" section; a
build is never counted as a run: without the GPU the report says "compiled, not executed".

The harness's requirements of every build: the binary is for the architecture asked for, the
registers fit a thread (255), and nothing spills (a spill means the kernel's plan holds more of
the row in registers than fits: its declared capacity is wrong).
"""
import pytest

from harness.running.run import STATE
from impls.base import UnsupportedCase


def quick_builds(builds: tuple) -> tuple:
    """The quick profile's share of a kernel's builds: a float16 build is left out where the same
    build is declared in bfloat16, whose 16-bit program differs from it only in the element type
    (CI's 2 cores spent about 7 s a build; the full profile builds them all)."""
    def as_bf16(b):
        return tuple("bfloat16" if p == "float16" else p for p in b)

    declared = set(builds)
    return tuple(b for b in builds if "float16" not in b or as_bf16(b) not in declared)


def pytest_generate_tests(metafunc):
    """One check per declared build of each selected kernel (none declared: an empty set, which
    the plugin deselects; it is not a skip); the quick profile's share of them (quick_builds)."""
    if "offline_build" not in metafunc.fixturenames:
        return
    state = metafunc.config.stash[STATE]
    share = quick_builds if state.profile == "quick" else tuple
    params = [(k, b) for k in state.kernels + state.fused_kernels for b in share(k.offline_builds())]
    metafunc.parametrize("offline_build", params, ids=[
        f"{k.op}-{k.name}-" + "-".join(str(p) for p in b if p is not None) for k, b in params])


@pytest.mark.needs("small")
def test_compiles_offline(offline_build, request):
    kernel, build = offline_build
    try:
        report = kernel.build_offline(build)
    except UnsupportedCase as exc:
        pytest.skip(str(exc))
    request.node.user_properties.append(("normdiff_compiled", {"backend": kernel.backend, "kernel": kernel.name,
                                                               **report}))
    assert report["sass_arch"] == report["arch"], f"the binary is {report['sass_arch']} SASS, not {report['arch']}"
    assert report["registers"] is not None and report["registers"] <= 255
    assert report["spill_stores"] == 0 and report["spill_loads"] == 0, report
