"""Hashes of the code the compilers generate for every registered project kernel, compiled for
sm_90 without a GPU, so that a refactor meant to leave the kernels alone can show it did: the
same hashes before and after.

    python -m tools.codegen_hash [--json PATH] [--backend triton,tilelang] [--only REGEX] [--candidates]
    python -m tools.codegen_hash --compare BEFORE.json AFTER.json

One line a (kernel, build): the kernel, the build, the sha256 of what was generated.

- TileLang: the kernel's CUDA source for each of its ``offline_builds``, compiled by its own
  ``build_offline`` (the ptxas report it also makes is skipped: it is read from the code hashed).
- Triton: the PTX of every launch a call on TRITON_BUILDS' shapes makes (``TritonKernel.launches``,
  the backward's ``backward_launches``; a dispatch kernel's: its ``target`` variant's, with the
  setting it gives, which without a GPU is looped where a GPU would run split), compiled for
  sm_90 as tools.triton_resources compiles. Its line records, debug sections and comments are
  left out (they name source files and lines, which moving a function changes without changing
  an instruction). The split variant's launcher asks the GPU for its SM count and how many
  programs an SM holds: offline, H200_PROPS stands in.
- ``--candidates``: the long-row probe's candidates (tools.long_row_probe.candidates) at
  CANDIDATE_NS in bfloat16, in a section of their own.

It hashes the impls it imports: run it with the checkout to hash first on PYTHONPATH (from that
checkout's root). TileLang's and Triton's disk caches serve what they compiled before; their keys
hold the whole program (TileLang) or the kernels' source (Triton), so a changed kernel compiles
again (TILELANG_CACHE_DIR and TRITON_CACHE_DIR pointed at empty folders compile everything).
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import json
import os
import re
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

# (dtype, N, affine, M) of the Triton builds: three dtypes at short, padded, odd and long rows; no
# affine and each affine part alone; few rows (the decode rule, and the dispatch's rowwise choice).
TRITON_NS = (769, 1024, 4000, 4096, 8192, 12288, 16384, 32768, 65536, 100000, 131072, 262144)
TRITON_BUILDS = tuple(
    [(dt, n, "full", 256) for dt in ("float32", "float16", "bfloat16") for n in TRITON_NS]
    + [("bfloat16", n, affine, 256) for n in (4000, 131072) for affine in ("none", "weight", "bias")]
    + [(dt, n, "full", 1) for dt in ("float32", "bfloat16") for n in (769, 4096, 8192, 16384)])
# The backward's builds: one tile (with a tuned setting and without), and column blocks.
BACKWARD_BUILDS = tuple((dt, n, "full", 256) for dt in ("float32", "bfloat16") for n in (1000, 2048, 8192, 16384))
CANDIDATE_NS = (65536, 131072)
# What the split launcher reads of the GPU: an H200's SM count and per-SM limits.
H200_PROPS = SimpleNamespace(multi_processor_count=132, regs_per_multiprocessor=65536,
                             max_threads_per_multi_processor=2048, shared_memory_per_multiprocessor=233472)


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


_DEBUG_LABEL = re.compile(r"^\$L__(tmp|func_begin|func_end|info_string)\d*:$")


def ptx_code(ptx: str) -> str:
    """PTX without what names the source: .file and .loc records, debug sections, debug labels,
    comments and blank lines."""
    ptx = ptx.split("\t.section\t.debug", 1)[0]
    lines = []
    for line in ptx.splitlines():
        line = line.split("//", 1)[0].rstrip()
        s = line.strip()
        if not s or s.startswith((".loc", ".file")) or _DEBUG_LABEL.match(s):
            continue
        lines.append(line)
    return "\n".join(lines)


@contextlib.contextmanager
def offline_gpu(kernel):
    """What the Triton launchers ask of a GPU, answered for an H200 (H200_PROPS) on CPU tensors."""
    import torch

    run_globals = getattr(type(kernel).run, "__globals__", {})
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.multiple(torch.cuda, create=True, get_device_properties=lambda *a: H200_PROPS,
                                    current_stream=lambda *a: SimpleNamespace(cuda_stream=0),
                                    is_current_stream_capturing=lambda: False, current_device=lambda: 0))
        if "programs_per_sm" in run_globals:
            module = sys.modules[type(kernel).run.__module__]
            stack.enter_context(mock.patch.multiple(module, programs_per_sm=lambda compiled, device: 1))
            # Every build records the launch that sizes the grid too, whatever ran before it.
            run_globals.get("_RESIDENT_PROGRAMS", {}).clear()
        yield


class TritonHasher:
    """PTX hashes of Triton launches, each distinct compilation compiled once."""

    def __init__(self):
        from tools.triton_resources import compile_sm90

        self.compile_sm90 = compile_sm90
        self.cache: dict = {}

    @staticmethod
    def _key(fn, args, kwargs) -> tuple:
        def arg(v):
            if hasattr(v, "data_ptr"):
                return ("tensor", str(v.dtype), v.data_ptr() % 16 == 0)
            if isinstance(v, float):
                return ("float",)
            return ("int", v if v in (0, 1) else None, v % 16 == 0, -2**31 <= v < 2**31)
        return (fn.__module__, fn.__name__, tuple(arg(v) for v in args),
                tuple(sorted((k, repr(v)) for k, v in kwargs.items())))

    def launch(self, name: str, fn, args: tuple, kwargs: dict) -> str:
        key = self._key(fn, args, kwargs)
        if key not in self.cache:
            compiled = self.compile_sm90(fn, args, kwargs)
            self.cache[key] = digest(ptx_code(compiled.asm["ptx"]))
        return f"{name}:{self.cache[key]}"

    def build(self, kernel, build: tuple, backward: bool = False) -> str:
        import torch

        dt, n, affine, m = build
        dtype = getattr(torch, dt)
        x = torch.empty(m, n, dtype=dtype)
        w = torch.empty(n, dtype=dtype) if affine in ("full", "weight") else None
        b = torch.empty(n, dtype=dtype) if kernel.op == "layer_norm" and affine in ("full", "bias") else None
        cfg = None
        if not backward and getattr(kernel, "target", None) is not None:
            kernel, cfg = kernel.target(n, dtype, m)  # a dispatch kernel: the variant it runs, as it runs it
        with offline_gpu(kernel):
            if backward:
                launches = [(name, fn, args, dict(kwargs))
                            for name, fn, args, kwargs in kernel.backward_launches(x, w, b)]
            else:
                launches = []
                for launch in kernel.launches(x, w, b, cfg=cfg):
                    kwargs = dict(launch.kwargs)
                    if launch.cfg.maxnreg:  # as tools.triton_resources: the cap the GPU launch passes
                        kwargs["maxnreg"] = launch.cfg.maxnreg
                    launches.append((launch.kernel_name, launch.fn, launch.args, kwargs))
        parts = [self.launch(name, fn, args, kwargs) for name, fn, args, kwargs in launches]
        return digest("\n".join(parts))


def fits(kernel, n: int) -> bool:
    return (kernel.max_n is None or n <= kernel.max_n) and n >= (kernel.min_n or 1)


def triton_rows(kernel, hasher: TritonHasher):
    for build in TRITON_BUILDS:
        if fits(kernel, build[1]):
            yield "-".join(map(str, build)), lambda b=build: hasher.build(kernel, b)
    if getattr(kernel, "backward_launches", None) is not None:
        for build in BACKWARD_BUILDS:
            yield "backward-" + "-".join(map(str, build)), lambda b=build: hasher.build(kernel, b, backward=True)


class _NoReport:
    def to_dict(self) -> dict:
        return {}


def tilelang_source(kernel, build) -> str:
    """The CUDA source of everything ``kernel.build_offline(build)`` compiles, hashed."""
    from impls.tilelang import compiler

    made = []
    compile_plan = compiler.compile_plan

    def spy(plan, target=None):
        compiled = compile_plan(plan, target)
        made.append(compiled)
        return compiled

    with mock.patch.multiple(compiler, compile_plan=spy, ptxas_report=lambda compiled: _NoReport()):
        kernel.build_offline(build)
    return digest("\n".join(c.source() for c in made))


def tilelang_rows(kernel):
    for build in kernel.offline_builds():
        yield "-".join(str(p) for p in build if p is not None), lambda b=build: tilelang_source(kernel, b)


def candidate_rows(hasher: TritonHasher):
    """(op label, build, hash function) of the long-row probe's candidates at CANDIDATE_NS."""
    import torch

    from impls.base import NormSpec
    from impls.tilelang import compiler
    from tools.long_row_candidates import NO_AFFINE, NO_BIAS, candidates

    for op in ("rms_norm", "layer_norm"):
        for _, label, make in candidates(op):
            affine = "none" if label.endswith(NO_AFFINE) else "weight" if label.endswith(NO_BIAS) else "full"
            for n in CANDIDATE_NS:
                build = ("bfloat16", n, affine, 256)
                if label.startswith("triton"):
                    yield f"{op} {label}", "-".join(map(str, build)), lambda b=build, mk=make: hasher.build(mk(), b)
                    continue

                def source(n=n, mk=make, affine=affine):
                    kernel = mk()
                    spec = NormSpec(op, torch.bfloat16, 256, n, n, "cuda", affine != "none",
                                    op == "layer_norm" and affine == "full")
                    return digest(compiler.compile_plan(kernel.compile_key(spec), compiler.SM90).source())
                yield f"{op} {label}", "-".join(map(str, build)), source


