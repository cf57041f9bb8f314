"""The project's speed targets, checked against one benchmark run (rows of
``harness.report.benchmark_results.results``), so every benchmark report says which are met and
by how much each is missed.

Bandwidth regime (first pass, % of the same run's copy ceiling), at M x N >= 2^26:
- N in 4000 ... 32768: the project's best kernel >= 97% for RMSNorm, >= 95% for LayerNorm; the
  best kernel of each project backend >= 92%;
- N in 1024, 2048 (M >= 32768): >= 90%; N in 65536, 131072, 262144: the best >= 90%, each
  project backend >= 85%;
- every dtype, and at every shape each project backend at least as fast as the best peer.
Decode regime: each project backend at least as fast as the best peer, like with like (below).
Backward regime (bfloat16, N in BACKWARD_TARGET_N): the project's best backward >= 85% of copy and
at least as fast as the backward of every peer that ran.
Fused ops (rows of ``family`` "fused", one target per case: op, write convention, fp8 output, ...):
at the bandwidth shapes (M x N >= 2^26) the best project fused kernel >= FUSED_TARGET_PCT of copy
and at least as fast as the best peer; at decode shapes the best project fused kernel at least as
fast as the best peer.

Programmatic dependent launch (``impls.pdl``; each row's ``pdl``): at decode a kernel that can
launch with PDL is timed with it on and off, and in a graph of back-to-back calls PDL overlaps one
call with the next, which a model's step (other kernels between two norms) does not give. So the
decode comparisons are like with like: the rows launched with PDL against the peers' rows launched
with PDL, and the rows without against the peers' rows without (peers that cannot launch with PDL
count there). A shape meets its decode target when every side judged holds; a side where no peer
ran (no LayerNorm peer launches with PDL) is shown and not judged, a side where a peer ran and no
project kernel did is a gap, and a shape with no side judged is left out. Rows that do not record ``pdl`` (reports from before it) count as
without, and a run where no row records it is judged as before, one comparison per shape.

"At least as fast" is: median <= the peer's median x (1 + t), t the margin of the two kernels
compared (``margin``): the larger of their spreads between the benchmark's passes (the largest
move of a median from the first pass over the bandwidth shapes both passes timed, as the report's
repeatability table gives it), capped at MARGIN_CAP; 0 where one pass ran. Each comparison
prints its t.

The project's kernels are those that declare ``NormKernel.project`` (each row says so); every
other kernel that ran is a peer: no backend is named here.
"""
from __future__ import annotations

from harness.report.benchmark_results import fused_rows, plain_rows, repeatability
from harness.report.pdl_rows import judged_gaps, launched_pdl, render_pdl, sides as _sides, unjudged
from harness.judging.shapes import (BACKWARD_TARGET_N, BANDWIDTH_ELEMENTS, TARGET_LONG_N, TARGET_MID_N,
                            TARGET_SHORT_MIN_M, TARGET_SHORT_N)


def thresholds(op: str, m: int, n: int) -> tuple[float, float] | None:
    """(best project kernel, each project backend) in % of copy, or None: no target here."""
    if m * n < BANDWIDTH_ELEMENTS:
        return None
    if n in TARGET_MID_N:
        return (97.0 if op == "rms_norm" else 95.0), 92.0
    if n in TARGET_SHORT_N and m >= TARGET_SHORT_MIN_M:
        return 90.0, 90.0
    if n in TARGET_LONG_N:
        return 90.0, 85.0
    return None


BACKWARD_TARGET_PCT = 85.0
FUSED_TARGET_PCT = 95.0  # the best project fused kernel at the bandwidth shapes
MARGIN_CAP = 0.02  # the most the spread between passes may excuse


def pass_spreads(rows: list[dict]) -> dict[str, float]:
    """Per kernel: |largest move of a median from the first pass| over the bandwidth shapes a later
    pass timed again; empty where one pass ran."""
    return {e["kernel"]: abs(e["max_move"]) for e in repeatability(rows)}


