"""Where a run's time went: its phases in wall time and in worker time, summed at the end of the
run (``summarise``, from the records' times and the run's clock, harness.running.clock) and kept
in the document (``phases``: one entry per run; a merged report keeps each run's).

Worker time, per worker from its start to the run's end, is cut into:
- set-up: the worker's start (interpreter, imports, the backends' registry), its collection, and
  the wait for its first scope of checks;
- first compiles: kernel calls that were the first of their compile key in that worker (a first
  call counts as compile when it compiles: isolation.CallWatch);
- waiting for memory: admission through the GPU's ledger (harness.running.ledger);
- checking: the rest of each check (inputs, the oracle, the call, the comparison, teardown);
- between checks: the worker alive between its checks (the controller's hand-off of the next one);
- after its last check: waiting for the others to finish and for the report.

    python -m harness.report --phases DIR/correctness.json   # print them (tools/gpu_run.sh does)
"""
from __future__ import annotations

from collections import Counter

MAIN = "this process"  # harness.running.clock.MAIN: the records of a run without xdist workers
WORKER_PHASES = ("set-up", "first compiles", "waiting for memory", "checking", "between checks",
                 "after its last check")


def summarise(records, clock: dict, ended: float) -> dict:
    """The phases of one run from its records (``t_start``, ``t_end``, ``compile_s``,
    ``mem_wait_s``, ``worker``) and its clock (``started``, each worker's ``started`` and
    ``collected``); ``ended``: when the report was written."""
    timed: dict[str, list[dict]] = {}
    for r in records:
        if r.get("t_start") is not None and r.get("t_end") is not None:
            timed.setdefault(r.get("worker", MAIN), []).append(r)
    marks = clock.get("workers") or {}
    starts = [r["t_start"] for rs in timed.values() for r in rs]
    started = clock.get("started") or min(starts, default=ended)
    spent: Counter = Counter()
    compile_by: Counter = Counter()
    for name in sorted(set(timed) | set(marks)):
        rs = timed.get(name, [])
        begun = (marks.get(name) or {}).get("started", started)
        if not rs:
            spent["set-up"] += max(0.0, ended - begun)
            continue
        first, last = min(r["t_start"] for r in rs), max(r["t_end"] for r in rs)
        busy = sum(r["t_end"] - r["t_start"] for r in rs)
        compiles = sum(r.get("compile_s") or 0.0 for r in rs)
        waits = sum(r.get("mem_wait_s") or 0.0 for r in rs)
        for r in rs:
            compile_by[r.get("backend", "?")] += r.get("compile_s") or 0.0
        spent.update({"set-up": max(0.0, first - begun), "first compiles": compiles, "waiting for memory": waits,
                      "checking": max(0.0, busy - compiles - waits), "between checks": max(0.0, last - first - busy),
                      "after its last check": max(0.0, ended - last)})
    collected = [m["collected"] for m in marks.values() if "collected" in m]
    first, last = min(starts, default=ended), max((r["t_end"] for rs in timed.values() for r in rs), default=ended)
    wall = {"total": ended - started, "set-up": first - started,
            "workers collected": (max(collected) - started) if collected else None,
            "checks": last - first, "finish": ended - last}
    return {"workers": max(1, len(set(timed) | set(marks))), "checks": len(starts),
            "compiled": sum(r.get("compiled") or 0 for rs in timed.values() for r in rs),
            "wall_s": {k: None if v is None else round(max(0.0, v), 1) for k, v in wall.items()},
            "worker_s": {k: round(spent[k], 1) for k in WORKER_PHASES},
            "compile_s_by_backend": {k: round(v, 1) for k, v in compile_by.most_common() if v >= 0.05}}


def _s(v) -> str:
    return "-" if v is None else f"{v:.0f} s" if v >= 10 else f"{v:.1f} s"


def lines(p: dict, title: str = "") -> list[str]:
    """One run's phases as markdown."""
    wall, spent, n = p["wall_s"], p["worker_s"], p["workers"]
    total = sum(spent.values()) or 1.0
    out = [f"{title}wall {_s(wall['total'])}: set-up {_s(wall['set-up'])}"
           + (f" (workers started and collected by {_s(wall['workers collected'])})" if wall.get("workers collected") else "")
           + f", checks {_s(wall['checks'])}, finish {_s(wall['finish'])}; {p['checks']} checks on {n} "
           f"worker{'s' if n != 1 else ''}, {p['compiled']} first calls that compiled.", "",
           "| phase | worker time | share | per worker |", "|---|---|---|---|"]
    out += [f"| {k} | {_s(v)} | {100 * v / total:.0f}% | {_s(v / n)} |" for k, v in spent.items()]
    by = p.get("compile_s_by_backend") or {}
    if by:
        out += ["", "First compiles by backend (worker time): " + ", ".join(f"{k} {_s(v)}" for k, v in by.items()) + "."]
    return out


def render(doc: dict, table=None) -> list[str]:
    """The report's section *Where the time went*; nothing for a document without phases."""
    runs = doc.get("phases") or []
    if not runs:
        return []
    out = ["", "## Where the time went", "",
           "Worker time is each worker's, from its start to the run's end (`python -m harness.report --phases` "
           "prints this; harness/report/phases.py says what each phase holds).", ""]
    for i, p in enumerate(runs):
        out += lines(p, f"Run {i + 1} of {len(runs)}: " if len(runs) > 1 else "") + [""]
    return out[:-1]


def text(doc: dict) -> list[str]:
    """The phases as plain lines for a terminal (``python -m harness.report --phases``)."""
    runs = doc.get("phases") or []
    if not runs:
        return ["no phases recorded (a report written before they were)"]
    out = []
    for p in runs:
        out += [lines(p)[0], "  worker time: " + ", ".join(f"{k} {_s(v)}" for k, v in p["worker_s"].items())]
        by = p.get("compile_s_by_backend") or {}
        if by:
            out.append("  first compiles by backend: " + ", ".join(f"{k} {_s(v)}" for k, v in by.items()))
    return out
