"""One standalone repro file from a Target: header, constants, the inputs drawn as the harness
draws them, the write guard, the call through the kernel's library, the float64 reference, the
allowance with the harness's constants, and a ``main`` that prints the worst element, its error
and the ratio to the allowance, exiting 1 while the defect is present."""
from __future__ import annotations

import textwrap
from pathlib import Path

from harness.judging.fused_runner import declared_sum, kernel_scale
from harness.judging.guards import GAP, HEAD, TAIL
from harness.report.markdown import fmt
from harness.repro import draw, judge_src, mains
from harness.repro.target import Target, plugin_file
from impls import registry
from impls.fused import BASE_OP

ROOT = Path(__file__).resolve().parents[2]

CHECK_WORDS = {(False, False): "the forward against a float64 reference, inside a write guard",
               (False, True): "the kernel's forward, then its backward against float64 gradients, inside a write guard",
               (True, False): "the fused forward with the case's write convention against a float64 reference, "
                              "inside a write guard",
               (True, True): "the fused forward, then its backward against float64 gradients, inside a write guard"}
SIGNATURES = {(False, False): "x, weight, bias, eps, out", (False, True): "x, weight, bias, dy, saved, eps, out",
              (True, False): "x, residual, weight, bias, eps, params, out",
              (True, True): "src, weight, bias, dy, d_residual_out, saved, eps, weight_offset, out"}
FALLBACK_CALLS = {
    (False, False): "KERNEL._forward(x, weight, bias, eps, NormOutputs(out.y, out.mean, out.rstd))",
    (False, True): "KERNEL._backward(x, weight, bias, dy, NormOutputs(saved.y, saved.mean, saved.rstd), eps, "
                   "NormGrads(out.dx, out.dw, out.db))",
    (True, False): "KERNEL._forward(x, residual, weight, bias, eps, FusedParams(params.weight_offset, params.out_dtype, "
                   "params.scale, params.write), FusedOutputs(out.y, out.residual_out, out.mean, out.rstd))",
    (True, True): "KERNEL._backward(src, weight, bias, dy, d_residual_out, FusedOutputs(saved.y, None, saved.mean, "
                  "saved.rstd), eps, weight_offset, FusedGrads(out.dx, out.dresidual, out.dw, out.db))"}


def reported(record: dict | None) -> list[str]:
    """What the report printed for the check: each output out of tolerance, each guard finding, or
    the exception's line."""
    if not record:
        return []
    lines = []
    for f in record.get("findings") or ():
        where = "buffer offset" if f["kind"] == "out-of-bounds write" else "element"
        lines.append(f"guard: {f['output']}: {f['count']} {f['kind']} element(s), first at {where} {f['first']}")
    for e in record.get("errors") or ():
        if e.get("mismatched"):
            lines.append(f"{e['output']}: {e['mismatched']}/{e['numel']} out of tolerance, max abs err "
                         f"{fmt(e['max_abs'])}, {e['worst_ratio']:.3g}x the allowed error, worst at {e['worst_index']}")
    if not lines and record.get("message"):
        said = [ln[1:].strip() for ln in record["message"].splitlines() if ln.startswith("E ")]
        lines.append((said or record["message"].strip().splitlines()[-1:] or ["failed"])[0][:300])
    return lines