def margin(spreads: dict[str, float], mine: str, peer: str) -> float:
    """t for comparing kernel ``mine`` with kernel ``peer``: the larger of their spreads between
    passes, at most MARGIN_CAP; 0 for a kernel no second pass timed (nothing measured)."""
    return min(MARGIN_CAP, max(spreads.get(mine, 0.0), spreads.get(peer, 0.0)))


def as_fast(mine: dict, peer: dict, t: float) -> bool:
    """Whether row ``mine`` is at least as fast as row ``peer``: median <= peer's x (1 + t)."""
    return mine["median_s"] <= peer["median_s"] * (1 + t)


def t_text(t: float) -> str:
    return f"t {100 * t:.2f}%"


def _backend(kernel: str) -> str:
    return kernel.split(".", 1)[0]


def project_backends(rows: list[dict]) -> list[str]:
    """The backends whose kernels are the project's, as the run's rows declare."""
    return sorted({_backend(r["kernel"]) for r in rows if r.get("project")})


def _by_shape(rows: list[dict], regime: str) -> dict[tuple, list[dict]]:
    """The plain norms' first-pass rows of a regime by (op, dtype, M, N)."""
    shapes: dict[tuple, list[dict]] = {}
    for r in plain_rows(rows):
        if r["regime"] == regime and r["repeat"] == 0:
            shapes.setdefault((r["op"], r["dtype"], r["m"], r["n"]), []).append(r)
    return shapes


def _by_case(rows: list[dict], regime: str) -> dict[tuple, list[dict]]:
    """The fused ops' first-pass rows of a regime by (op, case, dtype, M, N)."""
    shapes: dict[tuple, list[dict]] = {}
    for r in fused_rows(rows):
        if r["regime"] == regime and r["repeat"] == 0:
            shapes.setdefault((r["op"], r["case"], r["dtype"], r["m"], r["n"]), []).append(r)
    return shapes


def _best(rows: list[dict], key, pick):
    return pick(rows, key=key) if rows else None


def bandwidth(rows: list[dict]) -> list[dict]:
    out, spreads = [], pass_spreads(rows)
    for (op, dtype, m, n), rs in sorted(_by_shape(rows, "bandwidth").items(), key=lambda kv: (kv[0][:2], kv[0][3])):
        limits = thresholds(op, m, n)
        rs = [r for r in rs if r["pct"] is not None]
        if limits is None or not rs:
            continue
        best_target, each_target = limits
        project = {b: _best([r for r in rs if r.get("project") and _backend(r["kernel"]) == b], lambda r: r["pct"], max)
                   for b in project_backends(plain_rows(rows))}
        project = {b: r for b, r in project.items() if r}
        peer = _best([r for r in rs if not r.get("project")], lambda r: r["pct"], max)
        gaps, ts = [], {}
        best = max((r["pct"] for r in project.values()), default=None)
        if best is None:
            gaps.append("no project kernel ran")
        elif best < best_target:
            gaps.append(f"best {best:.1f}% < {best_target:.0f}%")
        for b, r in project.items():
            if r["pct"] < each_target:
                gaps.append(f"{b} {r['pct']:.1f}% < {each_target:.0f}%")
            if peer:
                ts[b] = t = margin(spreads, r["kernel"], peer["kernel"])
                if not as_fast(r, peer, t):
                    gaps.append(f"{b} {r['pct']:.1f}% < {peer['kernel']} {peer['pct']:.1f}% ({t_text(t)})")
        out.append({"op": op, "dtype": dtype, "m": m, "n": n, "best": best, "targets": limits,
                    "project": {b: (r["kernel"], r["pct"]) for b, r in project.items()},
                    "peer": (peer["kernel"], peer["pct"]) if peer else None, "t": ts, "gaps": gaps})
    return out


