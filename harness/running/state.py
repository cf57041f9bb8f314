"""The run's state in each process (``HarnessState``, registered as a plugin object by
harness.plugin): the selected kernels and cases, the records of the checks (harness.running.records), the
agreement between kernels, the watch of kernel calls or the controller; it writes the correctness
report."""
from __future__ import annotations

import functools
import time
import zlib
from dataclasses import dataclass, field

import pytest

from harness.judging import compare, known_issues
from harness.running import clock, isolation
from harness.judging.cases import Case
from harness.running.controller import Controller
from harness.running.records import collect_records, fold_report, save_collection
from harness.report import add_agreement_cell
from harness.report.phases import summarise as summarise_phases
from harness.running.run import backend_status, environment, invocation, is_benchmark_run, point_latest, report_dir
from harness.judging.family import Family
from harness.judging.runner import CheckResult, OracleCache, device_for
from impls.contract import KernelContract


def quick_cpu_kept(case: Case, every: int) -> bool:
    """Whether a kernel that checks one case in ``every`` on the CPU's quick profile checks this
    one: by a hash of the case id, not its seed, whose residues already pick the quick profile's
    determinism sample (shapes.DETERMINISM_EVERY_QUICK)."""
    return zlib.crc32(f"quick-cpu:{case.id}".encode()) % every == 0


@dataclass
class FamilyRun:
    """What a run selects of one family (harness.judging.family): its kernels, its forward and
    backward cases, and the (case, kernel) pairs its checks run."""

    family: Family
    kernels: list[KernelContract]
    cases: list[Case]
    backward_cases: list[Case]
    pairs: list[tuple]
    backward_pairs: list[tuple]


