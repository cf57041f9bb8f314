"""Every command the README and docs/ show a user runs here, or says why not.

The commands are read from the pages themselves: the ```sh and ```yaml blocks of README.md and
docs/*.md (a ```yaml block's ``- run:`` lines, its ``${{ matrix.NAME }}`` expanded over the values
its comment names). ``COMMANDS`` says, for each command word for word, how it is tested: as
written, in a stated narrower form (the CPU machine cannot run the whole catalogue for each), or
not at all, with the reason (a pytest skip that says it). A command a page gains without an entry
fails ``test_every_command_shown_is_in_the_table``; an entry no page shows any more fails it too.

Each run has a project root of its own (``private_root``: links to the checkout, its own empty
``reports/``), so a command that writes ``reports/runs/...`` and points ``reports/latest`` at it
runs as written, and neither the checkout nor a concurrent run (another xdist worker, another
person's ``pytest harness``) sees it. The runs start together when the first needs them, a few at
a time, each after the runs whose folders it reads.

Adding a command to a page: add its entry to ``COMMANDS`` (or to ``DOC_ONLY``), as ``Way(check)``
to run it as written, ``Way(check, form="...", why="...")`` for a narrower form ({name} in a form
is the root of the runs whose ``root`` is ``name``), ``Elsewhere("file::test", why)`` where
another test runs it, ``InCI(why)`` where ``.ci/run`` does, or ``NotRun("why")``; a check reads
the run's output and files (``Ran``) and asserts what the page promises. E.g. a CPU-only option
``pytest harness --simulate-gpu SIZE`` would be ``Way(check_simulated, "pytest harness
--simulate-gpu 2GiB --backend torch --op rms_norm -n 0", "why narrower")`` with
``check_simulated`` reading the report's *GPU memory* section.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
# The pages whose fenced blocks are read. Every fenced block of them is either commands (a
# COMMAND_LANGS block) or named in OTHER_BLOCKS with what it is instead.
PAGES = ("README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")))
COMMAND_LANGS = ("sh", "yaml")
OTHER_BLOCKS = {  # (page, language, first word of the block): why it is no command
    ("docs/layout.md", "", "impls/"): "the directory tree",
}
# Pages whose ```python blocks are programs a user runs: test_python_snippet runs each as written,
# or in the narrower form SNIPPET_FORMS states.
SNIPPET_PAGES = ("docs/interface.md",)
PROMPTS = re.compile(r"^(    |\t)+(pytest|python|pip|\$) ", re.M)  # an indented (unfenced) code block of commands
CUDA_ONLY_REASONS = {"apex": "fused_layer_norm_cuda not importable", "tilelang": "compiled for sm_90, not executed"}


# -- reading the pages --------------------------------------------------------------------------
FENCE = re.compile(r"^( *)```(\w*)\n(.*?)^\1```\s*$", re.S | re.M)  # indented too (in a list item)


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of each ``` block, a block indented in a list item dedented."""
    return [(m.group(2), textwrap.dedent(m.group(3))) for m in FENCE.finditer(text)]


def python_snippets() -> list[tuple[str, int, str]]:
    """(page, line of the fence, body) of each ```python block of SNIPPET_PAGES."""
    out = []
    for page in SNIPPET_PAGES:
        text = (ROOT / page).read_text()
        out += [(page, text.count("\n", 0, m.start()) + 1, textwrap.dedent(m.group(3)))
                for m in FENCE.finditer(text) if m.group(2) == "python"]
    return out


def _without_comment(line: str) -> str:
    return re.split(r"(?:^|\s)#", line, maxsplit=1)[0].strip()


def commands_in(lang: str, body: str) -> list[str]:
    """The commands of one block: continuations joined, comments dropped, ``&&`` chains split,
    a yaml CI matrix's ``${{ matrix.NAME }}`` made one command per value of ``NAME: [...]``."""
    if lang == "yaml":
        matrix = {name: [v.strip() for v in values.split(",")]
                  for name, values in re.findall(r"#.*?\b(\w+): \[([^\]]*)\]", body)}
        lines = [_without_comment(m) for m in re.findall(r"^\s*- run:\s*(.*)$", body, re.M)]
        out = []
        for line in lines:
            names = re.findall(r"\$\{\{\s*matrix\.(\w+)\s*\}\}", line)
            if not names:
                out.append(line)
                continue
            assert len(set(names)) == 1 and names[0] in matrix, f"no matrix values for {line!r}"
            out += [re.sub(r"\$\{\{\s*matrix\.\w+\s*\}\}", v, line) for v in matrix[names[0]]]
    else:
        out = [_without_comment(line) for line in body.replace("\\\n", " ").splitlines()]
    return [" ".join(part.split()) for cmd in out if cmd for part in cmd.split("&&") if part.strip()]


def shown_commands() -> dict[str, list[str]]:
    """Every command the pages show, with the pages that show it."""
    found: dict[str, list[str]] = {}
    for page in PAGES:
        for lang, body in fenced_blocks((ROOT / page).read_text()):
            if lang in COMMAND_LANGS:
                for cmd in commands_in(lang, body):
                    found.setdefault(cmd, []).append(page)
    return found


