"""The native call path and programmatic dependent launch (impls.native, impls.pdl): a launch
recorded with PDL is replayed with its attribute (cuLaunchKernelEx), or refused with the reason;
plans and tables recorded under one position of the PDL switch serve nothing after a change.
Each GPU test has a CPU twin: the recording's decision, the replay's launch configuration against
cuda.h, the table's refusal, the call path's dropped caches."""
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from impls import base, callpath, native, pdl, registry
from impls.base import NormOutputs

registry.load_all()

GPU = torch.cuda.is_available()


@pytest.fixture(scope="module")
def mod():
    return native._build()


def _pdl_gpu_reason():
    if not GPU:
        return "needs a CUDA GPU: the native path replays CUDA launches"
    return pdl.unavailable("cuda")


# -- the recording's decision (CPU) ------------------------------------------------------------
PDL, PLAIN = True, False
RULES = [  # (declared, evidence per launch as read_graph gives it: (edge, attribute), launch_ex, flags or refusal)
    (False, [(-1, -1)], True, [PLAIN]),
    (False, [(-1, 0)], True, [PLAIN]),
    (False, [(0, -1), (0, 0)], False, [PLAIN, PLAIN]),
    (False, [(1, -1)], True, "does not declare"),
    (False, [(-1, 1)], True, "does not declare"),
    (True, [(1, -1)], True, [PDL]),
    (True, [(1, 0)], True, [PDL]),  # an attribute of 0 proves nothing: the capture moved it to the edge
    (True, [(-1, 1)], True, [PDL]),
    (True, [(0, -1)], True, [PLAIN]),  # may launch with PDL, and at this setting did not
    (True, [(1, -1), (0, -1)], True, [PDL, PLAIN]),
    (True, [(0, 1)], True, "edge shows no PDL but the node's attribute does"),
    (True, [(-1, -1)], True, "cannot be established"),
    (True, [(-1, 0)], True, "cannot be established"),
    (True, [(1, -1), (-1, -1)], True, "whether launch 1 used PDL cannot be established"),
    (True, [(1, -1)], False, "no cuLaunchKernelEx"),
    (True, [(0, -1)], False, [PLAIN]),  # no PDL launch: cuLaunchKernel replays it
]


@pytest.mark.parametrize("declared,evidence,launch_ex,want", RULES)
def test_the_recording_decides_each_launch_by_declaration_and_capture(declared, evidence, launch_ex, want):
    if isinstance(want, list):
        assert native.replay_pdl(declared, evidence, launch_ex) == want
    else:
        with pytest.raises(native._Refused, match=re.escape(want)):
            native.replay_pdl(declared, evidence, launch_ex)


class _FakeDriver:
    """What ``_launches`` asks of the extension: the driver's features and pointer lookups."""

    def __init__(self, launch_ex=True):
        self.launch_ex = launch_ex

    def driver_features(self):
        return {"launch_ex": self.launch_ex, "edge_data": True}

    def is_device_pointer(self, value):
        return False


def _fake_node(x_ptr, edge, attribute):
    """A captured launch as read_graph returns it: parameters (x, eps)."""
    params = x_ptr.to_bytes(8, "little") + native._EPS_BITS + b"\0" * 4
    return (0x1000, (1, 1, 1), (128, 1, 1), 0, params, [0, 8], [8, 4], edge, attribute)


def test_a_recorded_pdl_launch_is_kept_with_its_flag():
    """CPU twin of the replay with the attribute: the table's launch carries its PDL flag."""
    (launch,) = native._launches(_FakeDriver(), [_fake_node(0xA000, 1, -1)], {0xA000: native.X}, set(), True)
    assert launch[6] == [native.X, native.EPS] and launch[7] is True
    (launch,) = native._launches(_FakeDriver(), [_fake_node(0xA000, 0, -1)], {0xA000: native.X}, set(), True)
    assert launch[7] is False


