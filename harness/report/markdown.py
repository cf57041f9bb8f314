"""Markdown pieces every report shares: a value as a cell, a table."""
from __future__ import annotations

import math


def fmt(v, digits=3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if math.isinf(v) or math.isnan(v):
            return str(v)
        return f"{v:.{digits}g}"
    return str(v)


def table(header: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in rows]
    return out
