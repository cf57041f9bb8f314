"""Progress a person can read during a long run, through pytest's terminal reporter: every
PROGRESS_S seconds one line with the checks done of those collected, per backend, the compile
checks and the first calls that compiled, the elapsed time and an estimate of what remains.
Plain lines, so a CI log without a terminal reads the same."""
from __future__ import annotations

import time
from collections import Counter

PROGRESS_S = 20.0


class Progress:
    def __init__(self, config, state):
        self.config, self.state = config, state
        self.started = time.time()
        self.last = self.started
        self.every = config.getoption("progress_every")
        self.done: Counter = Counter()
        self.compiles = 0

    def total(self) -> Counter:
        return Counter(self.phase(r) for r in self.state.records.values())

    @staticmethod
    def phase(rec: dict) -> str:
        return "compile" if "compile" in rec.get("test", "") else rec.get("backend", "?")

    def pytest_runtest_logreport(self, report):
        rec = self.state.records.get(report.nodeid)
        if rec is None or not (report.when == "call" or (report.when == "setup" and not report.passed)
                               or report.when == "???"):
            return
        self.done[self.phase(rec)] += 1
        for name, value in report.user_properties if report.when == "call" else ():
            if name == "normdiff" and value.get("compiled"):
                self.compiles += value["compiled"]
        if time.time() - self.last >= self.every:
            self.write()

    def pytest_terminal_summary(self, terminalreporter):
        """After the report is written: where the run's time went, and what a run cut short left
        with the one command that runs only that (harness.report.phases, cut_short)."""
        paths = getattr(self.config, "_normdiff_report", None)
        if not paths:
            return
        from harness.report import cut_short, load_report, phases

        try:
            doc = load_report(paths[1])
        except (OSError, ValueError) as exc:
            terminalreporter.write_line(f"normdiff: the report could not be read back ({exc})")
            return
        for line in phases.text(doc):
            terminalreporter.write_line(("normdiff phases: " if not line.startswith(" ") else "") + line)
        for line in cut_short.terminal_lines(doc):
            terminalreporter.write_line(line)

    def line(self) -> str:
        total = self.total()
        done, all_ = sum(self.done.values()), sum(total.values())
        parts = [f"{p} {self.done[p]}/{n}" + (" done" if self.done[p] >= n else "")
                 for p, n in sorted(total.items(), key=lambda x: (x[0] == "compile", x[0]))]
        return (headline(self.started, done, all_, "checks") + " | " + " | ".join(parts)
                + (f" | first calls that compiled: {self.compiles}" if self.compiles else ""))

    def write(self) -> None:
        self.last = time.time()
        if self.state.records:
            emit(self.config, self.line())


def headline(started: float, done: int, total: int, what: str) -> str:
    """"[normdiff 120 s] 40/300 checks, about 780 s left": the start of a progress line."""
    elapsed = time.time() - started
    eta = f", about {elapsed / done * (total - done):.0f} s left" if done and total > done else ""
    return f"[normdiff {elapsed:.0f} s] {done}/{total} {what}{eta}"


def emit(config, line: str) -> None:
    """One progress line through pytest's terminal reporter (plain, so a CI log reads the same)."""
    tr = config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None:
        tr.ensure_newline()
        tr.write_line(line)