# -- how each command is tested -----------------------------------------------------------------
@dataclass
class Ran:
    """One command's run: its exit status, stdout and stderr together, and its project root."""
    command: str
    returncode: int
    output: str
    root: Path
    roots: dict[str, Path] = field(default_factory=dict)  # every run's root, by name

    def lines(self) -> list[str]:
        return self.output.splitlines()

    def report(self, kind: str = "correctness") -> Path:
        """The report the run named on its own line (``normdiff <kind> report: PATH``)."""
        named = re.findall(rf"^normdiff {kind} report: (\S+)$", self.output, re.M)
        assert len(named) == 1, f"{self.command}: no single 'normdiff {kind} report:' line\n{self.output[-3000:]}"
        return Path(named[0])


@dataclass(frozen=True)
class Way:
    """Run and check a command: as written (form None) or as ``form``, in the root ``root``,
    after the runs of the commands in ``after``."""
    check: Callable[[Ran], None]
    form: str | None = None
    why: str = ""
    root: str = ""
    after: tuple[str, ...] = ()


@dataclass(frozen=True)
class NotRun:
    why: str


@dataclass(frozen=True)
class Elsewhere:
    """Run by another test, named ``file::function``, in the form that test states."""
    test: str
    why: str

    def check(self) -> None:
        import ast

        path, name = self.test.split("::")
        tree = ast.parse((ROOT / path).read_text())
        assert name in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, f"{self.test} is gone"


@dataclass(frozen=True)
class InCI:
    """Run by ``.ci/run`` itself (as written, ``python -m`` before pytest, perhaps with more options)."""
    why: str

    @staticmethod
    def check(command: str) -> None:
        lines = (ROOT / ".ci" / "run").read_text().replace("\\\n", " ").splitlines()
        runs = [" ".join(line.split()).removeprefix("python -m ") for line in lines]
        assert any(r == command or r.startswith(command + " ") for r in runs), f".ci/run no longer runs {command!r}"


def json_doc(folder: Path, name: str = "correctness.json") -> dict:
    return json.loads((folder / name).read_text())


def assert_ok(ran: Ran, code: int = 0) -> None:
    assert ran.returncode == code, f"{ran.command}: exit {ran.returncode}, not {code}\n{ran.output[-4000:]}"


def assert_report_line_ends_output(ran: Ran, kind: str = "correctness") -> None:
    """The README: the last line of the output names the report (at most pytest's own summary
    after it)."""
    lines = ran.lines()
    at = max(i for i, line in enumerate(lines) if line.startswith(f"normdiff {kind} report: "))
    rest = [line for line in lines[at + 1:] if line.strip()]
    assert all(line.startswith(("=", "SKIPPED", "XFAIL", "XPASS", "FAILED", "ERROR")) for line in rest), rest[:5]


def run_folder(ran: Ran, kind: str) -> Path:
    """The report's folder: reports/runs/<date-time>-<kind>-<selection>/, reports/latest -> it."""
    folder = ran.report("benchmark" if kind == "bench" else "correctness").parent
    assert folder.parent == ran.root / "reports" / "runs", folder
    assert re.fullmatch(rf"\d{{8}}-\d{{6}}-{kind}(-.*)?", folder.name), folder.name
    assert (ran.root / "reports" / "latest").resolve() == folder.resolve()
    return folder


def skip_reasons(doc: dict) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for r in doc["records"]:
        if r["outcome"] == "skipped":
            out.setdefault(r["kernel"], set()).add(r["reason"])
    return out


def outcomes(doc: dict) -> dict[str, str]:
    return {r["nodeid"]: r["outcome"] for r in doc["records"]}


def bench_skipped(md: str) -> dict[str, str]:
    """The benchmark report's *Skipped* table: kernel -> reason."""
    section = md.split("\n## Skipped", 1)[1].split("\n## ", 1)[0]
    return {m.group(1): m.group(2) for m in re.finditer(r"^\| (\S+) \| (.+?) \| \d+ \|$", section, re.M)}


def bench_counts(md: str) -> tuple[int, int, int]:
    m = re.search(r"^(\d+) benchmarks timed, (\d+) skipped, (\d+) failed\.", md, re.M)
    assert m, md[:2000]
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


# -- the checks: what the pages promise of each command -----------------------------------------
def check_doctor(ran: Ran, names=()) -> dict[str, list[str]]:
    """One screen: the machine, then each backend, and where one cannot run, why (and what to do)."""
    assert_ok(ran)
    lines = ran.lines()
    assert lines[0] == "normdiff doctor" and len(lines) <= 40, len(lines)
    for item in ("python", "torch", "gpu", "triton", "tilelang", "nvcc", "PDL", "pytest-xdist"):
        assert any(re.match(rf"  {item} ", line) for line in lines), item
    assert any(re.match(r"  PDL .*: off \(no CUDA device here\)", line) for line in lines)  # and why
    gpu = lines.index(next(line for line in lines if line.startswith("  gpu ")))
    assert "none visible" in lines[gpu] and "fix:" in lines[gpu + 1]  # what to do about it
    rows: dict[str, list[str]] = {}
    for line in lines[lines.index("backends (runs here: yes / partly / no)") + 1:]:
        if m := re.match(r"  (\w+)\s+(yes|partly|no)\s", line):
            rows[m.group(1)] = [m.group(2)]
        else:
            rows[list(rows)[-1]].append(line.strip())
    for name, (runs, *more) in rows.items():  # a backend that cannot run (all of it) says why
        assert runs == "yes" or any(m.startswith("not here: ") for m in more), (name, more)
    assert {"torch", "triton", "tilelang", "apex", "torch_compile", *names} <= set(rows)
    assert rows["torch"][0] == "yes" and rows["apex"][0] == rows["tilelang"][0] == "no"
    return rows