@dataclass(eq=False)  # hashed by identity: pytest keeps the plugin objects it has seen in a set
class HarnessState:
    runs: dict[str, FamilyRun]  # by family name
    profile: str
    selection: dict
    batch_cases: list[Case] = field(default_factory=list)  # harness/test_properties.py's
    backward_batch_cases: list[Case] = field(default_factory=list)  # harness/test_backward.py's batch invariance
    # harness/test_fused_properties.py's (case, kernel) per fixture (harness.judging.fused_properties)
    fused_property_pairs: dict[str, list[tuple]] = field(default_factory=dict)
    records: dict[str, dict] = field(default_factory=dict)  # nodeid -> record
    oracle: OracleCache = field(default_factory=OracleCache)  # harness/test_differential.py's and the agreement's
    # Agreement: (op, dtype, kernel_a, kernel_b) -> [max difference in allowed errors, cases, worst case]
    agreement: dict[tuple[str, str, str, str], list] = field(default_factory=dict)
    # Kernels compiled without being run (compile-only checks), for the report's compiled section.
    compiled: list[dict] = field(default_factory=list)
    config: pytest.Config | None = None
    # nodeid -> {kind, detail, ...} for checks whose worker died (the controller's record)
    crashes: dict[str, dict] = field(default_factory=dict)
    collected: bool = False  # records hold the whole collection (this process's, or a worker's)
    watch: isolation.CallWatch | None = None
    controller: Controller | None = None
    session: pytest.Session | None = None
    _last_case: str | None = None
    _last_outputs: dict = field(default_factory=dict)
    _last_scales: compare.AgreementScales | None = None
    started: float = field(default_factory=time.time)
    _last_write: float = field(default_factory=time.time)

    # The check files of the project's families read their own runs by these names.
    kernels = property(lambda self: self._run("plain").kernels)
    cases = property(lambda self: self._run("plain").cases)
    backward_cases = property(lambda self: self._run("plain").backward_cases)
    fused_kernels = property(lambda self: self._run("fused").kernels)
    fused_pairs = property(lambda self: self._run("fused").pairs)
    fused_backward_pairs = property(lambda self: self._run("fused").backward_pairs)

    def _run(self, name: str) -> FamilyRun:
        return self.runs.get(name) or FamilyRun(None, [], [], [], [], [])

    @property
    def all_kernels(self) -> list[KernelContract]:
        return [k for run in self.runs.values() for k in run.kernels]

    @functools.cached_property
    def case_index(self) -> dict[str, Case]:
        """Every case a check of this run draws inputs from, by id (built once: the scheduler reads
        it per check): it weighs checks by their case's size and keeps the largest in few lanes per
        GPU (their GPU memory). The batch-invariance cases are among the largest (4096 x 65536 on
        the full profile)."""
        cases = [c for run in self.runs.values() for c in run.cases + run.backward_cases]
        cases += [c for run in self.runs.values() for c, _ in run.pairs + run.backward_pairs]
        cases += [c for pairs in self.fused_property_pairs.values() for c, _ in pairs]
        return {c.id: c for c in cases + self.batch_cases + self.backward_batch_cases}

    @property
    def kernel_index(self) -> dict[tuple[str, str], KernelContract]:
        return {(k.name, k.op): k for k in self.all_kernels}

    @staticmethod
    def device_for(kernel: KernelContract) -> str:
        return device_for(kernel)

    def left_out(self, kernel: KernelContract, case: Case) -> str | None:
        """Why the quick profile on the CPU leaves this (case, kernel) pair out
        (``NormKernel.quick_cpu_every``), or None: cases sampled by quick_cpu_kept, known issues
        always kept. Applied at collection to every check of the pair."""
        every = kernel.quick_cpu_every
        device = device_for(kernel)
        if (self.profile != "quick" or every <= 1 or device != "cpu" or quick_cpu_kept(case, every)
                or known_issues.known_issue(kernel, case, device)):
            return None
        return (f"quick profile on the CPU: {kernel.name} checks one case in {every} here (every new shape "
                f"compiles for seconds); the full profile checks every case")

    def adopt_collection(self, records: dict[str, dict]) -> None:
        """The controller takes a worker's collected records (workers collect, it does not)."""
        self.records = {nid: {**rec, **self.records.get(nid, {})} for nid, rec in records.items()}
        self.collected = True

    def write_report(self, final: bool) -> None:
        """Write the report; during the run every PARTIAL_REPORT_S too, marked as partial, so a
        run that is killed still leaves the last good report."""
        config = self.config
        if not self.records or config.getoption("no_report") or isolation.worker_id(config):
            return
        # A benchmark run skips every check: its report would say nothing and replace a real one.
        if is_benchmark_run(config) or not any("outcome" in r for r in self.records.values()):
            return
        from harness.report import build_document, write_report

        ran = sum(1 for r in self.records.values() if "outcome" in r)
        doc = build_document(
            records=self.records,
            agreement=self.agreement,
            compiled=self.compiled,
            backends=backend_status(self.all_kernels),
            selection=self.selection,
            environment=environment(self.all_kernels),
            command=invocation(config),
            elapsed=time.time() - self.started,
        )
        doc["progress"] = {"final": final, "ran": ran, "collected": len(self.records)}
        doc["phases"] = [summarise_phases(doc["records"], clock.clock(config), time.time())]
        directory = report_dir(config, "checks")
        config._normdiff_report = write_report(doc, directory)  # noqa: SLF001 (terminal summary)
        point_latest(config, directory)
        self._last_write = time.time()

    def record_agreement(self, result: CheckResult) -> list[tuple]:
        """Compare this check's outputs (y, and the statistics both wrote) with every kernel that
        ran the same case before it in this process; returns the comparisons, (op, dtype, a, b,
        difference, case id and the output furthest apart), which reach the controller with the
        check's report (add_agreement)."""
        case = result.case
        if case.id != self._last_case:
            self._last_case, self._last_outputs, self._last_scales = case.id, {}, None
        if result.outputs is None:
            return []
        if self._last_scales is None:
            inputs, ref = self.oracle.get(case, result.outputs.y.device.type)
            self._last_scales = compare.AgreementScales(case.op, ref, case.torch_dtype, inputs.weight)
        mine = (result.outputs, result.y_extra, result.stat_dtype)
        found = []
        for other, (d, output) in compare.agreements(self._last_scales, mine, self._last_outputs).items():
            a, b = sorted((result.kernel, other))
            found.append((case.op, case.dtype, a, b, float(d), case.id if output == "y" else f"{case.id} ({output})"))
        self._last_outputs[result.kernel] = mine
        return found

    def forget_case(self) -> None:
        """Drop the last case's inputs, oracle and kept outputs (its checks are over here)."""
        self.oracle.forget()
        for run in self.runs.values():
            run.family.forget()
        self._last_case, self._last_outputs, self._last_scales = None, {}, None

    def add_agreement(self, op, dtype, a, b, d, case_id) -> None:
        add_agreement_cell(self.agreement.setdefault((op, dtype, a, b), [0.0, 0, ""]), d, 1, case_id)

    # Registered as a plugin object, so pytest calls these hooks too; what they do to the
    # records is harness.running.records'.
    def pytest_collection_modifyitems(self, items):
        collect_records(self, items)

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_finish(self, session):
        save_collection(self)

    def pytest_sessionstart(self, session):
        self.session = session

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_makereport(self, item, call):
        # How many of this check's kernel calls compiled first (harness.running.progress counts them).
        if call.when == "call" and self.watch is not None and self.watch.item_compiles:
            item.user_properties.append(("normdiff", {"compiled": self.watch.item_compiles,
                                                      "compile_s": round(self.watch.item_compile_s, 3)}))

    def pytest_runtest_logstart(self, nodeid, location):
        if self.watch is not None:
            self.watch.start_item(nodeid)

    def pytest_runtest_logfinish(self, nodeid, location):
        if self.watch is not None:
            rec = self.records.get(nodeid, {})
            self.watch.end_item(rec.get("kernel"), rec.get("case"), self.session)
            fatal = self.watch.fatal
            if fatal is not None and fatal.get("phase") == "test" and nodeid not in self.crashes:
                # one process: the test's report went out before the error was found; charge it now
                self.crashes[nodeid] = fatal
                self.records.setdefault(nodeid, {}).update(outcome="failed", failure_kind="crashed", crash=fatal)

    def pytest_runtest_setup(self, item):
        rec = self.records.get(item.nodeid)
        if rec and self.watch is not None:
            why = self.watch.banned(rec["kernel"])
            if why:
                pytest.skip(why)

    def pytest_deselected(self, items):  # -k, -m: not part of this run
        for item in items:
            self.records.pop(item.nodeid, None)

    def pytest_runtest_logreport(self, report):  # every phase of every test
        fold_report(self, report)
