"""The benchmark report's plots: GB/s against N in the bandwidth regime, one PNG per (op, dtype)."""
from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

from harness.report.benchmark_results import OP_TITLE

PLOT_PREFIX = "benchmark"


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
    title = next((r["title"] for r in rows if r.get("title")), None) or OP_TITLE.get(op, op)
    ax.set_title(f"{title} forward, {dtype}, bandwidth regime" + (f" on {device}" if device else ""),
                 fontsize=11)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.09 if ceiling else 1.01, 1.0), fontsize=9, frameon=False)
    fig.tight_layout()
    return fig


def plot_name(op: str, dtype: str) -> str:
    return f"{PLOT_PREFIX}-{op}-{dtype}.png"