def header(t: Target, command: str) -> list[str]:
    env, k, case = t.environment, t.kernel, t.case
    card = env.get("gpu") or "no GPU (CPU)"
    seen = [f"card {card}", f"driver {env.get('driver') or '-'}", f"CUDA {env.get('cuda') or '-'}",
            f"torch {env.get('torch')}", env.get("versions") or "", f"commit {env.get('commit') or '-'}",
            env.get("date") or ""]
    decl = k.repro_call()
    check = (f"The check: {CHECK_WORDS[(t.fused, t.backward)]}, on {t.device} (the inputs are drawn by torch's "
             f"{t.device} generator: another device draws other values).")
    lines = ['"""' + f"{k.name} on {case.id}: {t.test} of normdiff reproduced standalone.", "",
             *textwrap.wrap(check, 100),
             *textwrap.wrap(("Where the harness saw it (the run's report): " if t.record is not None else
                             "Written on this machine (no run's report given; --report names where it was seen): ")
                            + ", ".join(s for s in seen if s) + ".", 100)]
    said = reported(t.record)
    if said:
        lines += ["The report printed:", *("    " + s for s in said)]
    needs = ("" if decl is None else " and the kernel's library" + (f" ({decl.requires})" if decl.requires else ""))
    run = (f"Run: python {command}; exits 1 while the defect is present, 0 when the outputs are within the allowance "
           "and the write guard" + (", 2 where the kernel's library does not import" if decl and decl.requires else "")
           + f". It needs torch{needs}.")
    lines += ["", *textwrap.wrap(run, 100, break_on_hyphens=False)]
    if decl is None:
        lines += ["The kernel declares no standalone call (NormKernel.repro_call): this file imports its plug-in",
                  "(or normdiff's module) and so needs normdiff installed."]
    else:
        own = "impls" in decl.imports or "normdiff" in decl.imports
        lines.append("It imports normdiff: the kernel is normdiff's own (its library is normdiff)." if own else
                     "Nothing of normdiff is imported.")
        lines += textwrap.wrap(decl.note, 100, break_on_hyphens=False)
    return lines + ['Written by `python -m harness.repro`."""', ""]


def constants(t: Target) -> list[str]:
    case, k = t.case, t.kernel
    stats = tuple(o for o in k.outputs if o in ("mean", "rstd"))
    stat_dtype = k.stat_dtype(case.torch_dtype, t.device)
    lines = [f"CASE, KERNEL = {case.id!r}, {k.name!r}", f"DEVICE = {t.device!r}",
             f"OP = {case.op!r}", f"SEED = {case.seed}  # from the case id (sha256), as the harness derives it"]
    if t.backward:
        lines.append(f"DY_SEED = {case.dy_seed}")
    lines += [f"SHAPE = {tuple(case.shape)!r}", "LEAD, N = SHAPE[:-1], SHAPE[-1]",
              f"PAD = {case.row_pad}  # elements after each row of x (a row stride of N + PAD)",
              f"DIST = {case.dist!r}", f"DTYPE = {case.torch_dtype}", f"EPS = {case.eps_value!r}",
              f"STATS = {stats!r}  # the statistics the kernel writes",
              f"STAT_DTYPE = {stat_dtype}  # the precision it declares them in (their allowance)",
              f"ROUNDING = {k.rounding!r}  # its declared rounding of y",
              f"HEAD, TAIL, GAP = {HEAD}, {TAIL}, {GAP}  # canaries around each output, and after each row of y"]
    if t.fused:
        stats_on, r_out = declared_sum(k, case)
        out_dt = case.out_torch_dtype
        lines += [f"BASE_OP = {BASE_OP[case.op]!r}", f"WRITE = {case.write!r}  # new / in_place / out_y",
                  f"RESIDUAL_DTYPE = {case.residual_torch_dtype}", f"RESIDUAL_OUT_DTYPE = {r_out}",
                  f"KEEP_DTYPE = {'torch.float32' if stats_on == 'float32_sum' else r_out}  # statistics on ({stats_on})",
                  f"WEIGHT_OFFSET = {float(case.weight_offset)!r}", f"OUT_DTYPE = {out_dt}",
                  f"SCALE = {case.scale!r}  # y / SCALE", f"KERNEL_SCALE = {kernel_scale(k, case)!r}  # in the "
                  f"kernel's convention ({k.scale_convention})", f"FP8_NAN = {k.fp8_nan!r}"]
    return lines + [""]