def _decode_side(rs: list[dict], backends: list[str], spreads: dict) -> dict:
    """One decode comparison on rows ``rs`` (one side): each project backend's fastest row against
    the fastest peer row; a side without either is a gap."""
    project = {b: _best([r for r in rs if r.get("project") and _backend(r["kernel"]) == b], lambda r: r["median_s"], min)
               for b in backends}
    project = {b: r for b, r in project.items() if r}
    peer = _best([r for r in rs if not r.get("project")], lambda r: r["median_s"], min)
    ts = {b: margin(spreads, r["kernel"], peer["kernel"]) for b, r in project.items()} if peer else {}
    gaps = ([] if not peer else ["no project kernel ran"]) if not project else [] if not peer else [
        f"{b} {r['median_s'] * 1e6:.2f} µs > {peer['kernel']} {peer['median_s'] * 1e6:.2f} µs ({t_text(ts[b])})"
        for b, r in project.items() if not as_fast(r, peer, ts[b])]
    return {"project": {b: (r["kernel"], r["median_s"]) for b, r in project.items()},
            "peer": peer and (peer["kernel"], peer["median_s"]), "t": ts, "gaps": gaps,
            "note": unjudged(bool(project), bool(peer))}


def decode(rows: list[dict]) -> list[dict]:
    """Per decode shape where a project kernel and a peer ran: each side's comparison (``sides``,
    by label; the last, without PDL, also at the top level) and every side's gaps."""
    out, spreads, backends = [], pass_spreads(rows), project_backends(plain_rows(rows))
    for (op, dtype, m, n), rs in sorted(_by_shape(rows, "decode").items(), key=lambda kv: (kv[0][:2], kv[0][3], kv[0][2])):
        if not any(r.get("project") for r in rs) or all(r.get("project") for r in rs):
            continue
        sides = {label: _decode_side([r for r in rs if launched_pdl(r) == on], backends, spreads)
                 for label, on in _sides(rows)}
        gaps = judged_gaps(sides)
        if gaps is None:
            continue
        out.append({"op": op, "dtype": dtype, "m": m, "n": n, **list(sides.values())[-1], "gaps": gaps, "sides": sides})
    return out


def backward(rows: list[dict]) -> list[dict]:
    """Per backward target shape: the best project backward against BACKWARD_TARGET_PCT and
    against every peer whose backward ran there (each with its t)."""
    out, spreads = [], pass_spreads(rows)
    for (op, dtype, m, n), rs in sorted(_by_shape(rows, "backward").items()):
        if dtype != "bfloat16" or n not in BACKWARD_TARGET_N:
            continue
        rs = [r for r in rs if r["pct"] is not None]
        best = _best([r for r in rs if r.get("project")], lambda r: r["pct"], max)
        peers = sorted((r for r in rs if not r.get("project")), key=lambda r: r["kernel"])
        gaps, ts = [], {}
        if best is None:
            gaps.append("no project backward ran")
        else:
            if best["pct"] < BACKWARD_TARGET_PCT:
                gaps.append(f"best {best['pct']:.1f}% < {BACKWARD_TARGET_PCT:.0f}%")
            for r in peers:
                ts[r["kernel"]] = t = margin(spreads, best["kernel"], r["kernel"])
                if not as_fast(best, r, t):
                    gaps.append(f"{best['kernel']} {best['pct']:.1f}% < {r['kernel']} {r['pct']:.1f}% ({t_text(t)})")
        out.append({"op": op, "dtype": dtype, "m": m, "n": n, "best": best and (best["kernel"], best["pct"]),
                    "peers": [(r["kernel"], r["pct"]) for r in peers], "t": ts, "gaps": gaps})
    return out