def check_doctor_plugins(*names: str) -> Callable[[Ran], None]:
    def check(ran: Ran) -> None:
        rows = check_doctor(ran, names)
        for name in names:  # not installed here: why, and the command that installs it
            assert rows[name][0] == "no" and any("pip install" in m for m in rows[name]), rows[name]
    return check


def check_quick_start(ran: Ran) -> None:
    """Eager PyTorch on every case of the profile; its report in a folder of its own, named on
    the last line before pytest's summary; the report's sections in the README's order."""
    assert_ok(ran)
    assert_report_line_ends_output(ran)
    folder = run_folder(ran, "checks")
    doc = json_doc(folder)
    from harness.judging.cases import catalogue

    assert doc["selection"]["profile"] == "quick"  # the default without a GPU
    assert {r["kernel"] for r in doc["records"]} == {"torch.eager", "torch.fused"}  # the plain and the fused family
    from harness.judging.fused_cases import fused_catalogue

    forward = {c.id for c in catalogue("quick") + fused_catalogue("quick")}
    assert forward <= {r.get("case") for r in doc["records"]}  # every case of the profile
    md = (folder / "correctness.md").read_text()
    heads = ["# normdiff correctness report", "| commit |", "| command |", "## Backends", "## Summary",
             "## Failures", "## Closest calls", "## Agreement between kernels"]
    at = [md.find(h) for h in heads]
    assert -1 not in at and at == sorted(at), dict(zip(heads, at))


def check_render_again(ran: Ran) -> None:
    """The markdown again from the JSON: the path printed, the same markdown the run wrote."""
    assert_ok(ran)
    assert ran.lines()[-1] == "reports/latest/correctness.md"
    folder = (ran.root / "reports" / "latest").resolve()
    assert (folder / "correctness.md").read_text() == (ran.root / "written-by-the-run.md").read_text()
    assert (ran.root / "written-by-the-run.md").stat().st_size > 1000


def check_all_backends(ran: Ran) -> None:
    assert_ok(ran)
    folder = run_folder(ran, "checks")
    doc = json_doc(folder)
    from impls import registry

    registry.load_builtins()
    # the built-ins' backends (this worker's registry may also hold plug-ins other tests loaded)
    built_in = {k.backend for k in registry.kernels() if type(k).__module__.startswith(registry.BUILTIN_MODULES)}
    assert built_in == {"torch", "torch_compile", "triton", "tilelang", "apex"}, built_in
    assert built_in <= set(doc["backends"]) and built_in <= {r["backend"] for r in doc["records"]}
    reasons = skip_reasons(doc)
    for backend, why in CUDA_ONLY_REASONS.items():  # skipped with their reason, never failed
        kernels = {r["kernel"] for r in doc["records"] if r["backend"] == backend}
        assert kernels and all(any(why in r for r in reasons.get(k, ())) for k in kernels), (backend, reasons)
    assert set(outcomes(doc).values()) <= {"passed", "skipped"}
    assert any(r["outcome"] == "passed" and r["backend"] == "triton" for r in doc["records"])


def check_shard(k: int) -> Callable[[Ran], None]:
    def check(ran: Ran) -> None:
        assert_ok(ran)
        assert (ran.root / ran.report()).parent == ran.root / f"shard-{k}"
        doc = json_doc(ran.root / f"shard-{k}")
        assert doc["records"] and doc["selection"].get("shard", f"{k}/3") == f"{k}/3"
    return check


def check_merge_shards(ran: Ran) -> None:
    """Merged, the shards' reports are the one report a single run gives."""
    assert_ok(ran)
    merged = ran.root / "reports" / "merged"
    assert ran.lines()[-1].endswith("correctness.md") and (merged / "correctness.md").is_file()
    single = {line for line in (ran.root / "single.txt").read_text().splitlines() if "::" in line}
    parts = [outcomes(json_doc(ran.root / f"shard-{k}")) for k in (1, 2, 3)]
    assert all(parts) and sum(map(len, parts)) == len(single)  # every check of one run, each in one shard
    merged_outcomes = outcomes(json_doc(merged))
    assert set(merged_outcomes) == single and merged_outcomes == {n: o for p in parts for n, o in p.items()}
    assert {"passed", "skipped"} <= set(merged_outcomes.values())


def check_merge_split(ran: Ran) -> None:
    assert_ok(ran)
    out = ran.root / "split"
    both = {**outcomes(json_doc(ran.root / "shard-1")), **outcomes(json_doc(ran.root / "shard-2"))}
    assert (out / "correctness.md").is_file() and outcomes(json_doc(out)) == both


def check_compare(ran: Ran) -> None:
    """New failures, fixed ones, moved errors and skips; and, between benchmark runs, medians."""
    assert_ok(ran)
    for head in ("## New failures (0)", "## Fixed (0)", "## Error moved by more than", "## Skips that appeared",
                 "## Skips that vanished", "## Speed: medians that moved"):
        assert head in ran.output, head


