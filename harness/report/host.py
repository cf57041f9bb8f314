"""The benchmark report's host-inclusive section: what a call costs as a user makes it.

Each benchmark row on a GPU carries, beside its device time (``median_s``: CUDA events, launch
latency outside them), the cost of the call a user makes (``NormKernel.user_call``, named in the
row): ``host_us``, host µs per call back to back with the GPU held busy, and ``wall_us``, wall µs
per call in steady state with the host included and no graph (``harness.benchmarks.timing``). The device-time
targets (``targets.py``) stay on device time; the targets here are on these two columns:

- host µs of each project entry point (``entry_point`` rows: the project's public entry points)
  <= that of every peer that ran the shape, at every decode shape and at the bandwidth shapes of N
  in HOST_BANDWIDTH_N. Where the row carries a paired measurement (``paired``: the entry point and
  the peers' calls timed in interleaved rounds on the same inputs,
  ``harness.benchmarks.timing.paired_host_us``) the target compares those calls round by round: the median
  over the rounds of (entry point - peer) in the same round must not be above 0. The rows' own
  host µs were timed minutes apart, and the host's drift between them (several µs) is the size of
  the differences judged; and the host flips between two states about 5 µs a call apart from
  round to round, so even the two calls' medians over the rounds compare different mixtures of
  states (docs/perf-notes.md item 48). A run that kept no rounds compares those medians; a peer
  without pairs is compared by the rows. The pairing is this target's margin: the device-time
  margin t of ``targets.py`` (the spread between passes) does not apply to host time;
- wall µs <= WALL_OVER_DEVICE x device µs for each project entry point at every bandwidth shape;
- decode: wall µs within DECODE_WALL_SLACK of the cheapest peer's that ran, or better.

Every kernel that does not declare ``NormKernel.project`` is a peer; no backend is named here.
"""
from __future__ import annotations

import statistics

from harness.report.markdown import table
from harness.judging.shapes import HOST_BANDWIDTH_N

WALL_OVER_DEVICE = 1.15
DECODE_WALL_SLACK = 0.10


def judges_host(regime: str, n: int) -> bool:
    """Whether the host target judges a shape of this regime and N."""
    return regime == "decode" or (regime == "bandwidth" and n in HOST_BANDWIDTH_N)


def _first(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["repeat"] == 0 and r.get("host_us") is not None]


def _shapes(rows: list[dict]) -> dict[tuple, list[dict]]:
    out: dict[tuple, list[dict]] = {}
    for r in _first(rows):
        out.setdefault((r["regime"], r["op"], r["dtype"], r["m"], r["n"]), []).append(r)
    return out


def _host_gap(r: dict, peer: dict) -> str:
    """How entry point ``r`` misses ``peer``'s host cost, or "" where it does not: the paired
    rounds where ``r`` has them for this peer (round by round), else the paired medians, else the
    two rows' own."""
    rounds = r.get("paired_rounds") or {}
    mine, theirs = rounds.get(r["kernel"]), rounds.get(peer["kernel"])
    if mine and theirs and len(mine) == len(theirs):
        gap = statistics.median(a - b for a, b in zip(mine, theirs))
        return (f"{r['kernel']} {gap:+.1f} µs a call against {peer['kernel']} (median of {len(mine)} paired rounds)"
                if gap > 0 else "")
    paired = r.get("paired") or {}
    if r["kernel"] in paired and peer["kernel"] in paired:
        mine, theirs = paired[r["kernel"]], paired[peer["kernel"]]
        return f"{r['kernel']} {mine:.1f} µs > {peer['kernel']} {theirs:.1f} µs (paired)" if mine > theirs else ""
    if r["host_us"] > peer["host_us"]:
        return f"{r['kernel']} {r['host_us']:.1f} µs > {peer['kernel']} {peer['host_us']:.1f} µs (rows)"
    return ""


def _paired_cell(r: dict) -> str:
    paired = r.get("paired") or {}
    if r["kernel"] not in paired:
        return "-"
    others = ", ".join(f"{name} {us:.1f}" for name, us in sorted(paired.items()) if name != r["kernel"])
    return f"{paired[r['kernel']]:.1f} vs {others}" if others else f"{paired[r['kernel']]:.1f}"


