"""The long-row probe's candidates (tools/long_row_candidates.py) as an outside backend, so that the
whole correctness catalogue (row tails, strided rows, padded N, rows above 2^31 elements,
determinism, batch invariance, fuzz) runs on a candidate before it is adopted:

    pytest harness --profile full --backend-file tools/candidate_backend.py --backend 'candidate_*'

Every probe candidate whose label matches NORMDIFF_CANDIDATES (a regular expression; default
DEFAULT, the candidates built and not yet measured) registers for its op as a backend of its own,
``candidate_<label as a name>``, with the variant it varies (TileLang's plans and Triton's
kernels are chosen by variant), e.g. candidate_tilelang_layer_norm_cluster_8_rows_in_turn
.layer_norm_cluster. The kernels are the probe's own objects (the registered kernels with
another plan or launch setting), so they run, refuse and skip as those do: on a GPU only.
"""
from __future__ import annotations

import os
import re

from impls import registry
from tools.long_row_candidates import candidates

DEFAULT = r"( L2 ahead [12]| L2 only| rows in turn| cluster<=16 2 rows| wb ahead 2| 3 blocks an SM)"


def backend_name(label: str) -> str:
    """A probe label as a backend name: candidate_, then the label in lower case with runs of
    other characters as one underscore."""
    return "candidate_" + re.sub(r"[^a-z0-9]+", "_", label.lower()).strip("_")


def register_candidates(pattern: str) -> list[str]:
    """Register every candidate of either op whose label matches ``pattern``; their names."""
    registry.load_builtins()
    names = []
    for op in ("rms_norm", "layer_norm"):
        for _, label, make in candidates(op):
            if not re.search(pattern, label):
                continue
            kernel = make()
            kernel.backend = backend_name(label)
            registry.register(kernel)
            names.append(kernel.name)
    return names


register_candidates(os.environ.get("NORMDIFF_CANDIDATES") or DEFAULT)