def check_publish(ran: Ran) -> None:
    """The markdown and plots copied, the JSON slimmed and gzipped, readable as the JSON is."""
    assert_ok(ran)
    dest = ran.root / "reports" / "h200"
    printed = {Path(p).name for p in ran.lines()}
    expected = {"correctness.md", "correctness.json.gz", "benchmark.md", "benchmark.json.gz"}
    assert expected <= printed and any(p.startswith("benchmark-") and p.endswith(".png") for p in printed)
    assert all((dest / p).is_file() for p in printed) and not (dest / "correctness.json").exists()
    from harness.report import load_report

    run = (ran.roots["quick"] / "reports" / "latest").resolve()
    assert outcomes(load_report(dest / "correctness.json.gz")) == outcomes(json_doc(run))
    assert (dest / "correctness.md").read_text() == (run / "correctness.md").read_text()


def check_plain_benchmark(ran: Ran) -> None:
    """Issue 51: on a CPU every CUDA-only kernel is skipped with its reason, nothing fails, and
    the report says the run was a CPU smoke run whose times are not measurements."""
    assert_ok(ran)
    folder = run_folder(ran, "bench")
    summary = ran.lines()[-1]
    assert re.search(r"\d+ passed, \d+ skipped", summary) and "failed" not in summary and "error" not in summary, summary
    md = (folder / "benchmark.md").read_text()
    timed, skipped, failed = bench_counts(md)
    assert timed > 0 and skipped > 0 and failed == 0
    assert re.search(r"^\| device \| CPU ", md, re.M)
    assert "**CPU smoke run.**" in md and "its times are not measurements" in md and "Nothing is ranked" in md
    from impls import registry

    registry.load_all()
    rows = bench_skipped(md)
    for backend, why in CUDA_ONLY_REASONS.items():
        for kernel in (k.name for k in registry.kernels([backend])):
            assert why in rows.get(kernel, ""), (kernel, rows.get(kernel))
            assert re.search(rf"^SKIPPED \[\d+\] .*{re.escape(why)}", ran.output, re.M), why
    doc = json_doc(folder, "benchmark.json")
    infos = [b["extra_info"] for b in doc["benchmarks"]]
    pairs = {(ei["op"], ei["dtype"]) for ei in infos if ei.get("family", "plain") == "plain"}
    assert {f"benchmark-{op}-{dt}.png" for op, dt in pairs} <= {p.name for p in folder.glob("*.png")}
    assert len(pairs) == 6  # both ops, every dtype: a plot each
    # The fused ops' rows (harness/benchmarks/bench_fused.py): eager torch timed, a plot per call and dtype.
    fused = {(ei["case"], ei["dtype"]) for ei in infos if ei.get("family") == "fused" and ei["regime"] == "bandwidth"}
    assert fused and {f"benchmark-{case}-{dt}.png" for case, dt in fused} <= {p.name for p in folder.glob("*.png")}


def check_bench_run(backends: set[str], skipped: dict[str, str] = {}) -> Callable[[Ran], None]:  # noqa: B006
    """A benchmark run: nothing failed, ``backends`` timed, ``skipped`` kernels skipped with a
    reason containing the text given, every shape one of the CPU's (``quick``) shapes."""
    def check(ran: Ran) -> None:
        assert_ok(ran)
        folder = run_folder(ran, "bench")
        md = (folder / "benchmark.md").read_text()
        assert bench_counts(md)[2] == 0
        doc = json_doc(folder, "benchmark.json")
        assert {b["extra_info"]["kernel"].split(".")[0] for b in doc["benchmarks"]} == backends
        from harness.judging import shapes

        cpu_shapes = {*shapes.QUICK_BANDWIDTH, *shapes.QUICK_DECODE, *shapes.QUICK_BACKWARD}
        assert {(b["extra_info"]["m"], b["extra_info"]["n"]) for b in doc["benchmarks"]} <= cpu_shapes
        rows = bench_skipped(md) if skipped else {}
        for kernel, why in skipped.items():
            assert why in rows.get(kernel, ""), (kernel, rows)
    return check


def check_bench_gpus(ran: Ran) -> None:
    """On a machine without a GPU: one process, its log and report, and the merged report."""
    assert_ok(ran)
    out = ran.root / "reports" / "runs" / "bench-all"
    assert ran.lines()[-1] == f"merged report of 1 GPU run(s): {out / 'benchmark.md'}"
    assert ran.lines()[0].startswith("no GPU: ") and "--benchmark-only" in ran.lines()[0]
    assert (out / "gpu0.log").is_file() and (out / "gpu0" / "benchmark.json").is_file()
    md = (out / "benchmark.md").read_text()
    assert bench_counts(md)[0] > 0 and bench_counts(md)[2] == 0 and "**CPU smoke run.**" in md


def check_peers(ran: Ran) -> None:
    """On a CPU-only machine apex and liger skip, each with its reason, and torch_compile runs."""
    assert_ok(ran)
    doc = json_doc(run_folder(ran, "checks"))
    reasons = skip_reasons(doc)
    assert any("fused_layer_norm_cuda not importable" in r for r in reasons["apex.fused"])
    assert any("liger" in r for r in reasons["liger.fused"])
    assert {r["outcome"] for r in runs_kernels(doc) if r["backend"] in ("apex", "liger")} == {"skipped"}
    compiled = [r for r in doc["records"] if r["backend"] == "torch_compile"]
    assert any(r["outcome"] == "passed" for r in compiled)
    assert all(r["outcome"] == "passed" or "one case in 3" in r["reason"] for r in compiled)  # the CPU's sample


