"""What the four TileLang kernels share: availability, capacity, planning and the launch."""
from __future__ import annotations

import dataclasses
import time

import torch

from impls import fastpath
from impls.base import NormKernel, NormOutputs, NormSpec, UnsupportedCase, cuda_present
from impls.repro_calls import through_normdiff
from impls.tilelang import compiler
from impls.tilelang.backward import TileLangBackward
from impls.tilelang.plan import (DECODE_MAX_ROWS, DECODE_TUNED, FRAGMENT_MAX_N, PDL_VARIANTS, Plan, choose_vec,
                                 make_plan, max_vec, pdl_fits)

# The flat buffers' lengths are bound as int64 and row offsets computed in int64 (_programs), so
# x may span more than 2**31 elements; M, the grid and a row's column index stay int32 (a
# block's rows stay below 2**31 with this margin).
MAX_ROWS = 2**31 - 1024

_DUMMIES: dict[tuple, torch.Tensor] = {}


def _dummy(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A one-element stand-in for an absent weight or bias (the kernel never reads it)."""
    key = (str(device), dtype)
    if key not in _DUMMIES:
        _DUMMIES[key] = torch.zeros(1, dtype=dtype, device=device)
    return _DUMMIES[key]


def _align_offset(t: torch.Tensor | None) -> int:
    """Elements from t's start back to the previous 16-byte boundary."""
    return 0 if t is None else (t.data_ptr() % 16) // t.element_size()


TILELANG_REPRO = ("The call goes through normdiff: TileLang's programs here are normdiff's own, built at the call "
                  "from its plans (impls/tilelang: the planner and the program builders), which a standalone file "
                  "would have to copy whole; tilelang itself is what they compile with.")


class TileLangBackend:
    """What every TileLang kernel declares, of either family: the backend, its availability and
    note, and the grid's limit on rows."""

    backend = "tilelang"
    project = True
    packages = ("tilelang",)
    devices = ("cuda",)

    def availability(self) -> str | None:
        return compiler.availability()

    def note(self) -> str:
        tl, why = compiler.tilelang_module()
        if tl is None:
            return why or ""
        if cuda_present():
            return f"tilelang {compiler.version()} on {torch.cuda.get_device_name()}"
        return f"tilelang {compiler.version()}: {compiler.NOT_EXECUTED}"

    def offline_tools(self) -> None:
        """TileLang and nvcc, to compile without the card; else UnsupportedCase with what is missing."""
        tl, why = compiler.tilelang_module()
        if tl is None:
            raise UnsupportedCase(why)
        if compiler.nvcc_path() is None:
            raise UnsupportedCase("nvcc not found (CUDA_HOME or PATH): TileLang cannot compile CUDA kernels here")

    def repro_call(self):
        """Through normdiff, their library (TILELANG_REPRO says why)."""
        return through_normdiff(self, note=TILELANG_REPRO)

    def beyond_grid(self, spec) -> str | None:
        if spec.rows > MAX_ROWS:
            return f"{self.name}: {spec.rows} rows; TileLang binds M (the grid) as int32 (max {MAX_ROWS})"
        return None


class TileLangKernel(TileLangBackend, TileLangBackward, NormKernel):
    # Set by the subclasses: the largest N by capacity, and which kernel takes longer rows.
    capacity: str = ""  # "register" or "" (no structural limit)
    longer_rows_by: str | None = None

    def unsupported(self, spec: NormSpec) -> str | None:
        if self.max_n is not None and spec.n > self.max_n:  # true on any machine, so said first
            where = f"; {self.longer_rows_by} covers it" if self.longer_rows_by else ""
            return f"N={spec.n} exceeds {self.name}'s {self.capacity} capacity (max {self.max_n}){where}"
        return self.beyond_grid(spec) or super().unsupported(spec)

    # -- planning and compiling ----------------------------------------------------------
    def plan_for(self, dtype: torch.dtype, n: int, has_weight: bool, has_bias: bool, vec: int,
                 m: int | None = None) -> Plan:
        return make_plan(self.variant, dtype, n, has_weight, has_bias, vec, m=m)

    def pdl_plan(self, plan: Plan, m: int | None, device) -> Plan:
        """``plan``, launched with PDL where it pays and runs: few rows (M <= DECODE_MAX_ROWS, where
        a launch's latency is much of a call; at many rows the grid's own waves leave it nothing to
        hide), a kernel that declares it (``pdl``), a program that has the form (PDL_VARIANTS)
        within the registers (``pdl_fits``), and ``impls.pdl.enabled(device)``. The flag is part
        of the plan, so a change of the switch compiles (and looks up) the other program."""
        few = m is not None and device is not None and self.launches_pdl(device, m)
        if few and plan.variant in PDL_VARIANTS and pdl_fits(plan):
            return dataclasses.replace(plan, pdl=True)
        return plan

    def prepare(self, spec: NormSpec) -> None:
        """Compile (or load from TileLang's disk cache) the kernel ``spec`` will run, so that no
        compilation happens inside a timed region. Assumes 16-byte aligned tensors and a y
        whose row stride is N or differs from it by a multiple of 16 elements (as the
        harness's guarded outputs do); other layouts may need one more compilation at the
        first call."""
        compiler.compile_plan(self.compile_key(spec))

    def m_thresholds(self, spec: NormSpec) -> tuple[int, ...]:
        """Few rows may take a decode plan (plan.DECODE_TUNED): another thread count."""
        vec = choose_vec(spec.dtype, spec.n)
        few = self.plan_for(spec.dtype, spec.n, spec.has_weight, spec.has_bias, vec, 1)
        many = self.plan_for(spec.dtype, spec.n, spec.has_weight, spec.has_bias, vec, None)
        return (DECODE_MAX_ROWS,) if few != many else ()

    def offline_builds(self) -> tuple:
        """(dtype, N, affine, M) built for sm_90 on any machine: a power of two, a padded N (vec 8
        fits) and an odd N (scalar accesses) in every dtype; no affine; long rows (splitk); the
        register-capacity edge; every affine combination; the decode plans (M = 1), and for a
        kernel that launches with PDL each 16-bit one in its PDL form too ("pdl" after M: what
        a Hopper GPU runs)."""
        full = "weight_bias" if self.op == "layer_norm" else "weight"
        builds = [(dt, n, full, None) for dt in ("float32", "float16", "bfloat16") for n in (4096, 4000, 769)]
        builds.append(("bfloat16", 4000, "none", None))
        if self.variant in ("splitk", "layer_norm_fwd"):  # layer_norm_fwd: its two-pass plan
            builds += [(dt, n, full, None) for dt in ("float32", "float16", "bfloat16") for n in (65536, 100000)]
        if self.max_n is not None or self.variant == "layer_norm_fwd":
            builds.append(("bfloat16", FRAGMENT_MAX_N, full, None))
        if self.op == "layer_norm":
            builds += [("bfloat16", 4000, "weight", None), ("bfloat16", 4000, "bias", None)]
        decode = [("bfloat16" if size == 2 else "float32", n, full, 1)
                  for variant, size, n in DECODE_TUNED if variant == self.variant]
        builds += decode
        if self.pdl and self.variant in PDL_VARIANTS:
            builds += [b + ("pdl",) for b in decode if b[0] == "bfloat16"]
        return tuple(builds) + self.backward_builds()

    def build_offline(self, build) -> dict:
        self.offline_tools()
        if build[0] == "backward":
            plan = self.backward_build_plan(build)
            _, dtype, n, affine = build
        else:
            dtype, n, affine, m = build[:4]
            dt = getattr(torch, dtype)
            plan = self.plan_for(dt, n, affine in ("weight", "weight_bias"), affine in ("weight_bias", "bias"),
                                 choose_vec(dt, n), m)
            if "pdl" in build[4:]:
                plan = dataclasses.replace(plan, pdl=True)
        t0 = time.perf_counter()
        compiled = compiler.compile_plan(plan, compiler.SM90)
        seconds = time.perf_counter() - t0
        return {"dtype": dtype, "n": n, "affine": affine, "vec": plan.vec, "threads": plan.threads, "pdl": plan.pdl,
                "seconds": round(seconds, 2), "executed": cuda_present() and compiler.default_target() == compiler.SM90,
                **compiler.ptxas_report(compiled).to_dict()}

    def compile_key(self, spec: NormSpec):
        """The plan ``prepare`` compiles: M and the strides are run-time values."""
        strides = (spec.row_stride, spec.n) if spec.rows > 1 else ()
        plan = self.plan_for(spec.dtype, spec.n, spec.has_weight, spec.has_bias,
                             choose_vec(spec.dtype, spec.n, strides), spec.rows)
        return self.pdl_plan(plan, spec.rows, spec.device)

    def _launch_plan(self, x: torch.Tensor, y: torch.Tensor, *params) -> Plan:
        m, n = x.shape
        strides = (x.stride(0), y.stride(0)) if m > 1 else ()
        vec = choose_vec(x.dtype, n, strides, tuple(_align_offset(t) for t in (x, y, *params)))
        assert vec <= max_vec(x.dtype)
        weight, bias = (params + (None, None))[:2]
        return self.pdl_plan(self.plan_for(x.dtype, n, weight is not None, bias is not None, vec, m), m, x.device)

    def persistent_buffers(self, x):
        return [_dummy(x.device, x.dtype)]

    def fast_plan(self, x, x2, weight, bias, spec):
        """The host fast path (impls.fastpath): the compiled kernel and its scalar arguments fixed
        for this signature; a call allocates, views x and y flat and calls the kernel."""
        if spec.device != "cuda":
            return None  # the generic plan
        m, n = x2.shape
        y2 = torch.empty((m, n), dtype=x.dtype, device=x.device)  # as the plan's outputs: fresh, aligned
        params = (weight,) if self.op == "rms_norm" else (weight, bias)
        plan = self._launch_plan(x2, y2, *params)
        kernel = compiler.direct_call(compiler.compile_plan(plan).kernel)
        with_bias = self.op == "layer_norm"
        sxv = x2.stride(0) // plan.vec if m > 1 else 0
        syv = n // plan.vec if m > 1 else 0
        span = (m - 1) * x2.stride(0) + n
        contiguous, two_d = x.is_contiguous(), x.dim() == 2  # 2-D: the statistics are flat already
        device = x.device
        index = device.index if device.index is not None else torch.cuda.current_device()
        current = torch.cuda.current_device
        dummy = _dummy(device, x.dtype)
        alloc = fastpath.output_factory(x, self.outputs)

        def run(x, weight, bias, eps):
            y, mean, rstd = alloc(x)
            flat = x.view(-1) if contiguous else x.as_strided((span,), (1,))
            w = dummy if weight is None else weight
            r = rstd if two_d else rstd.view(-1)
            if with_bias:
                args = (flat, w, dummy if bias is None else bias, y.view(-1), mean if two_d else mean.view(-1), r,
                        sxv, syv, eps)
            else:
                args = (flat, w, y.view(-1), r, sxv, syv, eps)
            if current() == index:
                kernel(*args)
            else:
                with torch.cuda.device(index):
                    kernel(*args)
            return NormOutputs(y, mean, rstd)

        return run

    @staticmethod
    def _flat(t: torch.Tensor) -> torch.Tensor:
        m, n = t.shape
        return t.as_strided(((m - 1) * t.stride(0) + n,), (1,))

    def _run(self, plan: Plan, x: torch.Tensor, weight, bias, eps: float, out: NormOutputs, with_bias: bool) -> None:
        compiled = compiler.compile_plan(plan)
        m = x.shape[0]
        vec = plan.vec
        sxv = x.stride(0) // vec if m > 1 else 0
        syv = out.y.stride(0) // vec if m > 1 else 0
        w = weight if weight is not None else _dummy(x.device, x.dtype)
        args = [self._flat(x), w]  # x flat, its rows sxv vectors apart
        if with_bias:
            args.append(bias if bias is not None else _dummy(x.device, x.dtype))
        args.append(self._flat(out.y))
        if with_bias:
            args.append(out.mean)
        args += [out.rstd, sxv, syv, float(eps)]
        with torch.cuda.device(x.device):
            compiled.kernel(*args)