@pytest.mark.parametrize("driver,node,declared,reason", [
    (_FakeDriver(launch_ex=False), (1, -1), True, "no cuLaunchKernelEx"),
    (_FakeDriver(), (-1, -1), True, "cannot be established"),
    (_FakeDriver(), (1, -1), False, "does not declare"),
])
def test_a_pdl_launch_that_cannot_be_replayed_as_recorded_is_refused(driver, node, declared, reason):
    """CPU twin of the refusal: the recording raises with the reason ``refusals()`` keeps."""
    with pytest.raises(native._Refused, match=reason):
        native._launches(driver, [_fake_node(0xA000, *node)], {0xA000: native.X}, set(), declared)


# -- the compiled extension (builds without a GPU) ----------------------------------------------
def test_the_replay_passes_programmatic_serialization_to_cuLaunchKernelEx(mod):
    """The CUlaunchConfig a PDL replay hands cuLaunchKernelEx, read at cuda.h's (CUDA 13.0) offsets:
    the launch's shape and stream, one attribute, CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    (6) with programmaticStreamSerializationAllowed = 1."""
    import struct

    config, attr = mod.pdl_launch_config([3, 2, 1], [256, 1, 1], 4096, 0xBEEF)
    assert len(config) == 56 and len(attr) == 72
    assert struct.unpack_from("<7I", config, 0) == (3, 2, 1, 256, 1, 1, 4096)
    assert struct.unpack_from("<Q", config, 32)[0] == 0xBEEF  # hStream
    assert struct.unpack_from("<I", config, 48)[0] == 1  # numAttrs
    assert struct.unpack_from("<i", attr, 0)[0] == 6  # id
    assert struct.unpack_from("<i", attr, 8)[0] == 1  # value.programmaticStreamSerializationAllowed


def _cuda_header() -> Path | None:
    import os

    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.append(str(Path(nvcc).resolve().parents[1]))
    roots += sorted(str(p) for p in Path("/usr/local").glob("cuda*"))
    for root in roots:
        if root and (Path(root) / "include" / "cuda.h").is_file():
            return Path(root) / "include" / "cuda.h"
    return None


LAYOUT_PROBE = r"""
#include <cuda.h>
#include <cstddef>
#include <cstdio>
int main() {
  std::printf("%zu %zu %zu %zu %zu %zu %zu %zu %zu %d %d %zu\n", sizeof(CUlaunchConfig),
              offsetof(CUlaunchConfig, gridDimX), offsetof(CUlaunchConfig, sharedMemBytes),
              offsetof(CUlaunchConfig, hStream), offsetof(CUlaunchConfig, numAttrs), sizeof(CUlaunchAttribute),
              offsetof(CUlaunchAttribute, id), offsetof(CUlaunchAttribute, value),
              offsetof(CUlaunchAttributeValue, programmaticStreamSerializationAllowed),
              (int)CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, (int)CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC,
              offsetof(CUgraphEdgeData, type));
}
"""


def test_the_replay_config_matches_cuda_h(mod, tmp_path):
    """The hand-declared structs and enum values of driver.cpp, against the installed toolkit's cuda.h."""
    import struct

    header, compiler = _cuda_header(), shutil.which("c++") or shutil.which("g++")
    if header is None or compiler is None:
        pytest.skip("needs a CUDA toolkit's cuda.h and a C++ compiler")
    (tmp_path / "probe.cpp").write_text(LAYOUT_PROBE)
    subprocess.run([compiler, f"-I{header.parent}", "probe.cpp", "-o", "probe"], cwd=tmp_path, check=True,
                   capture_output=True)
    out = subprocess.run([str(tmp_path / "probe")], capture_output=True, text=True, check=True).stdout.split()
    (cfg_size, grid_at, smem_at, stream_at, num_at, attr_size, id_at, value_at, allowed_at, attr_id, edge_type,
     edge_type_at) = map(int, out)
    config, attr = mod.pdl_launch_config([3, 2, 1], [256, 1, 1], 4096, 0xBEEF)
    assert (len(config), len(attr)) == (cfg_size, attr_size)
    assert struct.unpack_from("<7I", config, grid_at) == (3, 2, 1, 256, 1, 1, 4096)
    assert smem_at == grid_at + 24
    assert struct.unpack_from("<Q", config, stream_at)[0] == 0xBEEF
    assert struct.unpack_from("<I", config, num_at)[0] == 1
    assert struct.unpack_from("<i", attr, id_at)[0] == attr_id
    assert struct.unpack_from("<i", attr, value_at + allowed_at)[0] == 1
    source = native.SOURCE.with_name("driver.cpp").read_text()
    assert f"kAttrProgrammatic = {attr_id};" in source and f"kEdgeProgrammatic = {edge_type};" in source
    assert edge_type_at == 2  # EdgeData's third byte, as driver.cpp declares it