def runs_kernels(doc: dict) -> list[dict]:
    """The records of checks that call a kernel: not the fused family's bad-input checks, which the
    interface (impls/fused.py) answers before any backend code, so they run for every kernel."""
    return [r for r in doc["records"] if r["test"] != "test_fused_bad_input"]


def check_all_skipped(*backends: str) -> Callable[[Ran], None]:
    """A plug-in whose library is not installed (or cannot run here): every check that calls a
    kernel skipped, each with the reason naming it, and the run exits 0."""
    def check(ran: Ran) -> None:
        assert_ok(ran)
        doc = json_doc(run_folder(ran, "checks"))
        assert {r["backend"] for r in doc["records"]} == set(backends)
        ran_kernels = runs_kernels(doc)
        assert {r["outcome"] for r in ran_kernels} == {"skipped"}
        assert all(r["reason"] for r in ran_kernels)
        assert all(any(b in r["reason"] for b in backends) for r in ran_kernels)
        assert {r["outcome"] for r in doc["records"] if r["test"] == "test_fused_bad_input"} <= {"passed"}
    return check


# -- the table ----------------------------------------------------------------------------------
# The catalogue of a narrowed checks run: every built-in backend, four cases (a forward, a drawn
# and a backward one among them), one process; the workers are the quick start's (as written).
CHECKS = "--op rms_norm --dtype bfloat16 -k '17x129 or 17x1-' -n 0"
NARROW = "the whole catalogue (the README's command) takes CI minutes per backend; this selection, every backend"
SETUP = ("installs packages into the environment the other tests run in; .ci/run runs the CPU set-up as "
         "written (but for the index URL), and tests/test_setup.py holds the two together")
# Shards are made before -k deselects (a -k selection can leave a shard empty), so the shards'
# narrower form selects by backend, op and dtype: eager torch runs, apex skips (CUDA only).
SHARDED = "torch,apex --op rms_norm --dtype bfloat16 -n 0"
SHARDS_WHY = ("--backend all's catalogue takes CI minutes per backend; eager torch and apex, one op and "
              "dtype: checks that pass and checks that skip in each shard")
