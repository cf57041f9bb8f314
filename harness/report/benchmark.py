"""The benchmark report: markdown and PNG plots rendered from pytest-benchmark's JSON.

``pytest --benchmark-only`` writes ``benchmark.json`` (pytest-benchmark's own document plus a
``normdiff`` section: skips, failures, environment, copy ceiling) and renders it. To render again
from a saved document (``benchmark.json``, or any ``--benchmark-json`` file of a normdiff run)::

    python -m harness.report.benchmark reports/latest/benchmark.json [--out DIR]  # or a .json.gz
    python -m harness.report.benchmark run-bf16/benchmark.json run-fp16/benchmark.json --out DIR  # merged

Times are pytest-benchmark's medians (``stats.median``, seconds); GB/s = bytes / median; "% of
copy" is against the copy ceiling of the same run; speedups are against the baseline kernel of
the same group and pass. Tables and plots use the first pass; further passes (``--bench-repeat``)
feed the repeatability section.
"""
from __future__ import annotations

import argparse
import json
import math
from collections import Counter, defaultdict
from pathlib import Path

from harness.report import _table, atomic_write, host, load_report, targets

OP_TITLE = {"rms_norm": "RMSNorm", "layer_norm": "LayerNorm"}
REPEAT_LIMIT = 0.03  # issue 6: no backend's median may move more than 3% between passes
PLOT_PREFIX = "benchmark"


# -- reading the document ---------------------------------------------------------------------
def results(doc: dict) -> list[dict]:
    """One flat row per benchmark that produced stats, with the derived figures."""
    baseline_name = doc.get("normdiff", {}).get("selection", {}).get("baseline", "torch.eager")
    rows = []
    for b in doc.get("benchmarks", ()):
        ei = b.get("extra_info") or {}
        if "kernel" not in ei or not b.get("stats"):
            continue  # not a normdiff benchmark
        median = b["stats"]["median"]
        gbps = ei["bytes"] / median / 1e9
        rows.append({
            "op": ei["op"], "dtype": ei["dtype"], "m": ei["m"], "n": ei["n"], "regime": ei["regime"],
            "repeat": ei.get("repeat", 0), "kernel": ei["kernel"], "group": b.get("group"),
            "median_s": median, "rounds": b["stats"].get("rounds"), "bytes": ei["bytes"], "gbps": gbps,
            "ceiling": ei.get("ceiling_gbps"), "pct": 100 * gbps / ei["ceiling_gbps"] if ei.get("ceiling_gbps") else None,
            "timing": ei.get("timing", ""), "timer": ei.get("timer"), "device": ei.get("device"),
            "project": bool(ei.get("project")), "entry_point": bool(ei.get("entry_point")),
            "host_us": ei.get("host_call_us"), "wall_us": ei.get("wall_call_us"), "call": ei.get("user_call"),
            "call_error": ei.get("user_call_error"), "paired": ei.get("host_paired_us"),
            "paired_rounds": ei.get("host_paired_rounds_us"), "paired_left_out": ei.get("host_paired_left_out"),
        })
    base = {(r["group"], r["repeat"]): r["median_s"] for r in rows if r["kernel"] == baseline_name}
    for r in rows:
        ref = base.get((r["group"], r["repeat"]))
        r["speedup"] = ref / r["median_s"] if ref else None
    return rows


def ceiling_of(doc: dict, rows: list[dict]) -> float | None:
    values = [r["ceiling"] for r in rows if r["ceiling"]]
    if values:
        return values[0]
    ceilings = doc.get("normdiff", {}).get("ceiling") or {}
    return next((c["gbps"] for c in ceilings.values()), None)


def repeatability(rows: list[dict]) -> list[dict]:
    """Per kernel: the largest |median of a later pass / median of the first - 1| over the
    bandwidth shapes both passes timed."""
    first = {(r["kernel"], r["group"]): r["median_s"] for r in rows if r["regime"] == "bandwidth" and r["repeat"] == 0}
    moves: dict[str, list] = {}
    for r in rows:
        if r["regime"] != "bandwidth" or r["repeat"] == 0 or (r["kernel"], r["group"]) not in first:
            continue
        move = r["median_s"] / first[(r["kernel"], r["group"])] - 1
        cur = moves.setdefault(r["kernel"], [0.0, None, 0])
        cur[2] += 1
        if cur[1] is None or abs(move) > abs(cur[0]):
            cur[0], cur[1] = move, r["group"]
    return [{"kernel": k, "max_move": m, "worst_group": g, "shapes": n, "ok": abs(m) <= REPEAT_LIMIT}
            for k, (m, g, n) in sorted(moves.items())]


