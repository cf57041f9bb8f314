"""The benchmark report's markdown, one function per section, each reading only the document
(pytest-benchmark's JSON with its ``normdiff`` section) and the rows read from it
(harness.report.benchmark_results). A new section is a function here called from
``render_markdown``."""
from __future__ import annotations

from collections import Counter, defaultdict

from harness.report import host, pdl_rows, targets
from harness.report.benchmark_results import (OP_TITLE, REPEAT_LIMIT, ceiling_of, fused_rows, repeatability,
                                              results)
from harness.report.markdown import table


def render_markdown(doc: dict, plots: dict | None = None) -> str:
    nd = doc.get("normdiff") or {}
    baseline = (nd.get("selection") or {}).get("baseline") or "the baseline"  # --bench-baseline, as recorded
    rows = results(doc)
    # Without a GPU the times are a smoke run of the suite: shown, never ranked.
    smoke = bool(rows) and all(r["device"] and r["device"].startswith("CPU") for r in rows)
    by_table = defaultdict(list)  # (regime, case, dtype) -> the first pass's rows (a plain row's case: its op)
    for r in rows:
        if r["repeat"] == 0:
            by_table[(r["regime"], r["case"], r["dtype"])].append(r)

    lines = render_header(doc, rows) + render_overview(doc, rows, baseline, smoke)
    lines += [] if smoke else targets.render(rows)
    lines += [] if smoke else host.render(rows)
    lines += render_bandwidth(by_table, baseline, plots or {}, smoke)
    lines += render_decode(by_table, baseline, smoke)
    lines += render_backward(by_table, baseline, smoke)
    lines += render_repeatability(rows)
    lines += render_skipped(nd)
    lines += render_preparation(doc)
    lines += render_failed(nd)
    lines.append("")
    return "\n".join(lines)


def _us(seconds: float) -> str:
    us = seconds * 1e6
    return f"{us:.1f}" if us < 1000 else f"{us:.0f}"


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _order(kernels, baseline: str) -> list[str]:
    return sorted(set(kernels), key=lambda k: (k != baseline, k))


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
    return table([f"M x N ({what})", *(["timed on"] if several else []), *kernels], body)


def _long(t: list[dict], baseline: str, rank: bool = True) -> list[str]:
    body = []
    for n, m in sorted({(r["n"], r["m"]) for r in t}):
        group = sorted((r for r in t if (r["n"], r["m"]) == (n, m)), key=lambda r: r["median_s"])
        for i, r in enumerate(group):
            name = f"★ {r['kernel']}" if rank and i == 0 and len(group) > 1 else r["kernel"]
            body.append([f"{m} x {n}", name, _us(r["median_s"]), f"{r['gbps']:.0f}",
                         "-" if r["pct"] is None else f"{r['pct']:.1f}%", _x(r["speedup"]) if rank else "-"])
    return table(["M x N", "kernel", "median µs", "GB/s", "% of copy", f"vs {baseline}"], body)


def render_header(doc: dict, rows: list[dict]) -> list[str]:
    """The title, where and how the run timed, and whether it reached its end."""
    nd = doc.get("normdiff") or {}
    env = nd.get("environment") or {}
    ceiling = ceiling_of(doc, rows)
    devices = sorted({r["device"] for r in rows if r["device"]})
    ceilings = nd.get("ceiling") or {}
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
        ["profile", (nd.get("selection") or {}).get("profile")],
        ["copy ceiling", "; ".join(f"{c['gbps']:.0f} GB/s ({c['how']})" for c in ceilings.values())
         or (f"{ceiling:.0f} GB/s" if ceiling else "-")],
        ["timing", "; ".join(sorted({r["timing"] for r in rows})) or "-"],
        ["rounds", ", ".join(sorted({str(r["rounds"]) for r in rows})) + " per benchmark (median reported)"],
        ["buffers", "; ".join(f"{dev}: {a['how']}" for dev, a in (nd.get("arena") or {}).items()) or None],
        ["wall time", f"{nd.get('elapsed_s', '-')} s"],
    ]
    lines = ["# normdiff benchmark report", ""]
    lines += table(["", ""], [[k, v] for k, v in header if v not in (None, "None")])
    if nd and not nd.get("final", True):
        lines += ["", f"> **Partial report**: {nd.get('done')} of {nd.get('collected')} benchmarks had run "
                      "when this was written; the run did not reach its end.", ""]
    elif nd.get("done", 0) < nd.get("collected", 0):
        lines += ["", f"> **Incomplete run**: {nd['done']} of {nd['collected']} benchmarks ran.", ""]
    return lines