def measure(rows, only: str) -> list[dict]:
    out = []
    for kernel_label, build, fn in rows:
        if not re.search(only, f"{kernel_label} {build}"):
            continue
        t0 = time.perf_counter()
        try:
            value = fn()
        except Exception as exc:  # noqa: BLE001 (a build that does not compile is a result too)
            value = f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        row = {"kernel": kernel_label, "build": build, "sha256": value}
        out.append(row)
        print(f"{kernel_label:<40} {build:<34} {value}  ({time.perf_counter() - t0:.1f} s)", flush=True)
    return out


def registered_rows(backends: list[str] | None, hasher: TritonHasher):
    from impls import registry

    registry.load_builtins()
    for kernel in registry.kernels(backends):
        if not kernel.project:
            continue
        label = f"{kernel.op} {kernel.name}"
        if kernel.offline_builds():
            yield from ((label, b, fn) for b, fn in tilelang_rows(kernel))
        elif getattr(kernel, "launches", None) is not None:
            yield from ((label, b, fn) for b, fn in triton_rows(kernel, hasher))


def compare(before: Path, after: Path) -> int:
    """Count identical, differing and one-sided rows of two --json outputs; non-zero if any differ."""
    status = 0
    for section in ("kernels", "candidates"):
        a, b = ({(r["kernel"], r["build"]): r["sha256"] for r in json.loads(p.read_text()).get(section, [])}
                for p in (before, after))
        same = [k for k in a if k in b and a[k] == b[k]]
        differ = [k for k in a if k in b and a[k] != b[k]]
        print(f"{section}: {len(same)} identical, {len(differ)} differ, {len(set(a) - set(b))} only before, "
              f"{len(set(b) - set(a))} only after")
        for k in differ:
            print(f"  differs: {k[0]} {k[1]}: {a[k][:16]} -> {b[k][:16]}")
        for k in sorted(set(a) ^ set(b)):
            print(f"  {'only before' if k in a else 'only after'}: {k[0]} {k[1]}")
        status |= bool(differ or set(a) != set(b)) if section == "kernels" else bool(differ)
    return int(status)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.codegen_hash", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", help="also write the rows here")
    p.add_argument("--backend", default="triton,tilelang", help="the project backends to hash")
    p.add_argument("--only", default="", help="a regular expression on 'kernel build': only those")
    p.add_argument("--candidates", action="store_true", help="also the long-row probe's candidates")
    p.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), help="compare two --json outputs")
    args = p.parse_args(argv)
    if args.compare:
        return compare(*map(Path, args.compare))
    if os.environ.get("TRITON_INTERPRET") == "1":
        p.error("TRITON_INTERPRET=1: the interpreter's kernels cannot be compiled; unset it")
    importlib.import_module("triton")  # before impls.triton, which would otherwise take the interpreter
    hasher = TritonHasher()
    t0 = time.perf_counter()
    doc = {"impls": str(Path(importlib.import_module("impls").__file__).parent),
           "kernels": measure(registered_rows(args.backend.split(","), hasher), args.only)}
    if args.candidates:
        doc["candidates"] = measure(candidate_rows(hasher), args.only)
    doc["seconds"] = round(time.perf_counter() - t0, 1)
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1))
    errors = sum(r["sha256"].startswith("error") for s in ("kernels", "candidates") for r in doc.get(s, []))
    print(f"{len(doc['kernels'])} kernel builds, {len(doc.get('candidates', []))} candidate builds, "
          f"{errors} errors, {doc['seconds']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