def call_section(t: Target) -> list[str]:
    k, key = t.kernel, (t.fused, t.backward)
    decl = k.repro_call()
    if decl is not None and t.backward and not decl.backward:
        decl = None
    sig = SIGNATURES
    if decl is not None:
        lines = [f"# -- the call: {k.name} through its library, as its plug-in calls it (NormKernel.repro_call)",
                 *import_lines(k.name, decl), ""]
        if decl.source.strip():
            lines += [*textwrap.dedent(decl.source).strip().splitlines(), "", ""]
        lines += [f"def call_forward({sig[(t.fused, False)]}):",
                  *("    " + ln for ln in textwrap.dedent(decl.forward).strip().splitlines()), ""]
        if t.backward:
            lines += [f"def call_backward({sig[key]}):",
                      *("    " + ln for ln in textwrap.dedent(decl.backward).strip().splitlines()), ""]
        return lines + [""]
    path = plugin_file(k)
    module = type(k).__module__
    if path and Path(path).is_relative_to(ROOT):
        path = Path(path).relative_to(ROOT).as_posix()  # run from normdiff's checkout
    load = (f"registry.load_file({path!r})  # the plug-in file the run loaded" if path else
            f"importlib.import_module({module!r})  # normdiff's module of this kernel")
    lines = ["# -- the call: no standalone call declared (NormKernel.repro_call), so through normdiff:",
             "import importlib  # noqa: E402", "",
             "from impls import registry  # noqa: E402",
             "from impls.base import NormGrads, NormOutputs  # noqa: E402",
             "from impls.fused import FusedGrads, FusedOutputs, FusedParams  # noqa: E402", "", load,
             f"KERNEL = registry.get(OP, {k.backend!r}, {k.variant!r})", "", ""]
    lines += [f"def call_forward({sig[(t.fused, False)]}):", "    " + FALLBACK_CALLS[(t.fused, False)], ""]
    if t.backward:
        lines += [f"def call_backward({sig[key]}):", "    " + FALLBACK_CALLS[key], ""]
    return lines + [""]


def import_lines(name: str, decl) -> list[str]:
    """The declared imports; with ``requires``, inside a try that says what to install and exits 2
    (no verdict) where they fail."""
    lines = decl.imports.strip().splitlines()
    if not decl.requires:
        return lines
    said = f"{name}'s library does not import here; this repro needs it: {decl.requires}"
    return ["try:", *("    " + ln if ln.strip() else "" for ln in lines),
            "except ImportError as exc:  # not installed here: no verdict (exit 2)",
            '    print(f"{type(exc).__name__}: {exc}", file=sys.stderr)',
            f"    print({said!r}, file=sys.stderr)", "    sys.exit(2)"]


def env_lines(t: Target) -> list[str]:
    """Variables the run set that the call depends on, set before anything imports triton."""
    env = dict(t.environment.get("repro_env") or {})
    env.pop("CUDA_VISIBLE_DEVICES", None)
    decl = t.kernel.repro_call()
    uses_triton = "triton" in t.kernel.packages or "triton" in (decl.imports if decl else "triton")
    if not uses_triton:
        env.pop("TRITON_INTERPRET", None)
    elif t.device == "cpu" and registry.runs_interpreted_triton(t.kernel):
        env.setdefault("TRITON_INTERPRET", "1")
    return [f"os.environ.setdefault({k!r}, {v!r})" for k, v in sorted(env.items())]


def generate(t: Target, command: str = "repro.py") -> str:
    case = t.case
    fp8 = t.fused and case.out_dtype is not None
    parts = header(t, command)
    parts += ["import math", "import os", "import sys", "from types import SimpleNamespace as Namespace", ""]
    parts += env_lines(t) + ["import torch  # noqa: E402", ""]
    parts += constants(t)
    parts += judge_src.constants(case.torch_dtype, t.kernel.stat_dtype(case.torch_dtype, t.device), t.backward, fp8)
    parts += ["", "# -- the inputs, drawn as the harness draws them", ""] + draw.poison_source()
    if t.fused:
        parts += draw.fused_inputs(case) + (draw.fused_dy_source(case) if t.backward else [])
    else:
        parts += draw.plain_inputs(case) + (draw.dy_source(case) if t.backward else [])
    parts += ["", "# -- the float64 reference, the allowance and the comparison (harness/judging/compare*.py)"]
    parts += [judge_src.COMMON, judge_src.REFERENCE]
    if not t.fused and not t.backward:
        parts.append(judge_src.ROUNDING)
    if t.backward:
        parts.append(judge_src.BACKWARD)
    if fp8:
        parts.append(judge_src.FP8)
    parts += ["", "# -- the write guard: poisoned outputs with canaries (harness/judging/guards.py)", mains.GUARDS]
    if t.fused:
        parts.append(mains.BUFFERS)
    parts += call_section(t)
    main = {(False, False): mains.PLAIN_FORWARD, (False, True): mains.PLAIN_BACKWARD,
            (True, False): mains.FUSED_FORWARD, (True, True): mains.FUSED_BACKWARD}[(t.fused, t.backward)]
    parts += [main, "", 'if __name__ == "__main__":', "    sys.exit(main())", ""]
    return "\n".join(parts)
