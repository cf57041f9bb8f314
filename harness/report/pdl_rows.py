"""The benchmark report's rows by launch: whether a row's timed calls launched with programmatic
dependent launch (impls.pdl), the two sides of a decode comparison, the decode tables' columns per
launch, and the report's section on PDL (PDL on beside off, and the overlap)."""
from __future__ import annotations

PDL_SIDES = (("with PDL", True), ("without PDL", False))


def launched_pdl(r: dict) -> bool:
    """Whether a row's timed calls launched with PDL; a row that does not say counts as without."""
    return r.get("pdl") is True


def pdl_recorded(rows: list[dict]) -> bool:
    """Whether the run recorded PDL per row: then its decode comparisons are made side by side."""
    return any(r.get("pdl") is not None for r in rows)


def sides(rows: list[dict]) -> tuple:
    """(label, launched with PDL) of each decode comparison: both sides where the run recorded PDL,
    else one unlabelled comparison of every row (as before PDL was recorded)."""
    return PDL_SIDES if pdl_recorded(rows) else ((None, False),)


def pdl_pairs(rows: list[dict]) -> list[dict]:
    """The first pass's decode rows of a kernel timed both ways, PDL on beside PDL off, per shape
    (a fused row's case, else its op) and kernel; overlap_s is off - on."""
    at: dict[tuple, dict] = {}
    for r in rows:
        if r["regime"] == "decode" and r["repeat"] == 0 and r.get("pdl") is not None:
            key = (r.get("case") or r["op"], r["dtype"], r["m"], r["n"], r["kernel"])
            at.setdefault(key, {})[bool(r["pdl"])] = r
    return [{"case": key[0], "dtype": key[1], "m": key[2], "n": key[3], "kernel": key[4],
             "on_s": both[True]["median_s"], "off_s": both[False]["median_s"],
             "overlap_s": both[False]["median_s"] - both[True]["median_s"]}
            for key, both in sorted(at.items()) if len(both) == 2]


def pdl_columns(rows: list[dict]) -> list[dict]:
    """``rows`` (one decode table's) with a kernel timed both ways named by its launch, ``k (PDL)``
    and ``k (no PDL)``, so a table keyed by kernel shows both; every other row as it is."""
    both = {r["kernel"] for r in rows if launched_pdl(r)} & {r["kernel"] for r in rows if r.get("pdl") is False}
    return [dict(r, kernel=f"{r['kernel']} ({'PDL' if launched_pdl(r) else 'no PDL'})") if r["kernel"] in both else r
            for r in rows]


def render_pdl(rows: list[dict]) -> list[str]:
    """Which kernels launched with PDL, and at decode each one's time with PDL on and off."""
    if not pdl_recorded(rows):
        return []
    launched = sorted({r["kernel"] for r in rows if launched_pdl(r)})
    lines = ["### Programmatic dependent launch", "",
             ("Launched with PDL in this run: " + ", ".join(f"`{k}`" for k in launched)
              + " (their PDL-on rows); every other row ran without it."
              if launched else "No row launched with PDL in this run (each PDL-on timing is skipped with its reason, "
              "*Skipped*): the decode targets' *with PDL* side has no rows.")
             + " At decode a kernel that can launch with PDL is timed both ways: in the CUDA graph of back-to-back "
             "calls that times a decode shape, PDL starts each call while the one before it finishes, an overlap "
             "a model's step (other kernels between two norms) does not give. *overlap* (off - on) is the time a "
             "call saves by it here. The bandwidth rows are timed once, as each kernel launches by default.", ""]
    pairs = pdl_pairs(rows)
    if pairs:
        lines += ["| case | dtype | M x N | kernel | PDL on µs | PDL off µs | overlap: off - on |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {p['case']} | {p['dtype']} | {p['m']} x {p['n']} | {p['kernel']} | {p['on_s'] * 1e6:.2f} | "
                  f"{p['off_s'] * 1e6:.2f} | {p['overlap_s'] * 1e6:+.2f} µs "
                  f"({100 * p['overlap_s'] / p['off_s']:+.0f}%) |" for p in pairs]
        lines.append("")
    return lines


def labelled(label: str | None, gaps: list[str]) -> list[str]:
    return [f"{label}: {g}" for g in gaps] if label else gaps


def unjudged(mine: bool, peer: bool) -> str | None:
    """Why a decode side is not judged: no peer ran on that side (none launches with PDL there,
    say), or nothing ran on it. A side where a peer ran and no project kernel did is a gap."""
    if mine and not peer:
        return "not judged: no peer ran"
    return "not judged: nothing ran" if not mine and not peer else None


def judged_gaps(sides: dict) -> list[str] | None:
    """The gaps of a decode shape's judged sides, labelled; None where no side is judged (the
    shape is left out, as where no peer ran at all)."""
    judged = {label: side for label, side in sides.items() if not side.get("note")}
    if not judged:
        return None
    return [g for label, side in judged.items() for g in labelled(label, side["gaps"])]