def render_overview(doc: dict, rows: list[dict], baseline: str, smoke: bool) -> list[str]:
    """How many benchmarks ran, what the columns mean; a CPU run says it ranks nothing."""
    nd = doc.get("normdiff") or {}
    fused = fused_rows(rows)
    lines = ["", f"{len(rows)} benchmarks timed, {len(nd.get('skipped', ()))} skipped, "
                 f"{len(nd.get('failed', ()))} failed. GB/s counts x read, y written, weight and bias read "
                 "and the float32 statistics each kernel writes"
                 + ("; the fused ops' rows also count residual read and residual_out written (the add ops; "
                    "in place moves the same bytes) and an fp8 y at one byte an element" if fused else "")
                 + "; % of copy is against the copy ceiling "
                 "above (a copy kernel's bandwidth, not the hardware's: a kernel can pass it by a little)"
                 + ("." if smoke else f"; speedup is against `{baseline}` on the same shape"
                    + (f" (the fused ops' rows: against `{fused[0]['baseline']}`)" if fused and fused[0]["baseline"]
                       else "") + ". ★ marks the fastest kernel of each shape."), ""]
    if fused:
        lines += ["The fused ops have tables of their own, one per op and call (write convention, fp8 output and its "
                  "scale, weight offset, residual dtype): a kernel that does not take a call is skipped at its rows "
                  "with its reason (*Skipped*). A call that writes its inputs (in place, y into a given buffer) "
                  "starts every timed call from x and residual restored outside the timed span.", ""]
    if smoke:
        lines += ["> **CPU smoke run.** This exercises the benchmark suite without a GPU; its times are not "
                  "measurements. CPU medians of identical runs moved by up to 40x here (host load, caches, "
                  "threads), and the quick shapes fit in the caches, so a kernel can beat the host-memory copy "
                  "ceiling. Nothing is ranked: no ★, no speedups, no targets.", ""]
    return lines


def _tables(by_table: dict, regime: str) -> list[tuple[str, str]]:
    """The (case, dtype) tables of a regime: RMSNorm first, then LayerNorm, then the fused ops' cases."""
    keys = [(op, dt) for reg, op, dt in by_table if reg == regime]
    return sorted(keys, key=lambda k: (list(OP_TITLE).index(k[0]) if k[0] in OP_TITLE else 9, k[0], k[1]))


def _title(t: list[dict], op: str) -> str:
    """A table's title: the op's (RMSNorm), or a fused case's as its rows name it."""
    return OP_TITLE.get(op) or next((r["title"] for r in t if r.get("title")), op)


def _baseline(t: list[dict], baseline: str) -> str:
    """The kernel a table's speedups are against: its rows' own (the fused ops'), else the run's."""
    return next((r["baseline"] for r in t if r.get("baseline")), baseline)


def _bandwidth_tables(by_table: dict, regime: str, title: str, baseline: str, plots: dict, smoke: bool) -> list[str]:
    """Per (op, dtype): % of copy per shape and kernel, its plot, the details folded."""
    lines = []
    for op, dt in _tables(by_table, regime):
        t = by_table[(regime, op, dt)]
        base = _baseline(t, baseline)
        lines += [f"### {_title(t, op)}{title}, {dt}", ""]
        if regime == "bandwidth" and (op, dt) in plots:
            lines += [f"![{op} {dt}: GB/s against N]({plots[(op, dt)]})", ""]
        lines += _matrix(t, base, lambda r: f"{r['pct']:.1f}%" if r["pct"] is not None
                         else f"{r['gbps']:.0f} GB/s", "% of copy", rank=not smoke)
        lines += ["", "<details><summary>median time, GB/s, % of copy, speedup</summary>", ""]
        lines += _long(t, base, rank=not smoke)
        lines += ["", "</details>", ""]
    return lines


def render_bandwidth(by_table: dict, baseline: str, plots: dict, smoke: bool) -> list[str]:
    lines = ["## Bandwidth regime", ""]
    if not _tables(by_table, "bandwidth"):
        lines.append("No bandwidth-regime results.")
    return lines + _bandwidth_tables(by_table, "bandwidth", "", baseline, plots, smoke)