def _table(mod):
    return mod.PlanTable(NormOutputs, False, True, 1e-6, torch.Tensor, None, 8, native.pdl_state())


def test_a_table_refuses_a_pdl_launch_it_cannot_replay_with_its_attribute(mod):
    """CPU twin of the refusal, in C++: a driver without cuLaunchKernelEx (none here) takes no PDL launch."""
    if mod.driver_features()["launch_ex"]:
        pytest.skip("this driver has cuLaunchKernelEx")
    table = _table(mod)
    x = torch.randn(2, 8)
    launch = (0x1000, (1, 1, 1), (32, 1, 1), 0, b"\0" * 8, [0], [-1])
    with pytest.raises(RuntimeError, match="no cuLaunchKernelEx"):
        table.add(x, None, None, 0, [launch + (True,)], [])
    with pytest.raises(RuntimeError) as plain:
        table.add(x, None, None, 0, [launch + (False,)], [])
    assert "cuLaunchKernelEx" not in str(plain.value)  # a plain launch meets only the missing driver
    assert len(table) == 0


def test_a_table_reads_the_pdl_switch(mod):
    """A table made under one generation of the switch is no longer current after a change."""
    table = _table(mod)
    assert table.current()
    with pdl.forced(not pdl.switched_on()):
        assert not table.current()
        assert _table(mod).current()
    assert not table.current()  # put back is another change: recorded again
    assert table(torch.randn(2, 8), None, None, None) is None


def test_the_switch_state_is_what_tables_read():
    state = native.pdl_state()
    before = state["generation"]
    with pdl.forced(not pdl.switched_on()):
        assert state["generation"] == pdl.generation() != before


# -- the call path's caches (CPU) ---------------------------------------------------------------
def _plain_kernels():
    out = [registry.get("rms_norm", "torch", "eager")]
    for op in ("rms_norm", "layer_norm"):
        k = registry.get(op, "triton", "rowwise")
        if k.unavailable() is None:
            out.append(k)
    return out


DEVICE = "cuda" if GPU else "cpu"


@pytest.fixture
def validations(monkeypatch):
    """Counts the calls that validate."""
    count = [0]
    validate = base.validate_inputs

    def counting(*args, **kwargs):
        count[0] += 1
        return validate(*args, **kwargs)

    monkeypatch.setattr(base, "validate_inputs", counting)
    return count


@pytest.mark.parametrize("target", _plain_kernels(), ids=lambda k: f"{k.op}-{k.name}")
def test_plans_are_dropped_when_the_pdl_switch_changes(target, validations):
    """A plan made under one position of the switch (Triton's holds the compiled kernel and its
    launch_pdl) is not run after a change: the next call validates and plans again."""
    kernel = target
    callpath.forget(kernel)
    x = torch.randn(4, 64, device=DEVICE)
    w = torch.randn(64, device=DEVICE)
    want = kernel(x, w, None, 1e-5)
    kernel(x, w, None, 1e-5)
    assert validations[0] == 1 and callpath.state(kernel)["signatures"] == 1
    with pdl.forced(not pdl.switched_on()):
        got = kernel(x, w, None, 1e-5)
        assert validations[0] == 2  # the switch changed: validated again
        kernel(x, w, None, 1e-5)
        assert validations[0] == 2  # and planned again under the new position
    kernel(x, w, None, 1e-5)
    assert validations[0] == 3
    assert torch.equal(got.y, want.y)


class _StaleTable:
    """Stands in for a native table."""


