"""The project's speed targets, checked against one benchmark run (rows of
``harness.report.benchmark_results.results``), so every benchmark report says which are met and
by how much each is missed.

Bandwidth regime (first pass, % of the same run's copy ceiling), at M x N >= 2^26:
- N in 4000 ... 32768: the project's best kernel >= 97% for RMSNorm, >= 95% for LayerNorm; the
  best kernel of each project backend >= 92%;
- N in 1024, 2048 (M >= 32768): >= 90%; N in 65536, 131072, 262144: the best >= 90%, each
  project backend >= 85%;
- every dtype, and at every shape each project backend at least as fast as the best peer.
Decode regime: each project backend no slower than the best peer.
Backward regime (bfloat16, N in BACKWARD_TARGET_N): the project's best backward >= 85% of copy and
faster than each of BACKWARD_PEERS' backward.

The project's kernels are those that declare ``NormKernel.project`` (each row says so); every
other kernel is a peer.
"""
from __future__ import annotations

from harness.shapes import (BACKWARD_TARGET_N, BANDWIDTH_ELEMENTS, TARGET_LONG_N, TARGET_MID_N,
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
BACKWARD_PEERS = ("liger", "torch_compile")  # named by the issue that set the target


def _backend(kernel: str) -> str:
    return kernel.split(".", 1)[0]


def project_backends(rows: list[dict]) -> list[str]:
    """The backends whose kernels are the project's, as the run's rows declare."""
    return sorted({_backend(r["kernel"]) for r in rows if r.get("project")})


def _by_shape(rows: list[dict], regime: str) -> dict[tuple, list[dict]]:
    shapes: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["regime"] == regime and r["repeat"] == 0:
            shapes.setdefault((r["op"], r["dtype"], r["m"], r["n"]), []).append(r)
    return shapes


def _best(rows: list[dict], key, pick):
    return pick(rows, key=key) if rows else None


def bandwidth(rows: list[dict]) -> list[dict]:
    out = []
    for (op, dtype, m, n), rs in sorted(_by_shape(rows, "bandwidth").items(), key=lambda kv: (kv[0][:2], kv[0][3])):
        limits = thresholds(op, m, n)
        rs = [r for r in rs if r["pct"] is not None]
        if limits is None or not rs:
            continue
        best_target, each_target = limits
        project = {b: _best([r for r in rs if r.get("project") and _backend(r["kernel"]) == b], lambda r: r["pct"], max)
                   for b in project_backends(rows)}
        project = {b: r for b, r in project.items() if r}
        peer = _best([r for r in rs if not r.get("project")], lambda r: r["pct"], max)
        gaps = []
        best = max((r["pct"] for r in project.values()), default=None)
        if best is None:
            gaps.append("no project kernel ran")
        elif best < best_target:
            gaps.append(f"best {best:.1f}% < {best_target:.0f}%")
        for b, r in project.items():
            if r["pct"] < each_target:
                gaps.append(f"{b} {r['pct']:.1f}% < {each_target:.0f}%")
            if peer and r["pct"] < peer["pct"]:
                gaps.append(f"{b} {r['pct']:.1f}% < {peer['kernel']} {peer['pct']:.1f}%")
        out.append({"op": op, "dtype": dtype, "m": m, "n": n, "best": best, "targets": limits,
                    "project": {b: (r["kernel"], r["pct"]) for b, r in project.items()},
                    "peer": (peer["kernel"], peer["pct"]) if peer else None, "gaps": gaps})
    return out


def decode(rows: list[dict]) -> list[dict]:
    out = []
    for (op, dtype, m, n), rs in sorted(_by_shape(rows, "decode").items(), key=lambda kv: (kv[0][:2], kv[0][3], kv[0][2])):
        project = {b: _best([r for r in rs if r.get("project") and _backend(r["kernel"]) == b], lambda r: r["median_s"], min)
                   for b in project_backends(rows)}
        project = {b: r for b, r in project.items() if r}
        peer = _best([r for r in rs if not r.get("project")], lambda r: r["median_s"], min)
        if not project or not peer:
            continue
        gaps = [f"{b} {r['median_s'] * 1e6:.2f} µs > {peer['kernel']} {peer['median_s'] * 1e6:.2f} µs"
                for b, r in project.items() if r["median_s"] > peer["median_s"]]
        out.append({"op": op, "dtype": dtype, "m": m, "n": n, "gaps": gaps})
    return out


def backward(rows: list[dict]) -> list[dict]:
    out = []
    for (op, dtype, m, n), rs in sorted(_by_shape(rows, "backward").items()):
        if dtype != "bfloat16" or n not in BACKWARD_TARGET_N:
            continue
        rs = [r for r in rs if r["pct"] is not None]
        best = _best([r for r in rs if r.get("project")], lambda r: r["pct"], max)
        gaps = []
        if best is None:
            gaps.append("no project backward ran")
        else:
            if best["pct"] < BACKWARD_TARGET_PCT:
                gaps.append(f"best {best['pct']:.1f}% < {BACKWARD_TARGET_PCT:.0f}%")
            for r in rs:
                if _backend(r["kernel"]) in BACKWARD_PEERS and r["pct"] >= best["pct"]:
                    gaps.append(f"{best['kernel']} {best['pct']:.1f}% <= {r['kernel']} {r['pct']:.1f}%")
        out.append({"op": op, "dtype": dtype, "m": m, "n": n, "best": best and (best["kernel"], best["pct"]),
                    "gaps": gaps})
    return out


def render(rows: list[dict]) -> list[str]:
    bw, dc, bk = bandwidth(rows), decode(rows), backward(rows)
    if not bw and not dc and not bk:
        return []
    met_bw, met_dc = sum(not t["gaps"] for t in bw), sum(not t["gaps"] for t in dc)
    ours = project_backends(rows)
    lines = ["## Speed targets", "",
             f"Bandwidth regime: **{met_bw} of {len(bw)} shapes meet every target**; decode regime: "
             f"**{met_dc} of {len(dc)}**. The targets (project backends: {', '.join(ours) or 'none'}; "
             "first pass; % of this run's copy ceiling): at N from 4000 to 32768 the best project "
             "kernel >= 97% for RMSNorm and >= 95% for LayerNorm, the best kernel of each project backend "
             ">= 92%; >= 90% at N 1024 and 2048; at N 65536, 131072 and 262144 the best >= 90% and "
             "each project backend >= 85%; each "
             "project backend at least as fast as the best peer at every shape, decode included.", ""]
    if bw:
        lines += ["| op | dtype | M x N | best project kernel | " + " | ".join(ours) + " | best peer | gaps |",
                  "|---|---|---|---|" + "---|" * len(ours) + "---|---|"]
        for t in bw:
            cells = [f"{t['project'][b][1]:.1f}% {t['project'][b][0]}" if b in t["project"] else "-" for b in ours]
            peer = f"{t['peer'][1]:.1f}% {t['peer'][0]}" if t["peer"] else "-"
            best = "-" if t["best"] is None else f"{t['best']:.1f}%"
            lines.append(f"| {t['op']} | {t['dtype']} | {t['m']} x {t['n']} | {best} | " + " | ".join(cells)
                         + f" | {peer} | {'; '.join(t['gaps']) or 'met'} |")
        lines.append("")
    if bk:
        met = sum(not t["gaps"] for t in bk)
        lines += [f"Backward regime (bfloat16, N {', '.join(map(str, BACKWARD_TARGET_N))}): **{met} of {len(bk)} "
                  f"shapes** meet the targets (the best project backward >= {BACKWARD_TARGET_PCT:.0f}% of copy and "
                  f"faster than {', '.join(BACKWARD_PEERS)}).", ""]
        lines += [f"- {t['op']} {t['m']} x {t['n']}: " + (f"{t['best'][1]:.1f}% {t['best'][0]}" if t["best"] else "-")
                  + f"; {'; '.join(t['gaps']) or 'met'}" for t in bk]
        lines.append("")
    missed = [t for t in dc if t["gaps"]]
    if missed:
        lines += ["Decode shapes where a project backend is slower than the best peer:", ""]
        lines += [f"- {t['op']} {t['dtype']} {t['m']} x {t['n']}: {'; '.join(t['gaps'])}" for t in missed]
        lines.append("")
    return lines
