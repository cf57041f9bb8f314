"""Loading tilelang, compiling plans (cached in the process and on disk), and ptxas reports.

tilelang is imported on first use only: importing it takes seconds, and the registry imports
this backend at start-up, also where tilelang is missing.

Caches: a dict in the process, keyed by the plan (all of it: variant, dtype, N, affine flags,
vector width, threads, launch bound) and the target; on disk, TileLang's own kernel cache
(``TILELANG_CACHE_DIR``, default ``~/.tilelang/cache``), which this module never disables. ptxas reports are kept under
``~/.cache/normdiff/tilelang/ptxas`` (``NORMDIFF_CACHE_DIR`` moves it), keyed by the source.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from impls.base import OptionalImport, cuda_present
from impls.tilelang.plan import Plan

SM90 = {"kind": "cuda", "arch": "sm_90"}
# Our kernels guard every global access themselves; TileLang's legalisation would add a bounds
# check per element against the flat buffer's length and lose the 16-byte accesses.
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}
# Cluster plans whose peers may write a block's exchange slots while it still reduces
# (Plan.mbar_exchange, Plan.relaxed_arrive), or whose block sums use a workspace TileLang does not
# see them use (Plan.one_barrier_sum): no shared buffer reuses another's memory.
SLOTS_OWN_MEMORY = {"tl.disable_shared_memory_reuse": True}
# How a compiled kernel is called from Python (TileLang's adapters); tools.host_cost measures the
# host cost of each on a GPU.
EXECUTION_BACKEND = "tvm_ffi"
INSTALL_HINT = "pip install 'normdiff[tilelang]'"
NOT_EXECUTED = "compiled for sm_90, not executed: no CUDA device"


class TileLangCompileError(RuntimeError):
    """A plan TileLang could not compile, with what to do about it."""


_TILELANG = OptionalImport("tilelang", missing=f"tilelang not importable; {INSTALL_HINT}")


def tilelang_module():
    """(module, None) or (None, why it cannot be imported)."""
    modules = _TILELANG.modules()
    return (modules[0], None) if modules else (None, _TILELANG.reason)


def availability() -> str | None:
    tl, why = tilelang_module()
    if tl is None:
        return why
    if not cuda_present():
        return NOT_EXECUTED
    return None


def nvcc_path() -> str | None:
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cuda_home and (Path(cuda_home) / "bin" / "nvcc").exists():
        return str(Path(cuda_home) / "bin" / "nvcc")
    return shutil.which("nvcc")


def version() -> str:
    tl, _ = tilelang_module()
    return getattr(tl, "__version__", "?") if tl is not None else "not installed"


def default_target() -> dict:
    """sm_XY of the current GPU; sm_90 without one (compile-only)."""
    if cuda_present():
        major, minor = torch.cuda.get_device_capability()
        return {"kind": "cuda", "arch": f"sm_{major}{minor}"}
    return dict(SM90)


@dataclass
class Compiled:
    plan: Plan
    target: dict
    kernel: object  # tilelang JITKernel
    seconds: float  # wall time of the compile (near zero when TileLang's disk cache had it)

    def source(self) -> str:
        return self.kernel.get_kernel_source()

    def host_source(self) -> str:
        try:
            return self.kernel.get_host_source()
        except Exception:  # noqa: BLE001 (only informative)
            return ""


_CACHE: dict[tuple, Compiled] = {}  # (plan, target) -> compiled
_LOCK = threading.Lock()
COMPILE_COUNT = 0  # real compile calls into TileLang in this process (the tests read it)


def _layout_failure(exc: BaseException) -> bool:
    return "layout" in f"{type(exc).__name__}: {exc}".lower()


def pass_configs(plan: Plan) -> dict:
    """TileLang's pass settings for a plan's program."""
    own = plan.mbar_exchange or plan.relaxed_arrive or plan.one_barrier_sum
    return {**PASS_CONFIGS, **(SLOTS_OWN_MEMORY if own else {})}


def compile_program(program, plan: Plan, target: dict | None = None, what: str | None = None,
                    execution_backend: str | None = None):
    """Compile a prim_func with the backend's settings. Whatever TileLang raises comes back as
    a TileLangCompileError that names the kernel, dtype and N and says what to do."""
    tl, why = tilelang_module()
    if tl is None:
        raise TileLangCompileError(why)
    what = what or plan.describe()
    try:
        return tl.compile(program, target=target or default_target(), execution_backend=execution_backend or EXECUTION_BACKEND,
                          pass_configs=pass_configs(plan))
    except Exception as exc:  # noqa: BLE001 (TileLang raises several types from its C++ side)
        lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
        detail = " / ".join(lines[:3])[:600] or type(exc).__name__
        if _layout_failure(exc):
            cause = "TileLang layout inference failed"
        else:
            cause = ("TileLang failed while lowering it (an internal check like this one is what a layout "
                     "conflict, e.g. between a reduction's source and destination fragments, produces)")
        raise TileLangCompileError(
            f"{what}: {cause}: {type(exc).__name__}: {detail}. The kernel's fragment layouts do not fit "
            f"this configuration; report it with this message (impls/tilelang/plan.py chooses the "
            f"layouts) and meanwhile use tilelang.splitk (RMSNorm, any N) or another backend."
        ) from exc


def direct_call(kernel):
    """The compiled kernel's executable, called without the adapter's per-call Python (which for a
    kernel that allocates no outputs only forwards its arguments on a CUDA device); the kernel
    itself where this TileLang's adapter is not the one that does so."""
    adapter = getattr(kernel, "adapter", None)
    get = getattr(adapter, "_get_executable", None)
    if type(adapter).__name__ != "TVMFFIKernelAdapter" or get is None or getattr(adapter, "result_idx", None):
        return kernel
    return get()