def test_the_native_table_is_dropped_when_the_pdl_switch_changes():
    """A call path whose native table was recorded under another position of the switch drops it
    with its plans (NormKernel.__call__ asks the table first: it then serves nothing, see above)."""
    kernel = registry.get("rms_norm", "torch", "eager")
    x = torch.randn(4, 64)
    path = callpath.CallPath(kernel)
    path.remember(x, x, None, None, base.spec_of(kernel.op, x, "cpu", None, None))
    path.native = table = _StaleTable()
    assert path.fast(x, None, None, 1e-5) is not None and path.native is table
    with pdl.forced(not pdl.switched_on()):
        assert path.fast(x, None, None, 1e-5) is None
        assert path.native is None and not path.plans
        path.remember(x, x, None, None, base.spec_of(kernel.op, x, "cpu", None, None))
        assert path.fast(x, None, None, 1e-5) is not None  # planned again under the new position


def test_a_recording_across_a_switch_change_is_refused(monkeypatch):
    """The launches were captured under one position and the table would serve them under another."""
    kernel = registry.get("rms_norm", "torch", "eager")

    class Path:
        native = None

    Path.kernel = kernel

    def capture(*args):
        pdl.set_switch(not pdl.switched_on())
        return [], []

    before = pdl.switched_on()
    monkeypatch.setattr(native, "module", lambda: _FakeDriver())
    monkeypatch.setattr(native, "_capture", capture)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    try:
        native.record(Path, torch.randn(2, 8), None, None, None)
    finally:
        pdl.set_switch(before)
    assert "switch changed" in native._refusals.pop(kernel.name)
    assert Path.native is None


# -- on the GPU ----------------------------------------------------------------------------------
def _bits_equal(a, b):
    for name in ("y", "mean", "rstd"):
        ta, tb = getattr(a, name), getattr(b, name)
        assert (ta is None) == (tb is None), name
        if ta is not None:
            assert torch.equal(ta, tb), name


def _decode_call(op="rms_norm"):
    import impls.triton as triton_api

    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    kernel = triton_api.dispatch._variant(op, "auto")
    return kernel, x, w


@pytest.mark.skipif(_pdl_gpu_reason() is not None, reason=str(_pdl_gpu_reason()))
def test_a_pdl_launch_is_replayed_with_its_attribute():
    """Triton's decode setting launches with PDL: the table replays it with the attribute, and
    after pdl.forced(False) the next recording replays it without, both with the validated bits."""
    assert native.wait(600) is not None, native.status()
    kernel, x, w = _decode_call()
    for on in (True, False):
        with pdl.forced(on):
            callpath.forget(kernel)
            for _ in range(3):
                got = kernel(x, w, None, 1e-6)
            table = callpath.native_table(kernel)
            assert table is not None and len(table), native.refusals().get(kernel.name)
            flags = [f for plan in table.pdl_flags() for f in plan]
            assert any(flags) if on else not any(flags), flags
            got = kernel(x, w, None, 1e-6)
            torch.cuda.synchronize()
            _bits_equal(kernel(x, w, None, 1e-6, out=kernel.allocate(x)), got)
    # A table recorded with PDL serves nothing once the switch is off.
    with pdl.forced(True):
        callpath.forget(kernel)
        for _ in range(3):
            kernel(x, w, None, 1e-6)
        table = callpath.native_table(kernel)
        assert table.current()
    with pdl.forced(False):
        assert not table.current() and table(x, w, None, 1e-6) is None


@pytest.mark.skipif(_pdl_gpu_reason() is not None, reason=str(_pdl_gpu_reason()))
def test_a_pdl_launch_is_refused_where_the_driver_cannot_replay_it(monkeypatch):
    """Without cuLaunchKernelEx (faked) a PDL launch is refused with that reason, and the calls
    keep the Python fast path with the validated bits."""
    mod = native.wait(600)
    assert mod is not None, native.status()
    monkeypatch.setattr(mod, "driver_features", lambda: {"launch_ex": False, "edge_data": True})
    kernel, x, w = _decode_call()
    with pdl.forced(True):
        callpath.forget(kernel)
        for _ in range(3):
            got = kernel(x, w, None, 1e-6)
        torch.cuda.synchronize()
        assert not callpath.state(kernel)["native"]
        assert "cuLaunchKernelEx" in native.refusals().get(kernel.name, ""), native.refusals()
        _bits_equal(kernel(x, w, None, 1e-6, out=kernel.allocate(x)), got)
    callpath.forget(kernel)