def render_decode(by_table: dict, baseline: str, smoke: bool) -> list[str]:
    lines = ["## Decode regime", "", "Median time per call in µs (fewer is better).", ""]
    if not _tables(by_table, "decode"):
        lines.append("No decode-regime results.")
    for op, dt in _tables(by_table, "decode"):
        t = pdl_rows.pdl_columns(by_table[("decode", op, dt)])  # a kernel timed both ways: a column per launch
        lines += [f"### {_title(t, op)}, {dt}", ""]
        lines += _matrix(t, _baseline(t, baseline), lambda r: f"{_us(r['median_s'])} µs", "µs per call",
                         rank=not smoke)
        odd = sorted({f"{r['kernel']}: {r['timing']}" for r in t if r["timer"] == "events"})
        if odd:
            lines += ["", "Not timed by CUDA-graph replay:", ""] + [f"- {o}" for o in odd]
        lines.append("")
    return lines


def render_backward(by_table: dict, baseline: str, smoke: bool) -> list[str]:
    if not _tables(by_table, "backward"):
        return []
    lines = ["## Backward regime", "",
             "dx, dw and db of one backward pass, timed as the bandwidth regime; bytes: x and dy read, dx "
             "written, the weight read, dw and db written once, the saved statistics read.", ""]
    return lines + _bandwidth_tables(by_table, "backward", " backward", baseline, {}, smoke)


def render_repeatability(rows: list[dict]) -> list[str]:
    lines = ["## Repeatability", ""]
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
        lines += table(["kernel", "shapes compared", "largest move", "at", f"within {100 * REPEAT_LIMIT:.0f}%"], [
            [e["kernel"], e["shapes"], f"{100 * e['max_move']:+.2f}%", e["worst_group"], "yes" if e["ok"] else "**no**"]
            for e in rep])
    lines.append("")
    return lines


def _counted(nd: dict, key: str, title: str) -> tuple[list, list[str]]:
    """The entries of nd[key] and their section's first lines: the title with their count, and
    "None." where there are none."""
    entries = nd.get(key) or []
    return entries, [f"## {title} ({len(entries)})", ""] + ([] if entries else ["None."])


def render_skipped(nd: dict) -> list[str]:
    skipped, lines = _counted(nd, "skipped", "Skipped")
    if skipped:
        counts = Counter((s["kernel"], s["reason"]) for s in skipped)
        lines += table(["kernel", "reason", "shapes"], [
            [k, reason.replace("|", "\\|").replace("\n", " "), n] for (k, reason), n in sorted(counts.items())])
    lines.append("")
    return lines


def render_preparation(doc: dict) -> list[str]:
    """Seconds in ``prepare`` per kernel and, for a kernel that declares what bounds its autotuning
    (a plug-in's ``autotune_cap``, recorded as ``prepare_cap``), that cap."""
    prep = defaultdict(lambda: [0.0, 0])
    caps: dict[str, set] = defaultdict(set)
    for b in doc.get("benchmarks", ()):
        ei = b.get("extra_info") or {}
        if "prepare_s" in ei:
            prep[ei["kernel"]][0] += ei["prepare_s"]
            prep[ei["kernel"]][1] += 1
        if ei.get("prepare_cap"):
            caps[ei["kernel"]].add(ei["prepare_cap"])
    if not prep:
        return []
    lines = ["## Preparation", "", "Seconds each kernel spent in `prepare` and its first call (compilation, "
             "autotuning), outside every timed call; *cap*: what bounds a kernel's autotuning, as it declares it.", ""]
    lines += table(["kernel", "benchmarks", "seconds", "cap"],
                   [[k, n, f"{t:.1f}", "; ".join(sorted(caps[k])) or "-"] for k, (t, n) in sorted(prep.items())])
    lines.append("")
    return lines


def render_failed(nd: dict) -> list[str]:
    failed, lines = _counted(nd, "failed", "Failed")
    for f in failed:
        msg = [ln for ln in (f.get("message") or "").strip().splitlines() if ln.strip()]
        lines += [f"### `{f.get('nodeid', f['kernel']).split('::')[-1]}`", "", "```", *msg[-12:], "```", ""]
    return lines