def compile_plan(plan: Plan, target: dict | None = None) -> Compiled:
    """The compiled kernel of a plan, compiled at most once per process."""
    global COMPILE_COUNT
    target = dict(target or default_target())
    key = (plan, json.dumps(target, sort_keys=True))
    with _LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            return hit
        from impls.tilelang import _programs  # imports tilelang.language

        t0 = time.perf_counter()
        program = _programs.BUILDERS[plan.variant](plan)
        kernel = compile_program(program, plan, target)
        COMPILE_COUNT += 1
        compiled = Compiled(plan, target, kernel, time.perf_counter() - t0)
        _CACHE[key] = compiled
        return compiled


# -- ptxas ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PtxasReport:
    arch: str
    registers: int | None
    smem_static: int  # bytes, from ptxas
    smem_dynamic: int | None  # bytes TileLang requests at launch (reduction workspace)
    spill_stores: int  # bytes
    spill_loads: int  # bytes
    stack: int  # bytes of stack frame
    sass_arch: str | None  # the SM the cubin's ELF header names, e.g. "sm_90"

    def to_dict(self) -> dict:
        return asdict(self)


_PTXAS_LINE = {
    "registers": re.compile(r"Used (\d+) registers"),
    "smem": re.compile(r"(\d+) bytes smem"),
    "stack": re.compile(r"(\d+) bytes stack frame"),
    "spill_stores": re.compile(r"(\d+) bytes spill stores"),
    "spill_loads": re.compile(r"(\d+) bytes spill loads"),
}


def parse_ptxas(text: str) -> dict:
    """Numbers from ``ptxas -v`` output (one kernel)."""
    out = {}
    for name, rx in _PTXAS_LINE.items():
        m = rx.search(text)
        out[name] = int(m.group(1)) if m else (None if name == "registers" else 0)
    return out


def cubin_sm(data: bytes) -> str | None:
    """The SM a cubin's ELF header names (EM_CUDA = 190), or None if it is not a cubin."""
    if len(data) < 52 or data[:4] != b"\x7fELF":
        return None
    little = data[5] == 1
    order = "little" if little else "big"
    machine = int.from_bytes(data[18:20], order)
    if machine != 190:
        return None
    flags = int.from_bytes(data[48:52] if data[4] == 2 else data[36:40], order)
    # CUDA ELF ABI version 8+ (CUDA 12.8 on) stores the SM in bits 8..15; older ones in 0..7.
    for sm in ((flags >> 8) & 0xFF, flags & 0xFF):
        if 20 <= sm <= 200:
            return f"sm_{sm}"
    return None


