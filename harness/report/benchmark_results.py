"""The benchmark report's rows: pytest-benchmark's JSON read into one flat row per benchmark, with
the figures derived from it (GB/s, % of copy, speedup), and the repeatability of the passes."""
from __future__ import annotations

OP_TITLE = {"rms_norm": "RMSNorm", "layer_norm": "LayerNorm"}
REPEAT_LIMIT = 0.03  # issue 6: no backend's median may move more than 3% between passes


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
            # Another family's rows (the fused ops', harness/benchmarks/bench_fused.py) are tables
            # and targets of their own: ``case`` is the op with the call's choices (write convention,
            # fp8 output, ...), the op itself for a plain row; ``baseline`` the kernel their speedups
            # are against.
            "family": ei.get("family") or "plain", "case": ei.get("case") or ei["op"],
            "title": ei.get("case_title") or OP_TITLE.get(ei["op"], ei["op"]), "baseline": ei.get("baseline"),
            "op": ei["op"], "dtype": ei["dtype"], "m": ei["m"], "n": ei["n"], "regime": ei["regime"],
            "repeat": ei.get("repeat", 0), "kernel": ei["kernel"], "group": b.get("group"),
            "median_s": median, "rounds": b["stats"].get("rounds"), "bytes": ei["bytes"], "gbps": gbps,
            "ceiling": ei.get("ceiling_gbps"), "pct": 100 * gbps / ei["ceiling_gbps"] if ei.get("ceiling_gbps") else None,
            "timing": ei.get("timing", ""), "timer": ei.get("timer"), "device": ei.get("device"),
            "project": bool(ei.get("project")), "entry_point": bool(ei.get("entry_point")),
            "pdl": ei.get("pdl"),  # whether the timed calls launched with PDL; None: not recorded
            "host_us": ei.get("host_call_us"), "wall_us": ei.get("wall_call_us"), "call": ei.get("user_call"),
            "call_error": ei.get("user_call_error"), "paired": ei.get("host_paired_us"),
            "paired_rounds": ei.get("host_paired_rounds_us"), "paired_left_out": ei.get("host_paired_left_out"),
        })
    base = {(r["group"], r["repeat"]): r["median_s"] for r in rows if r["kernel"] == (r["baseline"] or baseline_name)}
    for r in rows:
        ref = base.get((r["group"], r["repeat"]))
        r["speedup"] = ref / r["median_s"] if ref else None
    return rows


def plain_rows(rows: list[dict]) -> list[dict]:
    """The plain norms' rows (a row without a family is one: documents from before the fused ops)."""
    return [r for r in rows if r.get("family", "plain") == "plain"]


def fused_rows(rows: list[dict]) -> list[dict]:
    """The rows of every family but the plain one, each case a table of its own."""
    return [r for r in rows if r.get("family", "plain") != "plain"]


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