# -- plots ------------------------------------------------------------------------------------
def plot(rows: list[dict], op: str, dtype: str, ceiling: float | None, path: Path, device: str | None) -> None:
    import matplotlib.pyplot as plt

    fig = figure(rows, op, dtype, ceiling, device)
    fig.savefig(path)
    plt.close(fig)


def figure(rows: list[dict], op: str, dtype: str, ceiling: float | None, device: str | None):
    """GB/s against N (log2 axis), one line per kernel, the copy ceiling as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = defaultdict(list)
    for r in rows:
        lines[r["kernel"]].append((r["n"], r["gbps"]))
    ns = sorted({r["n"] for r in rows})
    fig, ax = plt.subplots(figsize=(10, 5.6), dpi=110)
    cmap = plt.get_cmap("tab10" if len(lines) <= 10 else "tab20")
    markers, styles = "osD^vP*Xh<>", ("-", "--", "-.", ":")
    for i, (kernel, pts) in enumerate(sorted(lines.items())):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=kernel, color=cmap(i % cmap.N),
                marker=markers[i % len(markers)], linestyle=styles[(i // 10) % len(styles)], linewidth=1.6, markersize=5)
    top = max([r["gbps"] for r in rows] + [ceiling or 0])
    if ceiling:
        ax.axhline(ceiling, color="black", linestyle="--", linewidth=1.2, label="_copy ceiling")
        ax.text(ns[0], ceiling, f" copy ceiling {ceiling:.0f} GB/s", va="bottom", ha="left", fontsize=9)
    ax.set_xscale("log", base=2)
    labels = [str(n) for n in ns]
    for i in range(1, len(ns)):  # ticks a hair apart (4000, 4096) share one label
        if math.log2(ns[i] / ns[i - 1]) < 0.1:
            labels[i], labels[i - 1] = f"{labels[i - 1]}/{labels[i]}", ""
    ax.set_xticks(ns, labels, rotation=45, ha="right", fontsize=9)
    ax.minorticks_off()
    low = min([r["gbps"] for r in rows] + [ceiling or top])  # the ceiling stays in view
    # Zoom on the band the kernels occupy when they all sit high; the y axis says where it starts.
    step = (ceiling or top) / 10
    ax.set_ylim(0 if low < 0.5 * top else step * math.floor(0.9 * low / step), top * 1.08)
    if ceiling:
        pct = ax.secondary_yaxis("right", functions=(lambda g: 100 * g / ceiling, lambda p: p * ceiling / 100))
        pct.set_ylabel("% of copy ceiling")
    ax.set_xlabel("N (row length; M x N per point in the report's table)")
    ax.set_ylabel("GB/s (bytes read + written / median time)")
    ax.set_title(f"{OP_TITLE.get(op, op)} forward, {dtype}, bandwidth regime" + (f" on {device}" if device else ""),
                 fontsize=11)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.09 if ceiling else 1.01, 1.0), fontsize=9, frameon=False)
    fig.tight_layout()
    return fig


def plot_name(op: str, dtype: str) -> str:
    return f"{PLOT_PREFIX}-{op}-{dtype}.png"


# -- markdown ---------------------------------------------------------------------------------
def _us(seconds: float) -> str:
    us = seconds * 1e6
    return f"{us:.1f}" if us < 1000 else f"{us:.0f}"


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _order(kernels, baseline: str) -> list[str]:
    return sorted(set(kernels), key=lambda k: (k != baseline, k))


def render_markdown(doc: dict, plots: dict | None = None) -> str:
    nd = doc.get("normdiff") or {}
    env = nd.get("environment") or {}
    sel = nd.get("selection") or {}
    baseline = sel.get("baseline", "torch.eager")
    rows = results(doc)
    ceiling = ceiling_of(doc, rows)
    plots = plots or {}
    devices = sorted({r["device"] for r in rows if r["device"]})
    ceilings = nd.get("ceiling") or {}
    # Without a GPU the times are a smoke run of the suite: shown, never ranked.
    smoke = bool(rows) and all(r["device"] and r["device"].startswith("CPU") for r in rows)

    lines = ["# normdiff benchmark report", ""]
    header = [
        ["device", ", ".join(devices) or env.get("gpu") or "-"],
        ["date", env.get("date") or doc.get("datetime")],
        ["host", env.get("host")],
        ["commit", env.get("commit")],
        ["python / torch / CUDA", f"{env.get('python')} / {env.get('torch')} / {env.get('cuda')}"],
        ["driver", env.get("driver")],
        ["versions", env.get("versions")],
        ["pytest-benchmark", doc.get("version")],
        ["command", f"`{nd.get('command', '-')}`"],
        ["profile", sel.get("profile")],
        ["copy ceiling", "; ".join(f"{c['gbps']:.0f} GB/s ({c['how']})" for c in ceilings.values())
         or (f"{ceiling:.0f} GB/s" if ceiling else "-")],
        ["timing", "; ".join(sorted({r["timing"] for r in rows})) or "-"],
        ["rounds", ", ".join(sorted({str(r["rounds"]) for r in rows})) + " per benchmark (median reported)"],
        ["buffers", "; ".join(f"{dev}: {a['how']}" for dev, a in (nd.get("arena") or {}).items()) or None],
        ["wall time", f"{nd.get('elapsed_s', '-')} s"],
    ]
    lines += _table(["", ""], [[k, v] for k, v in header if v not in (None, "None")])
    if nd and not nd.get("final", True):
        lines += ["", f"> **Partial report**: {nd.get('done')} of {nd.get('collected')} benchmarks had run "
                      "when this was written; the run did not reach its end.", ""]
    elif nd.get("done", 0) < nd.get("collected", 0):
        lines += ["", f"> **Incomplete run**: {nd['done']} of {nd['collected']} benchmarks ran.", ""]
    lines += ["", f"{len(rows)} benchmarks timed, {len(nd.get('skipped', ()))} skipped, "
                  f"{len(nd.get('failed', ()))} failed. GB/s counts x read, y written, weight and bias read "
                  "and the float32 statistics each kernel writes; % of copy is against the copy ceiling "
                  "above (a copy kernel's bandwidth, not the hardware's: a kernel can pass it by a little)"
                  + ("." if smoke else f"; speedup is against `{baseline}` on the same shape. ★ marks the fastest "
                     "kernel of each shape."), ""]
    if smoke:
        lines += ["> **CPU smoke run.** This exercises the benchmark suite without a GPU; its times are not "
                  "measurements. CPU medians of identical runs moved by up to 40x here (host load, caches, "
                  "threads), and the quick shapes fit in the caches, so a kernel can beat the host-memory copy "
                  "ceiling. Nothing is ranked: no ★, no speedups, no targets.", ""]

    first = [r for r in rows if r["repeat"] == 0]
    by_table = defaultdict(list)
    for r in first:
        by_table[(r["regime"], r["op"], r["dtype"])].append(r)

    lines += [] if smoke else targets.render(rows)
    lines += [] if smoke else host.render(rows)
    def tables(regime: str) -> list[tuple[str, str]]:  # (op, dtype), RMSNorm first
        keys = [(op, dt) for reg, op, dt in by_table if reg == regime]
        return sorted(keys, key=lambda k: (list(OP_TITLE).index(k[0]) if k[0] in OP_TITLE else 9, k[1]))

    lines += ["## Bandwidth regime", ""]
    if not tables("bandwidth"):
        lines.append("No bandwidth-regime results.")
    def bandwidth_tables(regime: str, title: str) -> None:
        for op, dt in tables(regime):
            t = by_table[(regime, op, dt)]
            lines.extend([f"### {OP_TITLE.get(op, op)}{title}, {dt}", ""])
            if regime == "bandwidth" and (op, dt) in plots:
                lines.extend([f"![{op} {dt}: GB/s against N]({plots[(op, dt)]})", ""])
            lines.extend(_matrix(t, baseline, lambda r: f"{r['pct']:.1f}%" if r["pct"] is not None
                                 else f"{r['gbps']:.0f} GB/s", "% of copy", rank=not smoke))
            lines.extend(["", "<details><summary>median time, GB/s, % of copy, speedup</summary>", ""])
            lines.extend(_long(t, baseline, rank=not smoke))
            lines.extend(["", "</details>", ""])

    bandwidth_tables("bandwidth", "")

    lines += ["## Decode regime", "", "Median time per call in µs (fewer is better).", ""]
    if not tables("decode"):
        lines.append("No decode-regime results.")
    for op, dt in tables("decode"):
        t = by_table[("decode", op, dt)]
        lines += [f"### {OP_TITLE.get(op, op)}, {dt}", ""]
        lines += _matrix(t, baseline, lambda r: f"{_us(r['median_s'])} µs", "µs per call", rank=not smoke)
        odd = sorted({f"{r['kernel']}: {r['timing']}" for r in t if r["timer"] == "events"})
        if odd:
            lines += ["", "Not timed by CUDA-graph replay:", ""] + [f"- {o}" for o in odd]
        lines.append("")

    if tables("backward"):
        lines += ["## Backward regime", "",
                  "dx, dw and db of one backward pass, timed as the bandwidth regime; bytes: x and dy read, dx "
                  "written, the weight read, dw and db written once, the saved statistics read.", ""]
    bandwidth_tables("backward", " backward")

    lines += ["## Repeatability", ""]
    rep = repeatability(rows)
    if not rep:
        lines.append("The bandwidth sweep ran once; run with `--bench-repeat 2` to measure how far medians move "
                     "between two passes of one session.")
    else:
        worst = max(rep, key=lambda e: abs(e["max_move"]))
        over = [e["kernel"] for e in rep if not e["ok"]]
        verdict = (f"every kernel within {100 * REPEAT_LIMIT:.0f}%" if not over else
                   f"**more than {100 * REPEAT_LIMIT:.0f}% for {', '.join(over)}**")
        lines += [f"The bandwidth sweep ran {max(r['repeat'] for r in rows) + 1} times in this session. Largest move of "
                  f"a median from the first pass: {100 * abs(worst['max_move']):.2f}% ({worst['kernel']}, "
                  f"{worst['worst_group']}); {verdict}.", ""]
        lines += _table(["kernel", "shapes compared", "largest move", "at", f"within {100 * REPEAT_LIMIT:.0f}%"], [
            [e["kernel"], e["shapes"], f"{100 * e['max_move']:+.2f}%", e["worst_group"], "yes" if e["ok"] else "**no**"]
            for e in rep])
    lines.append("")

    skipped = nd.get("skipped") or []
    lines += [f"## Skipped ({len(skipped)})", ""]
    if not skipped:
        lines.append("None.")
    else:
        counts = Counter((s["kernel"], s["reason"]) for s in skipped)
        lines += _table(["kernel", "reason", "shapes"], [
            [k, reason.replace("|", "\\|").replace("\n", " "), n] for (k, reason), n in sorted(counts.items())])
    lines.append("")

    prep = defaultdict(lambda: [0.0, 0])
    for b in doc.get("benchmarks", ()):
        ei = b.get("extra_info") or {}
        if "prepare_s" in ei:
            prep[ei["kernel"]][0] += ei["prepare_s"]
            prep[ei["kernel"]][1] += 1
    if prep:
        lines += ["## Preparation", "", "Seconds each kernel spent in `prepare` and its first call (compilation, "
                  "autotuning), outside every timed call.", ""]
        lines += _table(["kernel", "benchmarks", "seconds"], [[k, n, f"{t:.1f}"] for k, (t, n) in sorted(prep.items())])
        lines.append("")

    failed = nd.get("failed") or []
    lines += [f"## Failed ({len(failed)})", ""]
    if not failed:
        lines.append("None.")
    for f in failed:
        msg = [ln for ln in (f.get("message") or "").strip().splitlines() if ln.strip()]
        lines += [f"### `{f.get('nodeid', f['kernel']).split('::')[-1]}`", "", "```", *msg[-12:], "```", ""]
    lines.append("")
    return "\n".join(lines)


def _matrix(t: list[dict], baseline: str, cell, what: str, rank: bool = True) -> list[str]:
    kernels = _order((r["kernel"] for r in t), baseline)
    shapes = sorted({(r["n"], r["m"]) for r in t})
    at = {(r["n"], r["m"], r["kernel"]): r for r in t}
    several = len({r["device"] for r in t}) > 1  # rows timed on several GPUs: name each row's
    body = []
    for n, m in shapes:
        present = [at[(n, m, k)] for k in kernels if (n, m, k) in at]
        best = min(present, key=lambda r: r["median_s"])["kernel"]
        row = [f"{m} x {n}"] + ([", ".join(sorted({r["device"] or "-" for r in present}))] if several else [])
        for k in kernels:
            r = at.get((n, m, k))
            row.append("-" if r is None else (f"**★ {cell(r)}**" if rank and k == best and len(present) > 1 else cell(r)))
        body.append(row)
    return _table([f"M x N ({what})", *(["timed on"] if several else []), *kernels], body)


def _long(t: list[dict], baseline: str, rank: bool = True) -> list[str]:
    body = []
    for n, m in sorted({(r["n"], r["m"]) for r in t}):
        group = sorted((r for r in t if (r["n"], r["m"]) == (n, m)), key=lambda r: r["median_s"])
        for i, r in enumerate(group):
            name = f"★ {r['kernel']}" if rank and i == 0 and len(group) > 1 else r["kernel"]
            body.append([f"{m} x {n}", name, _us(r["median_s"]), f"{r['gbps']:.0f}",
                         "-" if r["pct"] is None else f"{r['pct']:.1f}%", _x(r["speedup"]) if rank else "-"])
    return _table(["M x N", "kernel", "median µs", "GB/s", "% of copy", f"vs {baseline}"], body)


# -- writing ----------------------------------------------------------------------------------
def write_all(doc: dict, directory: Path, json_name: str | None = "benchmark.json") -> tuple[Path, ...]:
    """benchmark.json (unless json_name is None), the PNG plots and benchmark.md (written last, so
    a crash leaves the previous markdown)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    if json_name:
        json_path = directory / json_name
        atomic_write(json_path, json.dumps(doc, indent=1, default=repr, allow_nan=True) + "\n")
        written.append(json_path)
    rows = [r for r in results(doc) if r["regime"] == "bandwidth" and r["repeat"] == 0]
    ceiling = ceiling_of(doc, rows)
    plots = {}
    for op, dt in sorted({(r["op"], r["dtype"]) for r in rows}):
        sub = [r for r in rows if (r["op"], r["dtype"]) == (op, dt)]
        path = directory / plot_name(op, dt)
        tmp = path.with_name(f".{path.name}.tmp.png")
        devices = sorted({r["device"] for r in sub if r["device"]})
        plot(sub, op, dt, ceiling, tmp, ", ".join(devices) or None)
        tmp.replace(path)
        plots[(op, dt)] = path.name
        written.append(path)
    md_path = directory / "benchmark.md"
    atomic_write(md_path, render_markdown(doc, plots))
    return (md_path, *written)


