"""A case's id, both ways, for every family: ``op-dtype-shape-dist`` then the modifiers its class
declares (``ID_PARTS``, in order), each spelled only where it differs from its default. The id is
the pytest id's case part and the seed's source, so ``from_id`` rebuilds the case, inputs and all."""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Callable

HEAD = r"(?P<op>[a-z0-9_]+)-(?P<dtype>[a-z0-9]+)-(?P<shape>[0-9x]+)-(?P<dist>[a-z0-9_]+)"


@dataclass(frozen=True)
class IdPart:
    """One modifier: how a case spells it (None: left out) and the pattern of its words (named groups),
    which ``read`` turns back into field values (given the groups that matched and the shape)."""

    spell: Callable[[object], str | None]
    pattern: str
    read: Callable[[dict, tuple[int, ...]], dict]


def spell(case) -> str:
    words = [case.op, case.dtype, "x".join(map(str, case.shape)), case.dist]
    return "-".join(words + [w for part in type(case).ID_PARTS if (w := part.spell(case))])


@functools.lru_cache(maxsize=None)
def _pattern(parts: tuple[IdPart, ...]) -> re.Pattern:
    return re.compile(HEAD + "".join(f"(?:-{p.pattern})?" for p in parts) + "$")


def from_id(cls, case_id: str):
    """The ``cls`` case whose id is ``case_id`` (ValueError where it is not one)."""
    m = _pattern(cls.ID_PARTS).match(case_id)
    if not m:
        raise ValueError(f"not a {cls.__name__} id: {case_id!r}")
    groups = m.groupdict()
    shape = tuple(int(s) for s in groups["shape"].split("x"))
    fields = {}
    for part in cls.ID_PARTS:
        fields.update(part.read(groups, shape))
    return cls(op=groups["op"], dtype=groups["dtype"], shape=shape, dist=groups["dist"], **fields)


def number(text: str | None, default=None):
    return float(text) if text else default


__all__ = ["IdPart", "from_id", "number", "spell"]