SINGLE = "the checks one run of the shards' selection holds"  # a helper (HELPERS), no page's command
COMMANDS: dict[str, Way | NotRun | Elsewhere | InCI] = {
    # Set up and run
    "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu": NotRun(SETUP),
    "pip install -e '.[triton,tilelang,test]' 'triton==3.6.0'": NotRun(SETUP),
    "pip install -e '.[triton,test]'": NotRun("the GPU machine's set-up (it keeps a CUDA torch); " + SETUP),
    "python -m harness.doctor": Way(check_doctor),
    "pytest harness --backend torch": Way(check_quick_start, root="quick"),
    "pytest harness --backend all": Way(check_all_backends, f"pytest harness --backend all {CHECKS}", NARROW,
                                        root="all"),
    "pytest harness --backend all --simulate-gpu 24GiB": InCI(
        "run by .ci/run itself, whole (the checks of the quick profile through the memory layer of a simulated "
        "24 GiB card), then on a 2 GiB card whose report .ci/assert-memory-run judges; tests/test_devmem.py and "
        "tests/test_harness_errors.py run the option in smaller forms"),
    **{cmd: Elsewhere("tests/test_first_hour_path.py::test_the_readme_first_hour_path",
                      "the README's first hour, run in order with a home of its own and the bug planted between")
       for cmd in ("mkdir -p ~/mine", "cp examples/triton_rms_backend.py ~/mine/my_rms.py",
                   "pytest harness --backend-file ~/mine/my_rms.py --backend mytriton --report-dir ~/mine/before",
                   "pytest harness --backend-file ~/mine/my_rms.py --backend mytriton --report-dir ~/mine/after",
                   "python -m harness.report --compare ~/mine/before ~/mine/after")},
    "pytest tests": InCI("run by .ci/run itself, whole: this file is one of its tests, so running it from "
                         "here would run this file again, and that again"),
    "pytest --benchmark-only": Way(check_plain_benchmark, root="bench"),
    "pytest --benchmark-only --bench-set full": Way(
        check_bench_run({"torch"}), "pytest --benchmark-only --bench-set full --backend torch --op layer_norm "
        "--dtype float32", "on the CPU the sweep is the quick shapes, every backend and dtype: the plain "
        "run above times those; this one checks --bench-set full keeps to them"),
    "pytest --benchmark-only --backend torch,triton --op rms_norm --dtype bfloat16": Way(check_bench_run(
        {"torch"}, {"triton.rowwise": "runs under its interpreter on this machine: not a timing"}), root="tt"),
    "python -m harness.bench_gpus --out reports/runs/bench-all": Way(
        check_bench_gpus, "python -m harness.bench_gpus --out reports/runs/bench-all --backend torch --op rms_norm "
        "--dtype bfloat16", "the pytest options after --out narrow the sweep as they narrow pytest's (the plain "
        "benchmark run above is the whole one); without a GPU bench_gpus starts one process"),
    # Shards: the yaml CI matrix, and the merge of its three folders
    **{f"pytest harness --backend all --shard {k}/3 --report-dir=shard-{k}": Way(
        check_shard(k), f"pytest harness --backend all --shard {k}/3 --report-dir=shard-{k}".replace("all", SHARDED),
        SHARDS_WHY, root="shards") for k in (1, 2, 3)},
    "python -m harness.report shard-1/correctness.json shard-2/correctness.json shard-3/correctness.json "
    "--out reports/merged": Way(check_merge_shards, root="shards", after=(SINGLE, *(
        f"pytest harness --backend all --shard {k}/3 --report-dir=shard-{k}" for k in (1, 2, 3)))),
    # Reading a report
    "python -m harness.report reports/latest/correctness.json": Way(
        check_render_again, "cp reports/latest/correctness.md written-by-the-run.md && "
        "python -m harness.report reports/latest/correctness.json", "as written, in the quick start's root, "
        "after keeping the markdown the run wrote", root="quick", after=("pytest harness --backend torch",)),
    "python -m harness.report --compare reports/runs/A reports/runs/B": Way(
        check_compare, "python -m harness.report --compare {quick}/reports/latest {all}/reports/latest && "
        "python -m harness.report --compare {bench}/reports/latest {tt}/reports/latest",
        "A and B: two check runs, then two benchmark runs (the speed section)", after=(
            "pytest harness --backend torch", "pytest harness --backend all", "pytest --benchmark-only",
            "pytest --benchmark-only --backend torch,triton --op rms_norm --dtype bfloat16")),
    "python -m harness.report a.json b.json --out DIR": Way(
        check_merge_split, "python -m harness.report shard-1/correctness.json shard-2/correctness.json --out split",
        "a.json and b.json: two of the shards' reports", root="shards", after=(
            "pytest harness --backend all --shard 1/3 --report-dir=shard-1",
            "pytest harness --backend all --shard 2/3 --report-dir=shard-2")),
    "python -m harness.report --publish reports/runs/<run> reports/h200": Way(
        check_publish, "python -m harness.report --publish {quick}/reports/latest reports/h200 && "
        "python -m harness.report --publish {bench}/reports/latest reports/h200", "<run>: the quick start's "
        "checks, then the plain benchmark run (plots), into this root's own reports/h200, not the committed one",
        after=("pytest harness --backend torch", "pytest --benchmark-only")),
    # Backends: the peers, and Liger as a plug-in (not installed on the CPU machine)
    "pytest harness --backend apex,torch_compile,liger --backend-file examples/liger_backend.py": Way(
        check_peers, f"pytest harness --backend apex,torch_compile,liger --backend-file examples/liger_backend.py "
        f"{CHECKS}", NARROW),
    "python -m harness.doctor --backend-file examples/liger_backend.py": Way(check_doctor_plugins("liger")),
    "pytest harness --backend-file examples/liger_backend.py --backend liger": Way(
        check_all_skipped("liger"), "pytest harness --backend-file examples/liger_backend.py --backend liger -n 0",
        "in one process: every check skips here (the workers' start would be most of the run)"),
    "pytest --benchmark-only --backend-file examples/liger_backend.py --backend liger,triton": Way(
        check_bench_run(set(), {"liger.fused": "liger", "triton.rowwise": "interpreter"}),
        "pytest --benchmark-only --backend-file examples/liger_backend.py --backend liger,triton --op rms_norm "
        "--dtype bfloat16", "one op and dtype: every benchmark of it skips here (liger not installed, Triton "
        "under its interpreter), as every other one would"),
}
# Commands only docs/ shows (docs/benchmarks.md and docs/reports.md repeat the README's).
DOC_ONLY: dict[str, Way | NotRun | Elsewhere | InCI] = {
    "pip install quack-kernels==0.6.5 flashinfer-python==0.7.2.post1 nvidia-cutlass-dsl==4.7.1 "
    "apache-tvm-ffi==0.1.12": NotRun("GPU-only plug-ins' libraries (CuTe DSL kernels need a Hopper GPU); " + SETUP),
    "pytest harness --backend 'quack*,flashinfer*' --backend-file examples/quack_backend.py "
    "--backend-file examples/flashinfer_backend.py": Way(check_all_skipped("quack", "flashinfer"),
                                                         "pytest harness --backend 'quack*,flashinfer*' "
                                                         "--backend-file examples/quack_backend.py --backend-file "
                                                         "examples/flashinfer_backend.py -n 0",
                                                         "in one process: every check skips here"),
    "python -m harness.doctor --backend-file examples/quack_backend.py --backend-file examples/flashinfer_backend.py":
        Way(check_doctor_plugins("quack", "flashinfer")),
    "pytest --benchmark-only -m fused": Elsewhere(
        "tests/test_bench_fused.py::test_a_cpu_run_of_the_fused_benchmarks",
        "the fused benchmarks alone, narrowed to add_rms_norm and rms_norm in bfloat16 with 3 rounds, with an "
        "in-place-only peer plug-in: eager torch timed, every other kernel skipped with its reason"),
}
MINE = "a plug-in file anywhere, run from anywhere: its reports go to the checkout's reports/runs/ unless " \
    "--report-dir says otherwise, so the test runs it with --report-dir into a temporary folder"