def merge(docs: list[dict]) -> dict:
    """One document from several runs (a sweep split by --dtype or --op over several commands).
    Each result keeps its own run's copy ceiling; repeat passes compare within a run."""
    if len(docs) == 1:
        return docs[0]
    out = {**docs[0], "benchmarks": [b for d in docs for b in d.get("benchmarks", ())]}
    nds = [d.get("normdiff") or {} for d in docs]
    nd = {**nds[0]}
    for key in ("skipped", "failed"):
        nd[key] = [e for x in nds for e in x.get(key, ())]
    for key in ("collected", "done", "elapsed_s"):
        nd[key] = sum(x.get(key, 0) for x in nds)
    nd["final"] = all(x.get("final", True) for x in nds)
    nd["command"] = " ; ".join(x.get("command", "?") for x in nds)
    # Each run's ceiling under the device its rows name (one GPU per run when split over GPUs).
    labels = [sorted({(b.get("extra_info") or {}).get("device") for b in d.get("benchmarks", ())} - {None}) for d in docs]
    nd["ceiling"] = {(", ".join(labels[i]) if labels[i] else f"{dev} (run {i + 1})"): c
                     for i, x in enumerate(nds) for dev, c in (x.get("ceiling") or {}).items()}
    out["normdiff"] = nd
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.report.benchmark", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("json", type=Path, nargs="+",
                   help="benchmark.json, or a --benchmark-json file of a normdiff run; several are merged")
    p.add_argument("--out", type=Path, help="directory for benchmark.md and the plots (default: beside the first JSON)")
    args = p.parse_args(argv)
    doc = merge([load_report(path) for path in args.json])
    first = args.json[0]
    out = args.out or first.parent
    same = len(args.json) == 1 and out.resolve() == first.parent.resolve() and first.name.startswith("benchmark.json")
    for path in write_all(doc, out, json_name=None if same else "benchmark.json"):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["results", "repeatability", "render_markdown", "write_all", "plot", "figure", "merge"]