def check(rows: list[dict]) -> list[dict]:
    """One entry per (shape, target) with the entry points judged and what missed."""
    out = []
    for (regime, op, dtype, m, n), rs in sorted(_shapes(rows).items()):
        ours = [r for r in rs if r["entry_point"]]
        if not ours:
            continue
        peers = sorted((r for r in rs if not r["project"]), key=lambda r: r["kernel"])
        where = f"{op} {dtype} {m} x {n}"
        if judges_host(regime, n):
            gaps = [gap for r in ours for p in peers for gap in [_host_gap(r, p)] if gap]
            out.append({"target": "host", "regime": regime, "where": where, "gaps": gaps,
                        "peers": [p["kernel"] for p in peers], "note": "" if peers else "no peer ran"})
        walls = [p for p in peers if p.get("wall_us") is not None]
        if regime == "bandwidth":
            gaps = [f"{r['kernel']} wall {r['wall_us']:.1f} µs = {r['wall_us'] / (r['median_s'] * 1e6):.2f} x device"
                    for r in ours if r["wall_us"] > WALL_OVER_DEVICE * r["median_s"] * 1e6]
            out.append({"target": "wall", "regime": regime, "where": where, "gaps": gaps, "note": ""})
        elif walls:
            ref = min(walls, key=lambda p: p["wall_us"])
            gaps = [f"{r['kernel']} wall {r['wall_us']:.1f} µs > {ref['kernel']} {ref['wall_us']:.1f} µs + "
                    f"{100 * DECODE_WALL_SLACK:.0f}%" for r in ours
                    if r["wall_us"] > (1 + DECODE_WALL_SLACK) * ref["wall_us"]]
            out.append({"target": "decode wall", "regime": regime, "where": where, "gaps": gaps,
                        "peers": [ref["kernel"]], "note": ""})
    return out


def render(rows: list[dict]) -> list[str]:
    first = _first(rows)
    if not first:
        return []
    checks = check(rows)
    lines = ["## Per-call cost, host included", "",
             "The tables above rank device time (CUDA events, launch latency kept outside them); the "
             "speed targets above use that column. Here each kernel's *user call* (the call named below, "
             "as a user makes it) is timed two more ways: **host µs**, per call of back-to-back calls "
             "with the GPU held busy (what the host pays), and **wall µs**, per call of back-to-back "
             "calls in steady state, host included, no CUDA graph, no L2 flush (what a model without "
             "a graph sees). The targets of this section use these columns. The host target compares "
             "each entry point with every peer's call that ran the shape, timed in the same interleaved "
             "rounds on the same inputs, round by round: the median over the rounds of (entry point - peer) "
             "must not be above 0 (*paired host µs* shows each call's median over the rounds), since "
             "the rows' own host µs were timed minutes apart and the host's state changes between "
             "rounds; a peer without pairs is compared by the rows. The pairing is this target's margin: "
             "the device-time margin t of the speed targets does not apply to host time.", ""]
    for target, what in (("host", "host µs of each project entry point <= every peer's that ran, "
                                  f"at every decode shape and at N {', '.join(map(str, HOST_BANDWIDTH_N))}"),
                         ("wall", f"wall µs <= {WALL_OVER_DEVICE:g} x device µs at every bandwidth shape"),
                         ("decode wall", f"decode wall µs within {100 * DECODE_WALL_SLACK:.0f}% of the "
                                         "cheapest peer's that ran, or better")):
        these = [c for c in checks if c["target"] == target]
        met = sum(not c["gaps"] for c in these)
        lines.append(f"- **{what}**: {met} of {len(these)} shapes met.")
        lines += [f"  - {c['where']}: {'; '.join(c['gaps'])}" for c in these if c["gaps"]]
        lines += [f"  - {c['where']}: {c['note']}" for c in these if c["note"]]
    lines += ["", "Calls timed:", ""]
    lines += [f"- `{k}`: `{call}`" for k, call in sorted({(r["kernel"], r["call"]) for r in first})]
    errors = sorted({(r["kernel"], r["call_error"]) for r in rows if r.get("call_error")})
    lines += [f"- `{k}`: not measured ({e})" for k, e in errors]
    lines.append("")
    by_table: dict[tuple, list[dict]] = {}
    for r in first:
        by_table.setdefault((r["regime"], r["op"], r["dtype"]), []).append(r)
    for (regime, op, dtype), rs in sorted(by_table.items()):
        lines += [f"<details><summary>{regime}, {op}, {dtype}: device, host and wall µs per call</summary>", ""]
        body = [[f"{r['m']} x {r['n']}", r["kernel"] + (" (entry point)" if r["entry_point"] else ""),
                 f"{r['median_s'] * 1e6:.1f}", f"{r['host_us']:.1f}", _paired_cell(r), f"{r['wall_us']:.1f}",
                 f"{r['wall_us'] / (r['median_s'] * 1e6):.2f}"]
                for r in sorted(rs, key=lambda r: (r["n"], r["m"], r["kernel"]))]
        lines += table(["M x N", "kernel", "device µs", "host µs", "paired host µs", "wall µs", "wall / device"], body)
        lines += ["", "</details>", ""]
    return lines


__all__ = ["check", "render"]
