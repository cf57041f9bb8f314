"""The peers' fused kernels (impls.fused) in the three plug-ins: each registers in the fused family
beside the plug-in's plain kernels, declares only values impls.fused defines, cites the peer's
source (file and lines), and where its library is missing is unavailable with the reason naming
it. Declarations only: nothing here imports a peer or runs a kernel."""
import importlib.util
import re
import sys
from pathlib import Path

import pytest
import torch

from impls import fused, registry
from impls.inputs import dtype_name

ROOT = Path(__file__).resolve().parents[1]
FILES = {"flashinfer": ROOT / "examples" / "flashinfer_backend.py", "quack": ROOT / "examples" / "quack_backend.py",
         "liger": ROOT / "examples" / "liger_backend.py"}
# The module each plug-in imports first (its availability reason names it where it is missing).
LIBRARY = {"flashinfer": "flashinfer", "quack": "quack", "liger": "liger_kernel"}
FUSED = {
    "flashinfer": {("add_rms_norm", "fused_add"), ("add_rms_norm", "fused_add_quant"), ("rms_norm", "gemma"),
                   ("add_rms_norm", "gemma_fused_add"), ("rms_norm", "quant"), ("layer_norm", "layernorm_quant")},
    "quack": {("add_rms_norm", "residual"), ("rms_norm", "offset")},
    "liger": {("add_rms_norm", "fused_add")},
}
PLAIN = {"flashinfer": {("rms_norm", "default"), ("layer_norm", "default")},
         "quack": {(op, v) for op in ("rms_norm", "layer_norm") for v in ("default", "tuned")},
         "liger": {("rms_norm", "fused"), ("layer_norm", "fused")}}
# What each call really does (the plug-ins' comments cite the lines): writes, stats, offsets, fp8.
EXPECTED = {
    ("flashinfer", "fused_add"): dict(writes=("in_place",), stats_on="float32_sum", weight_offsets=(0.0,)),
    ("flashinfer", "gemma_fused_add"): dict(writes=("in_place",), stats_on="float32_sum", weight_offsets=(1.0,)),
    ("flashinfer", "fused_add_quant"): dict(writes=("out_y",), stats_on="float32_sum", out_dtypes=fused.FP8_DTYPES,
                                            scale_convention="divide"),
    ("flashinfer", "gemma"): dict(writes=("new",), weight_offsets=(1.0,), out_dtypes=(None,)),
    ("flashinfer", "quant"): dict(writes=("new",), out_dtypes=fused.FP8_DTYPES, scale_convention="divide"),
    ("flashinfer", "layernorm_quant"): dict(out_dtypes=fused.FP8_DTYPES, scale_convention="divide", fp8_nan="-max",
                                            dtypes=(torch.bfloat16,)),
    ("quack", "residual"): dict(writes=("new",), stats_on="float32_sum", weight_offsets=(0.0, 1.0),
                                outputs=("y", "residual_out", "rstd")),
    ("quack", "offset"): dict(writes=("new",), weight_offsets=(0.0, 1.0), outputs=("y", "rstd")),
    ("liger", "fused_add"): dict(writes=("new",), stats_on="rounded_sum", weight_offsets=(0.0, 1.0),
                                 residual_dtypes=("same",), outputs=("y", "residual_out", "rstd")),
}
BACKWARD = {("quack", "residual"), ("quack", "offset"), ("liger", "fused_add")}
CITATION = re.compile(r"[\w/]+\.(py|cu|cuh):\d+")


def fused_kernels(backend: str):
    registry.load_file(FILES[backend])
    return registry.kernels([backend], family="fused")


def library_missing(backend: str) -> bool:
    try:
        return importlib.util.find_spec(LIBRARY[backend]) is None
    except (ImportError, ValueError):
        return True


@pytest.mark.parametrize("backend", sorted(FILES))
def test_fused_kernels_register_beside_the_plain_ones(backend):
    assert {(k.op, k.variant) for k in fused_kernels(backend)} == FUSED[backend]
    assert {(k.op, k.variant) for k in registry.kernels([backend])} == PLAIN[backend]  # the plain family's, as before
    assert sys.modules[registry.plugin_module(FILES[backend])].__file__ == str(FILES[backend])


@pytest.mark.parametrize("backend", sorted(FILES))
def test_declarations_are_values_of_the_fused_interface(backend):
    names = {dtype_name(d) for d in fused.FP8_DTYPES} | {"float32", "float16", "bfloat16"}
    for k in fused_kernels(backend):
        assert isinstance(k, fused.FusedNormKernel) and k.family == "fused" and k.op in fused.FUSED_OPS
        assert k.devices == ("cuda",) and k.packages and k.call_name and not k.project
        assert k.writes and set(k.writes) <= set(fused.WRITES)
        assert k.op in fused.ADD_OPS or k.writes == ("new",)
        assert k.stats_on in fused.STATS_ON
        assert k.scale_convention in fused.SCALE_CONVENTIONS and k.fp8_nan in fused.FP8_NAN
        assert k.weight_offsets and set(k.weight_offsets) <= {0.0, 1.0}
        assert fused.BASE_OP[k.op] == "rms_norm" or k.weight_offsets == (0.0,)
        assert k.out_dtypes and set(k.out_dtypes) <= {None, *fused.FP8_DTYPES}
        assert k.op != "add_layer_norm" or k.out_dtypes == (None,)
        assert k.residual_dtypes and set(k.residual_dtypes) <= {"same"} | names
        for x_dtype in k.dtypes:
            assert k.residual_out_dtype(x_dtype, x_dtype) == x_dtype
        assert k.outputs[0] == "y" and set(k.outputs) <= {"y", "residual_out", "mean", "rstd"}
        assert ("residual_out" in k.outputs) == (k.op in fused.ADD_OPS)
        declared = k.declaration()
        assert declared["fp8_nan"] == k.fp8_nan and declared["source"] == k.source
        for field, value in EXPECTED[(backend, k.variant)].items():
            assert getattr(k, field) == value, (k.name, field)
        assert k.has_backward == ((backend, k.variant) in BACKWARD), k.name


@pytest.mark.parametrize("backend", sorted(FILES))
def test_every_declaration_cites_the_peer_source(backend):
    for k in fused_kernels(backend):
        assert CITATION.search(k.source), (k.name, k.source)
        assert k.source.split("/")[0] == LIBRARY[backend], k.source  # a file of the peer's wheel


@pytest.mark.parametrize("backend", sorted(FILES))
def test_unavailable_here_with_the_missing_package_named(backend):
    if not library_missing(backend):
        pytest.skip(f"{LIBRARY[backend]} is installed here")
    for k in fused_kernels(backend):
        reason = k.unavailable()
        assert reason and LIBRARY[backend] in reason and "pip install" in reason, (k.name, reason)
        spec = fused.FusedSpec(op=k.op, dtype=k.dtypes[-1], rows=4, n=256, row_stride=256, device="cuda",
                               has_weight=True, has_bias=k.op == "layer_norm", write=k.writes[0],
                               residual_dtype=k.dtypes[-1] if k.op in fused.ADD_OPS else None,
                               weight_offset=k.weight_offsets[-1], out_dtype=k.out_dtypes[-1])
        assert k.unsupported(spec) == reason