FIRST_HOUR = "tests/test_first_hour.py::"
DOC_ONLY.update({  # docs/backends.md, *Your own plug-in*
    "pytest harness --backend-file ~/mine/my_triton_rms.py --backend mytriton --profile quick": Elsewhere(
        FIRST_HOUR + "test_the_checks_run_from_another_directory", MINE),
    "pytest --backend-file ~/mine/my_triton_rms.py --backend mytriton": Elsewhere(
        FIRST_HOUR + "test_the_option_alone_with_equals_runs_the_checks", MINE + " (and collects only)"),
    "pytest --benchmark-only --backend-file ~/mine/my_triton_rms.py --backend mytriton": Elsewhere(
        FIRST_HOUR + "test_the_benchmarks_run_from_another_directory_and_skip_interpreted_timings", MINE),
    "pytest harness --backend-file examples/triton_rms_backend.py --backend mytriton --profile quick": InCI(
        "run by .ci/run itself, whole (with its own --report-dir)"),
})
DOC_ONLY.update({  # docs/repro.md: a failure's standalone repro
    "python -m harness.repro 'harness/test_differential.py::test_against_oracle[rms_norm-bfloat16-3x1000-normal-"
    "mytriton.rowwise]' --backend-file ~/mine/my_rms.py --report ~/mine/after/correctness.json --out repro.py": Elsewhere(
        "tests/test_repro.py::test_the_first_hour_s_planted_bug_gives_a_repro_with_the_triton_kernel_inline",
        "the first hour's planted bug, its repro written from the node id and run without the project"),
    "python repro.py": Elsewhere("tests/test_repro.py::test_the_repro_prints_what_the_check_found",
                                 "each repro run in a Python without the project, its lines and exit status read"),
    "python -m harness.repro NODEID --shrink --out small.py": Elsewhere(
        "tests/test_repro_shrink.py::test_the_command_writes_the_shrunk_repro", "a planted padded-N bug's node id"),
    "python -m harness.repro --report RUN/correctness.json --all": Elsewhere(
        "tests/test_repro_report.py::test_the_report_names_and_writes_each_failure_s_repro", "after a real run's report"),
    "python -m harness.report RUN/correctness.json --repros": Elsewhere(
        "tests/test_repro_report.py::test_the_report_names_and_writes_each_failure_s_repro", "after a real run's report"),
})
DOC_ONLY.update({  # docs/interface.md, *Adding a backend* and *Adding a fused backend*
    "pytest harness --backend-file examples/outside_backend.py --backend mynorm": Elsewhere(
        "tests/test_outside_backends.py::test_backend_from_a_file_runs_like_a_builtin",
        "narrowed to RMSNorm in bfloat16 on the quick profile, its report read"),
    "pytest harness --backend-file examples/triton_fused_backend.py --backend myfused --profile quick": InCI(
        "run by .ci/run itself, whole (with its own --report-dir); its report judged by .ci/assert-fused-example"),
})
TABLE = {**COMMANDS, **DOC_ONLY}
HELPERS: dict[str, Way] = {  # runs the checks above read, for no page's command
    SINGLE: Way(lambda ran: assert_ok(ran), f"pytest harness --backend {SHARDED} --collect-only -q > single.txt",
                root="shards"),
}
JOBS = {**TABLE, **HELPERS}


# -- running them -------------------------------------------------------------------------------
def private_root(path: Path) -> Path:
    """A project root of its own: a link to each entry of the checkout but ``reports``, which is
    its own, empty (so reports/latest and reports/runs/ are this root's alone)."""
    path.mkdir(parents=True)
    for entry in ROOT.iterdir():
        if entry.name not in ("reports", ".pytest_cache"):
            (path / entry.name).symlink_to(entry)
    (path / "reports").mkdir()
    return path