def _fused_side(rs: list[dict], regime: str, spreads: dict, peer_needed: bool = False) -> dict:
    """One fused comparison on rows ``rs``: the best project fused kernel against FUSED_TARGET_PCT
    (bandwidth) and against the best peer; ``peer_needed``: a side without a peer row is a gap."""
    mine = [r for r in rs if r.get("project")]
    best = _best(mine, lambda r: r["median_s"], min)
    peer = _best([r for r in rs if not r.get("project")], lambda r: r["median_s"], min)
    backends = {b: _best([r for r in mine if _backend(r["kernel"]) == b], lambda r: r["median_s"], min)
                for b in sorted({_backend(r["kernel"]) for r in mine})}
    gaps, t = [], None
    if best is None:
        gaps.append("no project fused kernel ran")
    else:
        if regime == "bandwidth" and (best["pct"] is None or best["pct"] < FUSED_TARGET_PCT):
            gaps.append(f"best {best['pct'] or 0:.1f}% < {FUSED_TARGET_PCT:.0f}%")
        if peer:
            t = margin(spreads, best["kernel"], peer["kernel"])
            if not as_fast(best, peer, t):
                gaps.append(f"{best['kernel']} {_figure(best, regime)} > {peer['kernel']} "
                            f"{_figure(peer, regime)} ({t_text(t)})" if regime == "decode" else
                            f"{best['kernel']} {_figure(best, regime)} < {peer['kernel']} "
                            f"{_figure(peer, regime)} ({t_text(t)})")
    if best is None and regime == "decode" and not peer:
        gaps = []
    return {"best": best and (best["kernel"], _figure(best, regime)),
            "backends": {b: (r["kernel"], _figure(r, regime)) for b, r in backends.items()},
            "peer": peer and (peer["kernel"], _figure(peer, regime)), "t": t, "gaps": gaps,
            "note": unjudged(best is not None, peer is not None) if peer_needed else None}


def fused(rows: list[dict]) -> list[dict]:
    """Per fused case and shape, first pass: at the bandwidth shapes the best project fused kernel
    (the fastest) >= FUSED_TARGET_PCT of copy, and at the bandwidth and decode shapes at least as fast
    as the best peer that ran (margin t); at decode each side apart (``sides``: with PDL, without;
    the last also at the top level), as ``decode``. A decode shape where no project kernel or no
    peer ran is not judged; a bandwidth shape without a project kernel is a gap. Each project
    backend's fastest kernel is shown beside, not judged."""
    out, spreads = [], pass_spreads(rows)
    for regime in ("bandwidth", "decode"):
        for (op, case, dtype, m, n), rs in sorted(_by_case(rows, regime).items()):
            judged = regime == "decode" or m * n >= BANDWIDTH_ELEMENTS
            mine = [r for r in rs if r.get("project")]
            peers = [r for r in rs if not r.get("project")]
            if not judged or (regime == "decode" and (not mine or not peers)):
                continue
            sides = ({label: _fused_side([r for r in rs if launched_pdl(r) == on], regime, spreads, True)
                      for label, on in _sides(rows)} if regime == "decode" else {None: _fused_side(rs, regime, spreads)})
            gaps = judged_gaps(sides)
            if gaps is None:
                continue
            out.append({"regime": regime, "op": op, "case": case, "title": rs[0].get("title") or case,
                        "dtype": dtype, "m": m, "n": n, **list(sides.values())[-1], "gaps": gaps, "sides": sides})
    return out


def _figure(r: dict, regime: str) -> str:
    """A row's figure in a fused target: % of copy (bandwidth), µs per call (decode)."""
    if regime == "decode" or r["pct"] is None:
        return f"{r['median_s'] * 1e6:.2f} µs"
    return f"{r['pct']:.1f}%"