_DYN_SMEM = re.compile(r"\[(\d+)\]\.v_int64\) = \(\(int64_t\)(\d+)\);")


def dynamic_smem(host_source: str) -> int | None:
    """The dynamic shared memory TileLang launches the kernel with: the last constant of the
    launch arguments (grid, block, then dynamic shared memory bytes), the last call of the host
    source (a TMA kernel's tensor-map arguments come before it, at higher argument indices)."""
    found = _DYN_SMEM.findall(host_source)
    return int(found[-1][1]) if found else None


def _cache_dir() -> Path:
    root = os.environ.get("NORMDIFF_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "normdiff")
    return Path(root) / "tilelang" / "ptxas"


def ptx(compiled: Compiled) -> str:
    """The PTX nvcc makes of the kernel's CUDA source, as ptxas_report compiles it (what the
    instructions are: griddepcontrol for PDL, ld.global.nc where the parameters are __restrict__).
    Cached on disk by source and arch; needs nvcc."""
    arch = compiled.target.get("arch", "sm_90")
    src = compiled.source()
    digest = hashlib.sha256(f"ptx {arch}\n{src}".encode()).hexdigest()[:32]
    path = _cache_dir() / f"{digest}.ptx"
    if path.exists():
        return path.read_text()
    text = _nvcc(compiled, "ptx", "--ptx", [])[0].decode()
    _write_cache(path, text)
    return text


def _nvcc(compiled: Compiled, what: str, mode: str, flags: list[str]) -> tuple[bytes, str]:
    """nvcc ``mode`` (--ptx, --cubin) on the kernel's CUDA source: the output's bytes and nvcc's
    own output (ptxas -v writes its report there)."""
    import tempfile

    from tilelang.contrib import nvcc as tl_nvcc

    nvcc = nvcc_path()
    if nvcc is None:
        raise TileLangCompileError(f"nvcc not found (set CUDA_HOME or put nvcc on PATH); no {what}")
    arch = compiled.target.get("arch", "sm_90")
    with tempfile.TemporaryDirectory(prefix=f"normdiff-{what}-") as tmp:
        cu, out = Path(tmp) / "kernel.cu", Path(tmp) / "kernel.out"
        cu.write_text(compiled.source())
        cmd = [nvcc, mode, "-O3", f"-arch={arch}", *flags, *tl_nvcc.default_compile_options(), "-o", str(out), str(cu)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise TileLangCompileError(f"nvcc failed on {compiled.plan.describe()}:\n{proc.stderr[-2000:]}")
        return out.read_bytes(), proc.stdout + proc.stderr


def _write_cache(path: Path, text: str) -> None:
    """Write a cache entry whole (a temporary file, then renamed), or not at all."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp_path = path.with_suffix(f".{os.getpid()}.tmp")
        tmp_path.write_text(text)
        os.replace(tmp_path, path)
    except OSError:
        pass


def ptxas_report(compiled: Compiled) -> PtxasReport:
    """Compile the kernel's CUDA source to a cubin with ``ptxas -v`` and parse its report.
    Cached on disk by source and arch; needs nvcc."""
    arch = compiled.target.get("arch", "sm_90")
    src = compiled.source()
    digest = hashlib.sha256(f"{arch}\n{src}".encode()).hexdigest()[:32]
    path = _cache_dir() / f"{digest}.json"
    host = compiled.host_source()
    if path.exists():
        try:
            data = json.loads(path.read_text())
            return PtxasReport(**{**data, "smem_dynamic": dynamic_smem(host)})
        except (ValueError, TypeError):
            pass
    cubin, log = _nvcc(compiled, "ptxas report", "--cubin", ["-Xptxas", "-v"])
    sass = cubin_sm(cubin)
    nums = parse_ptxas(log)
    report = PtxasReport(arch=arch, registers=nums["registers"], smem_static=nums["smem"],
                         smem_dynamic=dynamic_smem(host), spill_stores=nums["spill_stores"],
                         spill_loads=nums["spill_loads"], stack=nums["stack"], sass_arch=sass)
    _write_cache(path, json.dumps(report.to_dict()))
    return report
