"""What can run here, on one screen: ``python -m harness.doctor``.

For the machine: Python, torch and its CUDA, the GPU and its driver, Triton (and whether it runs
under its interpreter), TileLang and nvcc, pytest-xdist. For each backend, built in or plug-in:
whether it can run here, how (version, device), and where not, why and what to do about it.
A kernel says all of that itself (``note()``, ``unavailable()``): the doctor asks, it never
branches on backend names.
"""
from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TILELANG_PIN = "0.1.15"


def _version(pkg: str) -> str | None:
    try:
        return md.version(pkg)
    except md.PackageNotFoundError:
        return None


def declared_range(pkg: str) -> str | None:
    """The version range the project declares for ``pkg`` (installed metadata, else pyproject)."""
    try:
        reqs = md.requires("normdiff") or []
    except md.PackageNotFoundError:
        reqs = []
    if not reqs and (ROOT / "pyproject.toml").is_file():
        try:
            import tomllib
        except ImportError:  # Python 3.10: no range to show
            return None
        project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
        reqs = list(project.get("dependencies", []))
        for extra, items in project.get("optional-dependencies", {}).items():
            reqs += [f"{r}; extra == '{extra}'" for r in items]
    from packaging.requirements import Requirement

    for r in reqs:
        req = Requirement(r)
        if req.name == pkg and str(req.specifier):
            return str(req.specifier)
    return None


def _in_range(pkg: str, version: str | None) -> str:
    spec = declared_range(pkg)
    if version is None or spec is None:
        return ""
    from packaging.specifiers import SpecifierSet

    ok = SpecifierSet(spec).contains(version.split("+")[0], prereleases=True)
    return f" (declared {spec}{'' if ok else ': OUTSIDE the tested range'})"


def _nvcc() -> tuple[str | None, str | None]:
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    path = str(Path(cuda_home) / "bin" / "nvcc") if cuda_home and (Path(cuda_home) / "bin" / "nvcc").exists() \
        else shutil.which("nvcc")
    if path is None:
        return None, None
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
        release = next((line.split("release")[-1].split(",")[0].strip() for line in out.splitlines() if "release" in line), None)
    except (OSError, subprocess.SubprocessError):
        release = None
    return path, release


def _driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
        return out.splitlines()[0] if out else None
    except (OSError, subprocess.SubprocessError):
        return None


def machine() -> list[tuple[str, str, str]]:
    """(item, state, fix or '') for the machine and the packages every backend shares."""
    import torch

    from impls.base import cuda_present

    rows = [("python", f"{platform.python_version()} on {platform.system()} {platform.machine()}", "")]
    build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU build (no CUDA)"
    rows.append(("torch", f"{torch.__version__}, {build}{_in_range('torch', torch.__version__)}", ""))
    if cuda_present():
        n = torch.cuda.device_count()
        names = sorted({torch.cuda.get_device_name(i) for i in range(n)})
        cap = torch.cuda.get_device_capability(0)
        rows.append(("gpu", f"{n} x {', '.join(names)} (sm_{cap[0]}{cap[1]})", ""))
        rows.append(("driver", _driver() or "unknown (nvidia-smi not found)", ""))
    else:
        fix = ("a CUDA build of torch and an NVIDIA driver give GPU runs; here Triton runs under its "
               "interpreter and TileLang compiles without running") if torch.version.cuda is None else \
              "torch is a CUDA build but sees no device: check the driver (nvidia-smi) and CUDA_VISIBLE_DEVICES"
        rows.append(("gpu", "none visible", fix))
    triton = _version("triton")
    interp = os.environ.get("TRITON_INTERPRET") == "1" or not cuda_present()
    rows.append(("triton", f"{triton}{_in_range('triton', triton)}" + (", interpreter mode (TRITON_INTERPRET=1)" if interp else ", compiled for the GPU")
                 if triton else "not installed", "" if triton else "pip install -e '.[triton]'"))
    tilelang = _version("tilelang")
    rows.append(("tilelang", tilelang + ("" if tilelang == TILELANG_PIN else f" (the project is written for {TILELANG_PIN})")
                 if tilelang else "not installed", "" if tilelang == TILELANG_PIN else f"pip install tilelang=={TILELANG_PIN}"))
    nvcc, release = _nvcc()
    rows.append(("nvcc", f"{nvcc}, release {release}" if nvcc else "not found",
                 "" if nvcc else "TileLang compiles with nvcc: put CUDA's bin on PATH or set CUDA_HOME"))
    from impls import pdl

    why_not = pdl.why_off("cuda")
    rows.append(("PDL", "programmatic dependent launch at decode: " + ("on" if why_not is None else f"off ({why_not})"),
                 ""))
    xdist = _version("pytest-xdist")
    rows.append(("pytest-xdist", f"{xdist}: checks run in isolated workers" if xdist else "not installed: checks run in one process",
                 "" if xdist else "pip install -e '.[test]' (crash and hang isolation needs it)"))
    return rows