def _render_fused(fz: list[dict]) -> list[str]:
    bw = [t for t in fz if t["regime"] == "bandwidth"]
    dc = [t for t in fz if t["regime"] == "decode"]
    met = lambda ts: sum(not t["gaps"] for t in ts)  # noqa: E731
    lines = ["### Fused ops", "",
             f"Bandwidth shapes: **{met(bw)} of {len(bw)}** meet every target (the best project fused kernel "
             f">= {FUSED_TARGET_PCT:.0f}% of copy and at least as fast as the best peer); decode: **{met(dc)} of "
             f"{len(dc)}** with the best project fused kernel at least as fast as the best peer. One target per op "
             "and call (write convention, fp8 output, ...): kernels are compared only on the same call. Each "
             "project backend's fastest kernel is shown, not judged.", ""]
    ours = sorted({b for t in fz for side in t["sides"].values() for b in side["backends"]})
    sided = any(label for t in fz for label in t["sides"])  # the launch column where decode has two sides
    lines += ["| regime | case | dtype | M x N | " + ("launch | " if sided else "") + "best project kernel | "
              + " | ".join(ours) + " | best peer | t | gaps |",
              "|---|---|---|---|" + ("---|" if sided else "") + "---|" + "---|" * len(ours) + "---|---|---|"]
    for t in fz:
        for label, side in t["sides"].items():
            cells = [f"{side['backends'][b][1]} {side['backends'][b][0]}" if b in side["backends"] else "-"
                     for b in ours]
            best = f"{side['best'][1]} {side['best'][0]}" if side["best"] else "-"
            peer = f"{side['peer'][1]} {side['peer'][0]}" if side["peer"] else "-"
            margin_cell = "-" if side["t"] is None else f"{100 * side['t']:.2f}%"
            lines.append(f"| {t['regime']} | {t['case']} | {t['dtype']} | {t['m']} x {t['n']} | "
                         + (f"{label or 'default'} | " if sided else "") + f"{best} | " + " | ".join(cells)
                         + f" | {peer} | {margin_cell} | {'; '.join(side['gaps']) or side.get('note') or 'met'} |")
    return lines + [""]


def _ts(ts: dict) -> str:
    """The t of a shape's comparisons: one figure where all agree, else each by name."""
    values = set(ts.values())
    if len(values) == 1:
        return f"{100 * values.pop():.2f}%"
    return ", ".join(f"{k} {100 * v:.2f}%" for k, v in sorted(ts.items())) or "-"


def margin_text(rows: list[dict]) -> str:
    """How this run's t were set, for the section's opening."""
    spreads = pass_spreads(rows)
    if not spreads:
        return ("t = 0 throughout: one pass ran, so no spread between passes was measured (run with "
                "`--bench-repeat 2` to measure it)")
    worst = max(spreads.items(), key=lambda kv: kv[1])
    return (f"t per comparison: the larger of the two kernels' spreads between this run's passes, at most "
            f"{100 * MARGIN_CAP:.0f}% (largest spread: {100 * worst[1]:.2f}%, {worst[0]}); 0 for a kernel no "
            "second pass timed")


def _render_bandwidth(bw: list[dict], ours: list[str]) -> list[str]:
    lines = ["| op | dtype | M x N | best project kernel | " + " | ".join(ours) + " | best peer | t | gaps |",
             "|---|---|---|---|" + "---|" * len(ours) + "---|---|---|"]
    for t in bw:
        cells = [f"{t['project'][b][1]:.1f}% {t['project'][b][0]}" if b in t["project"] else "-" for b in ours]
        peer = f"{t['peer'][1]:.1f}% {t['peer'][0]}" if t["peer"] else "-"
        best = "-" if t["best"] is None else f"{t['best']:.1f}%"
        lines.append(f"| {t['op']} | {t['dtype']} | {t['m']} x {t['n']} | {best} | " + " | ".join(cells)
                     + f" | {peer} | {_ts(t['t'])} | {'; '.join(t['gaps']) or 'met'} |")
    return lines + [""]


