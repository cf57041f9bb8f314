"""The correctness report's section on the fused family (impls.fused): what each fused kernel
declares, which the oracle and the guards followed in its checks (the sum its statistics are
taken on, its write conventions, its weight offsets and fp8 outputs, its scale convention and
what a NaN becomes), with the source each declaration cites."""
from __future__ import annotations


def render(records: list[dict], table) -> list[str]:
    declared: dict[tuple[str, str], dict] = {}
    for r in records:
        if r.get("declaration") and str(r.get("test", "")).startswith("test_fused"):
            declared.setdefault((r["kernel"], r["op"]), r["declaration"])
    if not declared:
        return []
    lines = ["", "## Fused kernels: what the oracle followed", "",
             "Each fused kernel's declarations (impls/fused.py), as its checks judged it: the oracle normalises the "
             "sum its statistics are declared on, the guards allow only the writes its convention names.", ""]
    rows = []
    for (kernel, op), d in sorted(declared.items()):
        rows.append([kernel, op, ", ".join(d["writes"]), d["stats_on"].replace("_", " "),
                     ", ".join(f"{o:g}" for o in d["weight_offsets"]), ", ".join(d["out_dtypes"]),
                     f"{d['scale_convention']}; NaN -> {d['fp8_nan']}", ", ".join(d["residual_dtypes"]),
                     d.get("source") or ""])
    lines += table(["kernel", "op", "writes", "statistics on", "weight offsets", "y dtypes", "fp8 scale; NaN",
                    "residual dtypes", "source"], rows)
    return lines