def backends(files=()) -> list[dict]:
    """One row per backend: whether it runs here, how, and per kernel that cannot, why."""
    from harness.judging.runner import device_for
    from impls import registry

    # Plug-ins shipped as examples: loaded when present, so their status shows with the built-ins.
    KNOWN_PLUGINS = {name: ROOT / path for name, path in registry.KNOWN_PLUGINS.items()}
    registry.load_all([str(p) for p in KNOWN_PLUGINS.values() if p.is_file()])
    plugins = {name: str(p.relative_to(ROOT)) for name, p in KNOWN_PLUGINS.items()}
    plugins.update(_load_named(files))
    rows = []
    for backend in registry.backends():
        kernels = registry.kernels([backend], family=None)  # every family's
        why = {k: k.unavailable() for k in kernels}
        runnable = [k for k in kernels if why[k] is None]
        row = {
            "backend": backend,
            "runs": "yes" if len(runnable) == len(kernels) else ("partly" if runnable else "no"),
            "how": kernels[0].note().split(";")[0],
            "device": ", ".join(sorted({device_for(k) for k in runnable})) or "-",
            "kernels": len(kernels),
            "why_not": sorted({f"{r}" for r in why.values() if r}),
        }
        if backend in plugins:
            row["load"] = f"--backend-file {plugins[backend]} --backend {backend}"
        rows.append(row)
    for source, err in registry.load_errors().items():
        rows.append({"backend": source, "runs": "no", "how": "failed to load", "device": "-", "kernels": 0, "why_not": [err]})
    return rows


def _load_named(files) -> dict[str, str]:
    """Load the plug-in files named with --backend-file: {backend: how to load it} for the
    backends each registers (a path under the checkout relative to it)."""
    from impls import registry

    loads = {}
    for f in files:
        registry.load_file(f)
        path = Path(f).resolve()
        shown = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
        module = registry.plugin_module(path)
        loads.update({k.backend: shown for k in registry.kernels(family=None) if type(k).__module__ == module})
    return loads


def render(machine_rows, backend_rows) -> str:
    lines = ["normdiff doctor", ""]
    width = max(len(r[0]) for r in machine_rows)
    for item, state, fix in machine_rows:
        lines.append(f"  {item:<{width}}  {state}")
        if fix:
            lines.append(f"  {'':<{width}}    fix: {fix}")
    lines += ["", "backends (runs here: yes / partly / no)"]
    width = max(len(r["backend"]) for r in backend_rows)
    for r in backend_rows:
        lines.append(f"  {r['backend']:<{width}}  {r['runs']:<6}  {r['how']}" + (f"  [on {r['device']}]" if r["device"] != "-" else ""))
        for why in r["why_not"]:
            lines.append(f"  {'':<{width}}          not here: {why}")
        if r.get("load"):
            lines.append(f"  {'':<{width}}          plug-in: {r['load']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.doctor", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend-file", action="append", default=[], metavar="PATH",
                        help="also load an outside backend from this file (repeatable)")
    parser.add_argument("--json", action="store_true", help="print the same as JSON")
    args = parser.parse_args(argv)
    if str(ROOT) not in sys.path:  # run from a checkout without installing it
        sys.path.insert(0, str(ROOT))
    m, b = machine(), backends(args.backend_file)
    if args.json:
        print(json.dumps({"machine": [dict(zip(("item", "state", "fix"), r)) for r in m], "backends": b}, indent=1))
    else:
        print(render(m, b))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