def _render_decode(dc: list[dict], ours: list[str]) -> list[str]:
    met = sum(not t["gaps"] for t in dc)
    sided = any(label for t in dc for label in t["sides"])
    lines = [f"Decode regime: **{met} of {len(dc)} shapes** with each project backend at least as fast as the "
             "best peer (median µs per call)"
             + ("; like with like: with PDL against the peers with PDL, without against the peers without, a shape "
                "met when every side judged holds (a side where no peer ran is shown, not judged)." if sided else "."), "",
             "| op | dtype | M x N | " + ("launch | " if sided else "") + " | ".join(ours) + " | best peer | t | gaps |",
             "|---|---|---|" + ("---|" if sided else "") + "---|" * len(ours) + "---|---|---|"]
    for t in dc:
        for label, side in t["sides"].items():
            cells = [f"{side['project'][b][1] * 1e6:.2f} {side['project'][b][0]}" if b in side["project"] else "-"
                     for b in ours]
            peer = f"{side['peer'][1] * 1e6:.2f} {side['peer'][0]}" if side["peer"] else "-"
            lines.append(f"| {t['op']} | {t['dtype']} | {t['m']} x {t['n']} | " + (f"{label} | " if sided else "")
                         + " | ".join(cells) + f" | {peer} | {_ts(side['t'])} | {'; '.join(side['gaps']) or side.get('note') or 'met'} |")
    return lines + [""]


def _render_backward(bk: list[dict]) -> list[str]:
    met = sum(not t["gaps"] for t in bk)
    lines = [f"Backward regime (bfloat16, N {', '.join(map(str, BACKWARD_TARGET_N))}): **{met} of {len(bk)} "
             f"shapes** meet the targets (the best project backward >= {BACKWARD_TARGET_PCT:.0f}% of copy and "
             "at least as fast as every peer's backward that ran).", ""]
    for t in bk:
        peers = ", ".join(f"{k} {pct:.1f}% ({t_text(t['t'].get(k, 0.0))})" for k, pct in t["peers"]) or "no peer ran"
        lines.append(f"- {t['op']} {t['m']} x {t['n']}: " + (f"{t['best'][1]:.1f}% {t['best'][0]}" if t["best"] else "-")
                     + f" against {peers}; {'; '.join(t['gaps']) or 'met'}")
    return lines + [""]


def render(rows: list[dict]) -> list[str]:
    bw, dc, bk, fz = bandwidth(rows), decode(rows), backward(rows), fused(rows)
    if not bw and not dc and not bk and not fz:
        return []
    met_bw, met_dc = sum(not t["gaps"] for t in bw), sum(not t["gaps"] for t in dc)
    ours = project_backends(plain_rows(rows))
    if not bw and not dc and not bk:  # only the fused ops ran
        return ["## Speed targets", "", "*At least as fast*: median <= the peer's median x (1 + t); "
                f"{margin_text(rows)}.", ""] + _render_fused(fz) + render_pdl(rows)
    lines = ["## Speed targets", "",
             f"Bandwidth regime: **{met_bw} of {len(bw)} shapes meet every target**; decode regime: "
             f"**{met_dc} of {len(dc)}**. The targets (project backends: {', '.join(ours) or 'none'}; "
             "first pass; % of this run's copy ceiling): at N from 4000 to 32768 the best project "
             "kernel >= 97% for RMSNorm and >= 95% for LayerNorm, the best kernel of each project backend "
             ">= 92%; >= 90% at N 1024 and 2048; at N 65536, 131072 and 262144 the best >= 90% and "
             "each project backend >= 85%; each project backend at least as fast as the best peer that ran "
             "at every shape, decode included. *At least as fast*: median <= the peer's median x (1 + t); "
             f"{margin_text(rows)}.", ""]
    if bw:
        lines += _render_bandwidth(bw, ours)
    if bk:
        lines += _render_backward(bk)
    if dc:
        lines += _render_decode(dc, ours)
    if fz:
        lines += _render_fused(fz)
    return lines + render_pdl(rows)
