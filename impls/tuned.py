"""Tuned launch settings as data: each compiled backend keeps the settings a sweep measured
fastest in a TOML file beside it (e.g. impls/triton/tuned_h200.toml), one row per setting with
its evidence as ``source = "path@commit"``, so a sweep file deleted from the tree stays citable
(``git show commit:path``)."""
from __future__ import annotations

import re
import tomllib
from functools import lru_cache
from pathlib import Path

SOURCE = re.compile(r"^[\w./-]+@[0-9a-f]{7,40}$")


@lru_cache(maxsize=None)
def load(path: Path) -> dict[str, list[dict]]:
    """Every table of a tuned-settings file; a row without a well-formed source is an error."""
    with open(path, "rb") as f:
        tables = tomllib.load(f)
    for name, rows in tables.items():
        for row in rows:
            if not SOURCE.match(str(row.get("source", ""))):
                raise ValueError(f"{path.name}: a row of [{name}] needs source = 'path@commit': {row}")
    return tables


def table(path: Path, name: str, key: tuple[str, ...], value: tuple[str, ...] | str, optional: dict | None = None,
          **where) -> dict:
    """Rows of table ``name`` as {key fields: value field(s)}, for the rows whose fields equal
    ``where`` (a field given as None must be absent from the row). ``optional`` ({field: default})
    appends fields a row may leave out to the value tuple."""
    out = {}
    for row in load(path)[name]:
        if any(row.get(field) != want for field, want in where.items()):
            continue
        k = tuple(row[f] for f in key)
        if k in out:
            raise ValueError(f"{path.name}: [{name}] has two rows for {dict(zip(key, k))}")
        if isinstance(value, str):
            out[k] = row[value]
        else:
            out[k] = tuple(row[f] for f in value) + tuple(row.get(f, d) for f, d in (optional or {}).items())
    return out