def child_env() -> dict[str, str]:
    """This Python's environment for a command a person types: its interpreter first on PATH
    (``pytest``, ``python``), none of the enclosing pytest's own variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return env


class Runs:
    """The selected commands' runs: started together, a few at a time, each after the runs it
    reads; ``get(command)`` waits for one."""

    def __init__(self, base: Path, commands: list[str]):
        self.base, self.env = base, child_env()
        names = {w.root for w in JOBS.values() if isinstance(w, Way) and w.root}
        self.roots = {name: private_root(base / name) for name in sorted(names)}
        self.futures: dict[str, Future] = {}
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(max_workers=3)
        for command in sorted(self._with_deps(commands), key=self._order):
            self._submit(command)

    def _with_deps(self, commands: list[str]) -> set[str]:
        todo, seen = list(commands), set()
        while todo:
            c = todo.pop()
            if c not in seen and isinstance(JOBS[c], Way):
                seen.add(c)
                todo += JOBS[c].after
        return seen

    @staticmethod
    def _order(command: str) -> tuple[int, str]:
        """The longest first, then whatever others read; a run never waits on one queued after it."""
        way = JOBS[command]
        return (0 if command in ("pytest --benchmark-only", "pytest harness --backend torch") else
                2 if way.after else 1, command)

    def _submit(self, command: str) -> None:
        with self.lock:
            if command not in self.futures:
                self.futures[command] = self.pool.submit(self._run, command)

    def _run(self, command: str) -> Ran:
        way = JOBS[command]
        for dep in way.after:
            self.get(dep)  # queued before this one (_order): running or done, never waiting on us
        if way.root:
            root = self.roots[way.root]
        else:
            root = private_root(self.base / re.sub(r"[^\w.-]+", "_", command)[:80])
        form = (way.form or command).format(**{k: str(v) for k, v in self.roots.items()})
        started = time.monotonic()
        proc = subprocess.run(form, shell=True, executable="/bin/bash", cwd=root, env=self.env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
        took = f"# exit {proc.returncode} after {time.monotonic() - started:.1f} s"
        (root / f"output-{len(list(root.glob('output-*')))}.txt").write_text(f"$ {form}\n{took}\n{proc.stdout}")
        return Ran(form, proc.returncode, proc.stdout, root, self.roots)

    def get(self, command: str) -> Ran:
        self._submit(command)
        return self.futures[command].result()


def selected_commands(session) -> list[str]:
    return [item.callspec.params["command"] for item in session.items
            if getattr(item, "originalname", None) == "test_command" and item.path == Path(__file__)]


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory):
    if torch.cuda.is_available():
        pytest.skip("written for the CPU machine (CI): with a GPU the profile is full and every command "
                    "runs for minutes to hours, and the CUDA-only kernels run instead of skipping")
    chosen = [c for c in selected_commands(request.session) if isinstance(JOBS[c], Way)]
    runner = Runs(tmp_path_factory.mktemp("readme-commands"), chosen)
    yield runner
    runner.pool.shutdown(wait=True)


# -- the tests ----------------------------------------------------------------------------------
def test_every_command_shown_is_in_the_table():
    shown = shown_commands()
    missing = sorted(set(shown) - set(TABLE))
    assert not missing, "commands shown without an entry in tests/test_readme_commands.py TABLE:\n" + \
        "\n".join(f"  {c!r} ({', '.join(shown[c])})" for c in missing)
    stale = sorted(set(TABLE) - set(shown))
    assert not stale, f"entries no page shows any more: {stale}"
    readme = {c for c, pages in shown.items() if "README.md" in pages}
    assert readme == set(COMMANDS), sorted(readme ^ set(COMMANDS))  # DOC_ONLY: shown only in docs/


def test_every_code_block_is_commands_or_says_what_it_is():
    """A fenced block is commands (sh, yaml) or named in OTHER_BLOCKS; no page shows commands
    in an indented block, which the table would not see."""
    others = set()
    for page in PAGES:
        text = (ROOT / page).read_text()
        for lang, body in fenced_blocks(text):
            if lang == "python" and page in SNIPPET_PAGES:
                continue  # run by test_python_snippet
            if lang not in COMMAND_LANGS:
                key = (page, lang, body.split(None, 1)[0] if body.strip() else "")
                assert key in OTHER_BLOCKS, f"{page}: a ```{lang} block neither commands nor in OTHER_BLOCKS: {key}"
                others.add(key)
        outside = FENCE.sub("", text)
        assert not PROMPTS.search(outside), f"{page}: an indented block of commands: {PROMPTS.search(outside)[0]!r}"
    assert others == set(OTHER_BLOCKS)


def test_reading_the_blocks():
    """The reader itself: comments, continuations, && chains and a CI matrix."""
    sh = "a --x 1   # what a does\n   # more words\nb \\\n  --y 'q*,r*' && c --z\n"
    assert commands_in("sh", sh) == ["a --x 1", "b --y 'q*,r*'", "c --z"]
    yaml = ("# a CI matrix: shard: [1, 2]\n- run: t --shard ${{ matrix.shard }}/2 --dir=s-${{ matrix.shard }}\n"
            "# then\n- run: m s-1 s-2 --out o   # merge\n")
    assert commands_in("yaml", yaml) == ["t --shard 1/2 --dir=s-1", "t --shard 2/2 --dir=s-2", "m s-1 s-2 --out o"]
    with pytest.raises(AssertionError, match="no matrix values"):
        commands_in("yaml", "- run: t ${{ matrix.gpu }}\n")
    assert fenced_blocks("x\n```sh\np q\n```\n```\ntree\n```\n") == [("sh", "p q\n"), ("", "tree\n")]
    assert fenced_blocks("- a list item:\n\n  ```sh\n  p q\n  ```\n") == [("sh", "p q\n")]  # indented in it


@pytest.mark.parametrize("command", sorted(TABLE), ids=sorted(TABLE))
def test_command(command, request):
    way = JOBS[command]
    if isinstance(way, NotRun):
        pytest.skip(f"not run: {way.why}")
    if isinstance(way, Elsewhere):
        return way.check()
    if isinstance(way, InCI):
        return way.check(command)
    way.check(request.getfixturevalue("runs").get(command))


# Snippets that cannot run here as written: a line of the snippet -> (what it becomes, why).
SNIPPET_FORMS: dict[str, tuple[str, str]] = {}


def test_every_snippet_form_is_used():
    bodies = "\n".join(body for _, _, body in python_snippets())
    assert python_snippets(), f"no ```python block in {SNIPPET_PAGES}"
    assert not [line for line in SNIPPET_FORMS if line not in bodies], "a form for a line no snippet has"


@pytest.mark.parametrize("page,line,body", python_snippets(), ids=[f"{p}:{n}" for p, n, _ in python_snippets()])
def test_python_snippet(page, line, body):
    """Each ```python block of SNIPPET_PAGES runs as written, in a fresh Python from the project's
    root (its imports at its top: nothing else is defined for it), or in its stated narrower form."""
    for written, (form, _why) in SNIPPET_FORMS.items():
        body = body.replace(written, form)
    proc = subprocess.run([sys.executable, "-c", body], cwd=ROOT, env=child_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, f"{page}:{line}: exit {proc.returncode}\n{body}\n{proc.stdout[-2000:]}{proc.stderr[-4000:]}"
