"""QuACK (``pip install quack-kernels==0.6.5``, CuTe DSL kernels) as an outside backend, loaded with

    pytest harness --backend-file examples/quack_backend.py --backend quack

It registers backend "quack", two variants per op:
- ``default``: the functions QuACK's own autograd Function and LayerNorm wrapper call, with their
  launch choices (the analytical heuristic, ``RmsNormFwdConfig.from_analytical_heuristic``):
  RMSNorm ``quack.rmsnorm.rmsnorm_fwd(x, weight, eps=eps, store_rstd=True)`` (what
  ``RMSNormFunction.forward`` calls when a gradient is needed, rmsnorm.py:1620-1633), LayerNorm
  ``quack.rmsnorm.layernorm_fwd(x, weight, bias, eps, return_rstd=True, return_mean=True)``.
- ``tuned``: QuACK's autotuned entry point, ``quack.rmsnorm.rmsnorm_fwd_tuned`` (``@autotune`` over
  every launch config, the winner cached per shape, stride class and dtype), forward only.
``quack`` is imported on first use, so this file loads, and its kernels register (skipped with the
reason), where QuACK is missing. Written against quack-kernels 0.6.5 with nvidia-cutlass-dsl
4.7.1; every line number below is of the 0.6.5 wheel's quack/ package unless a file is named.

What each call returns (rmsnorm.py):
- rmsnorm_fwd (:473) -> (out, residual_out, rstd): out = empty_like(x) (:488), rstd float32 (M,)
  when store_rstd (:489); residual_out is x here (no residual).
- layernorm_fwd (:1741) -> (out, rstd, mean), both float32 (M,) (:1775-1776).
- rmsnorm_fwd_tuned (:514) writes into the out, rstd and mean it is given; the plug-in allocates
  them inside the call, as rmsnorm_fwd does.

Declarations, each with its source:
- devices: CUDA only; the kernels are CuTe DSL programs for sm_80 and later (clusters on sm_90:
  RMSNorm._set_cluster_n, :97-105).
- dtypes: float32, float16, bfloat16 (``supported_types``, :395-396; layernorm_fwd :1766).
- LayerNorm: weight and bias float32 (asserted, :1767 and :1770) and a weight required
  (:1765); the plug-in converts the caller's weight and bias to float32 before the timed call
  (exact: every float16/bfloat16 value is a float32). Without a weight the default LayerNorm is
  refused with that reason; the tuned entry point takes no weight as well (its kernel's weight
  and bias are optional, :108-120) and runs it.
- RMSNorm: weight of any of the three dtypes, optional (:398); the caller's weight goes as it is.
- rows: QuACK compiles for a row stride and a start that are multiples of its vector of
  gcd(N, 16 bytes / element) elements (``div``, :446; compile_utils.py:28-32, ``assumed_align``).
  Rows that are not are copied to fresh contiguous rows first (outside the timed call: in
  bench_callable and user_call), as QuACK's autograd Function makes a tensor whose last stride is
  not 1 contiguous (``_ensure_contiguous``, :57-63). Strided rows that are go as they are.
- N: at most 262144, the longest rows QuACK's own tests run (tests/test_rmsnorm.py in its
  repository, N up to 262144; rows span a cluster of up to 16 blocks, rmsnorm_config.py:47-91):
  no limit in the code, a declared one here. Backward: float32 at most 131072
  (``RMSNormBackward.__init__`` raises beyond 128 Ki elements of 32 bits, :637-639).
- outputs: y and rstd (RMSNorm), y, mean and rstd (LayerNorm): the statistics QuACK returns.
- rounding: "once". y = x * rstd * w (+ b) in float32, rounded once to y's dtype (:350-360);
  rstd = rsqrt.approx (``fastmath=True``, :311 and :324), LayerNorm's variance two-pass about
  the row's mean (:265-311).
- backward (default variant): RMSNorm ``quack.rmsnorm.rmsnorm_bwd(x, weight, dy, rstd)`` (:1350)
  -> (dx, dw, db, dresidual); LayerNorm ``quack.rmsnorm.layernorm_bwd(x, weight, dy, rstd, mean,
  has_bias)`` (:1789) -> (dx, dw, db), which needs a weight (:1813). dw and db are float32
  partials per persistent block, ``get_sm_count(N)`` of them (rmsnorm_config.py:265-293: a multiple
  of the SM count by N), summed by torch and cast to the weight's dtype (:1378, :1835). The
  timed backward includes copying dx, dw and db into the caller's buffers, as for every kernel
  that allocates its own (the harness times ``_backward``). The tuned variant has none: QuACK's
  autograd runs the default backward, and rmsnorm_bwd_tuned (:1525) leaves sizing and summing
  the partials to its caller.
- compile key: the forward compiles once per dtypes, N and which of weight, bias, rstd and mean
  are given (``@jit_cache`` on _compile_rmsnorm_fwd, :426-470), M and the strides being run-time
  values; the backward also per power-of-two bucket of M (``T_hint``, :1271). The key is the
  backward's (the finer). The tuned variant's is its autotuner's key: the exact shape, the
  stride class (0, 1 or more) and the dtype of each tensor argument (autotuner.py:296-320).
- known issue, 16-bit rows of odd N (every such check of the default variant is expected to fail;
  the tuned variant refuses them, its autotuner would only compile every config in vain): x's
  vector is then one element (``vecsize = gcd(N, 128 // width)``, :126), and the kernel's copy of
  x into shared memory is a cp.async, which moves 4, 8 or 16 bytes only: the CuTe DSL refuses to
  build it ("'cp_size' only supports (32, 64, 128), but got 16"), forward and backward, RMSNorm
  and LayerNorm, float16 and bfloat16 (float32, and even N, compile). Reproduced outside the
  harness without a GPU, by compiling QuACK's forward for sm_90 as ``rmsnorm_fwd`` does::

      CUTE_DSL_ARCH=sm_90a QUACK_ARCH=sm_90 python -c "import importlib, cutlass;
      r = importlib.import_module('quack.rmsnorm'); bf = cutlass.BFloat16;
      r._compile_rmsnorm_fwd(bf, bf, None, bf, None, None, 7, True, False, False, False)"

  (N = 6 compiles; on a GPU, ``rmsnorm_fwd(x, w, store_rstd=True)`` on bfloat16 rows of 7 raises
  the same DSLRuntimeError).
- known issue, ``quack.tuned`` at N < 64: its autotune menu (``get_all_fwd_configs``,
  rmsnorm_config.py:405-439) has 64, 128 or 256 threads per row (``_AUTOTUNE_THREADS_PER_REDUCTION_DIM``,
  :303), and its pruner drops every config with threads_per_row * cluster_n > N (:491-508): below 64
  none is left, and ``builtins.min`` over the empty timings raises ``ValueError: min() iterable
  argument is empty`` (autotuner.py:441). Seen on an H100 at N = 1 to 32 (N = 64 ran); reproduced
  without a GPU by ``python -m tools.quack_findings autotune``.
- known issue, ``quack.tuned`` where its menu holds a config whose shared memory exceeds the GPU's:
  each CTA stages its (num_threads / threads_per_row) rows of N / cluster_n elements in shared memory
  (``sX``, rmsnorm.py:172-174; the tile of reduction_base.py:42-50), and the menu is pruned by N only,
  so at long rows a config with few blocks per row asks for more than sm_90's 232448 bytes (128
  threads, 64 per row, cluster 1 at bfloat16 N = 131072: 524304 bytes, read from its compiled host
  code by ``python -m tools.quack_findings launch``). Its launch fails with CUDA_LAUNCH_INVALID_CONFIG,
  a ``CUDADialectError`` (a ``DSLBaseError``, not a ``RuntimeError``), which the autotuner's bench
  does not catch (``except (RuntimeError, MemoryError)``, autotuner.py:216): the tuned call fails.
  Seen on an H100 in the benchmark at rms_norm bfloat16 16384 x 131072, with the whole menu. Declared
  where a config the capped autotuner benches (below) is over the limit by QuACK's own tile formula
  (``tile_smem``): the cap keeps configs near QuACK's pick, so at bfloat16 N = 131072 it benches
  none over it, while at float32 N = 32764 it still does (128 threads, 64 per row, cluster 1:
  524288 bytes). It may pass: the failing config of the GPU run was not recorded, and the autotuner
  benches the slow way, catching every error, where cloning its inputs fails (autotuner.py:363-378).
- autotuning cap (``AUTOTUNE_MAX_CONFIGS``, ``autotune_cap``): ``quack.tuned`` benches at most that
  many of its menu's configs per shape, those nearest QuACK's analytical heuristic (cluster size,
  then threads per row, threads per block and reload; the heuristic's own config first), through
  its autotuner's own ``perf_model`` and ``top_k`` (``prune_configs``, autotuner.py:466-488), set on the
  ``rmsnorm_fwd_tuned`` Autotuner when the plug-in first calls it. Its full menu is 75 configs on
  sm_90, and tuning 4 shapes took 70 s on an H100; the benchmark's preparation table prints the cap.
- workspace: QuACK's own y (or dx) and statistics, the float32 weight and bias, a row copy where
  made, the backward's dw and db partials; the tuned variant's first call per shape also clones
  its tensor arguments 4 to 16 times for its L2-cold timing (bench/bench_utils.py:179-202).
"""
from __future__ import annotations

import importlib
import math

import torch

from impls.base import NormGrads, NormKernel, NormOutputs, NormSpec, OptionalImport, ReproCall, cuda_present
from impls.fused import ADD_OPS, FusedGrads, FusedNormKernel, FusedOutputs, FusedParams
from impls.registry import register
from impls.repro_calls import source_of

QUACK_VERSION = "0.6.5"
CUTLASS_DSL_VERSION = "4.7.1"
MAX_N = 262144  # the longest rows QuACK's tests run
BACKWARD_F32_MAX_N = 131072  # RMSNormBackward.__init__: N > 128 Ki with 32-bit elements raises
L2_BYTES = 60 * 2**20  # the larger L2 of the cards the runs get (H200), for the autotuner's clones
PARTIALS_PER_SM = 16  # get_sm_count's largest multiple of the SM count (N <= 256)
QUACK = OptionalImport(
    "quack.rmsnorm",
    missing=(f"quack not importable: pip install quack-kernels=={QUACK_VERSION} "
             f"nvidia-cutlass-dsl=={CUTLASS_DSL_VERSION} (see docs/backends.md, Peers)"))


def _quack():
    """quack.rmsnorm (the module: ``quack.rmsnorm`` as an attribute is the function), or None."""
    mods = QUACK.modules()
    return None if mods is None else mods[0]


def availability() -> str | None:
    if _quack() is None:
        return QUACK.reason
    if not cuda_present():
        return "quack needs a CUDA device (its CuTe DSL kernels run on sm_80 and later GPUs only)"
    return None


def vector(n: int, dtype: torch.dtype) -> int:
    """Elements of QuACK's widest access for rows of N: its row strides and starts are multiples."""
    return math.gcd(n, 16 // torch.empty((), dtype=dtype).element_size())


def as_quack_takes(t: torch.Tensor | None, n: int) -> torch.Tensor | None:
    """``t`` where its rows (or its one row) start on QuACK's vector, else a fresh contiguous copy."""
    if t is None:
        return None
    v = vector(n, t.dtype)
    if t.stride(-1) == 1 and t.data_ptr() % (v * t.element_size()) == 0 and (t.dim() == 1 or t.stride(0) % v == 0):
        return t
    return t.clone(memory_format=torch.contiguous_format)


def odd_16bit(dtype: torch.dtype, n: int) -> bool:
    """Rows QuACK cannot compile for: 16-bit elements and an odd N (the known issue above)."""
    return dtype in (torch.float16, torch.bfloat16) and n % 2 == 1


ODD_16BIT = ("quack 0.6.5 compiles no kernel for 16-bit rows of odd N: its cp.async copy of one 16-bit "
             "element is refused by the CuTe DSL (cp_size 16; it moves 32, 64 or 128 bits)")


TUNED_MIN_N = 64  # the fewest threads per row in quack.tuned's autotune menu (cluster 1)
AUTOTUNE_EMPTY = ("quack 0.6.5's autotuner prunes every config of its menu below N = 64 (threads_per_row * "
                  "cluster_n > N for each) and raises ValueError: min() iterable argument is empty")
SM90_SMEM_BYTES = 232448  # the most dynamic shared memory a block may ask on sm_90 (the CuTe DSL's table)
AUTOTUNE_MAX_CONFIGS = 16  # quack.tuned's cap: configs benched per shape (of 75 on sm_90)
LAUNCH_SMEM = ("quack 0.6.5's autotune menu at N={n} holds configs whose shared memory exceeds sm_90's "
               "232448 bytes (up to {worst} bytes): CUDA refuses the launch (CUDA_LAUNCH_INVALID_CONFIG, a "
               "CUDADialectError its autotuner does not catch)")


def case_dtype(name: str | None) -> torch.dtype | None:
    """The torch dtype a case names (its ``dtype``, ``residual_dtype``), or None."""
    return getattr(torch, name) if name in ("float32", "float16", "bfloat16") else None


def tile_smem(cfg, n: int, x_bits: int, widest_bits: int) -> int:
    """Bytes of x QuACK's forward stages per CTA with launch config ``cfg`` (its sX: rows of the
    block by its share of the row, reduction_base.py:42-50; the cluster capped as
    ``_cap_cluster_n`` caps it); ``widest_bits``: the widest of x, weight, bias and y."""
    vec = math.gcd(n, 128 // widest_bits)
    cluster = min(cfg.cluster_n, 16, max(1, (n // vec) // cfg.threads_per_row))
    blocks = -(-(n // vec) // (cfg.threads_per_row * cluster))
    return (cfg.num_threads // cfg.threads_per_row) * vec * blocks * cfg.threads_per_row * x_bits // 8


def nearness(cfg, pick) -> tuple:
    """How far a launch config is from QuACK's analytical pick, for the autotuning cap: cluster
    size, then threads per row (log2 steps), then threads per block and reload differing."""
    steps = lambda a, b: abs(math.log2(a) - math.log2(b))  # noqa: E731
    return (steps(cfg.cluster_n, pick.cluster_n), steps(cfg.threads_per_row, pick.threads_per_row),
            cfg.num_threads != pick.num_threads, cfg.reload_from != pick.reload_from)


def capped(configs: list, pick, cap: int = AUTOTUNE_MAX_CONFIGS) -> list:
    """The ``cap`` configs nearest ``pick`` (ties in the menu's order)."""
    return sorted(configs, key=lambda c: nearness(c, pick))[:cap]


def _heuristic(n: int, x_bits: int, layer_norm: bool):
    cfg_mod = importlib.import_module("quack.rmsnorm_config")
    return cfg_mod.RmsNormFwdConfig.from_analytical_heuristic(n, x_bits, arch_major=9, is_layernorm=layer_norm)


def benched_configs(n: int, x_bits: int, layer_norm: bool) -> list | None:
    """The configs the capped autotuner benches at N on sm_90 (QuACK's menu, its own pruner's rule,
    then the cap), or None where QuACK does not import."""
    try:
        cfg_mod = importlib.import_module("quack.rmsnorm_config")
    except ImportError:
        return None
    menu = [c for c in cfg_mod.get_all_fwd_configs() if c.threads_per_row * c.cluster_n <= n]
    return capped(menu, _heuristic(n, x_bits, layer_norm))


def _cap_autotuner(tuner) -> None:
    """Set quack.tuned's cap on QuACK's Autotuner (``rmsnorm_fwd_tuned``; its own perf_model and
    top_k): the AUTOTUNE_MAX_CONFIGS configs nearest the analytical heuristic of each call's shape."""
    if getattr(tuner, "normdiff_cap", None) == AUTOTUNE_MAX_CONFIGS:
        return

    def distance(x, config, is_layernorm=False, **_):
        return nearness(config, _heuristic(x.shape[-1], 8 * x.element_size(), is_layernorm))

    tuner.perf_model, tuner.configs_top_k, tuner.normdiff_cap = distance, AUTOTUNE_MAX_CONFIGS, AUTOTUNE_MAX_CONFIGS


def repro_call(kernel) -> ReproCall:
    """A standalone repro (python -m harness.repro): quack.rmsnorm called as the plug-in calls it,
    the layout helpers (and the tuned variant's cap) copied in; each class's repro_forward is its
    _inputs, _entry and _forward, its repro_backward its _backward."""
    helpers = [vector, as_quack_takes, _f32]
    if kernel.variant == "tuned":
        helpers = [f"AUTOTUNE_MAX_CONFIGS = {AUTOTUNE_MAX_CONFIGS}", *helpers, nearness, _heuristic, _cap_autotuner]
    return ReproCall(
        imports='import importlib\n\nquack_rmsnorm = importlib.import_module("quack.rmsnorm")  # the module',
        source="\n\n\n".join(h if isinstance(h, str) else source_of(h) for h in helpers),
        forward=kernel.repro_forward, backward=getattr(kernel, "repro_backward", None),
        requires=f"pip install quack-kernels=={QUACK_VERSION} nvidia-cutlass-dsl=={CUTLASS_DSL_VERSION}")


def _m_bucket(rows: int) -> int:
    return 1 << max(rows - 1, 0).bit_length()


class _Quack(NormKernel):
    backend = "quack"
    packages = ("quack-kernels", "nvidia-cutlass-dsl")
    devices = ("cuda",)
    max_n = MAX_N
    rounding = "once"

    def availability(self) -> str | None:
        return availability()

    def note(self) -> str:
        import importlib.metadata as md

        found = []
        for pkg in self.packages:
            try:
                found.append(f"{pkg} {md.version(pkg)}")
            except md.PackageNotFoundError:
                found.append(f"{pkg} not installed")
        return f"{', '.join(found)} (written for quack-kernels {QUACK_VERSION}); {self.call_name}"

    repro_call = repro_call
    repro_inputs = "x, weight, bias = as_quack_takes(x, n), as_quack_takes(weight, n), as_quack_takes(bias, n)"
    repro_entry = ""  # _entry on the inputs, giving y, mean and rstd

    @property
    def repro_forward(self) -> str:
        return f"""
n = x.shape[-1]
{self.repro_inputs}
{self.repro_entry.strip()}
out.y.copy_(y.view(out.y.shape))
out.rstd.copy_(rstd.reshape(-1))
if out.mean is not None:
    out.mean.copy_(mean.reshape(-1))
"""

    def _inputs(self, x, weight, bias) -> tuple:
        """What QuACK's entry point requires of x, weight and bias, made before its call."""
        n = x.shape[-1]
        return as_quack_takes(x, n), as_quack_takes(weight, n), as_quack_takes(bias, n)

    def _entry(self, x, weight, bias, eps: float):
        """QuACK's entry point on prepared inputs; returns (y, mean or None, rstd)."""
        raise NotImplementedError

    def _call(self, x, weight, bias, eps):
        return self._entry(*self._inputs(x, weight, bias), eps)

    def bench_callable(self, x, weight, bias, eps, out):
        args = self._inputs(x, weight, bias)
        return lambda: self._entry(*args, eps)

    def user_call(self, x, weight, bias, eps):
        args = self._inputs(x, weight, bias)
        return self.call_name, lambda: self._entry(*args, eps)

    def _forward(self, x, weight, bias, eps, out: NormOutputs) -> None:
        y, mean, rstd = self._call(x, weight, bias, eps)
        out.y.copy_(y.view(out.y.shape))
        out.rstd.copy_(rstd.reshape(-1))
        if out.mean is not None:
            out.mean.copy_(mean.reshape(-1))

    def compile_key(self, spec: NormSpec):
        return ("quack", self.variant, spec.op, spec.dtype, spec.n, spec.has_weight, spec.has_bias,
                _m_bucket(spec.rows))

    def prepare(self, spec: NormSpec) -> None:
        """Compile (and for the tuned variant, autotune) outside any timed region."""
        if self.unsupported(spec):
            return
        rows = spec.rows if self.variant == "tuned" else min(spec.rows, 8)
        x = torch.randn(rows, spec.row_stride, dtype=spec.dtype, device="cuda")[:, :spec.n]
        w = torch.ones(spec.n, dtype=spec.dtype, device="cuda") if spec.has_weight else None
        b = torch.zeros(spec.n, dtype=spec.dtype, device="cuda") if spec.has_bias else None
        self._call(x, w, b, 1e-5)
        torch.cuda.synchronize()

    def workspace_bytes(self, spec: NormSpec) -> int:
        """QuACK's own outputs, float32 weight and bias, row copies and backward partials."""
        size = torch.empty((), dtype=spec.dtype).element_size()
        e, r, n = spec.rows * spec.n, spec.rows, spec.n
        copies = 2 * e * size  # x and dy made contiguous, where their rows are not as QuACK takes them
        partials = 2 * PARTIALS_PER_SM * _sm_count() * n * 4  # dw and db partials (backward)
        own = e * size + 8 * r + 8 * n  # y or dx, mean and rstd, weight and bias in float32
        return own + copies + partials


def _sm_count() -> int:
    return torch.cuda.get_device_properties(0).multi_processor_count if cuda_present() else 132


class _QuackDefault(_Quack):
    variant = "default"

    def known_issue(self, case, device: str, inputs=None) -> str | None:
        dtype = case_dtype(case.dtype)
        if device != "cuda" or dtype is None:
            return None
        return ODD_16BIT if odd_16bit(dtype, case.n) else None

    def backward_unsupported(self, spec: NormSpec) -> str | None:
        reason = super().backward_unsupported(spec)
        if reason:
            return reason
        if spec.dtype == torch.float32 and spec.n > BACKWARD_F32_MAX_N:
            return (f"N={spec.n}: quack's backward takes float32 rows of at most {BACKWARD_F32_MAX_N} "
                    "(RMSNormBackward: not enough shared memory beyond 128 Ki 32-bit elements)")
        return None


@register
class QuackRMSNorm(_QuackDefault):
    op = "rms_norm"
    outputs = ("y", "rstd")
    call_name = "quack.rmsnorm.rmsnorm_fwd(x, weight, eps=eps, store_rstd=True)"

    def _entry(self, x, weight, bias, eps):
        y, _, rstd = _quack().rmsnorm_fwd(x, weight, eps=eps, store_rstd=True)
        return y, None, rstd

    def _backward(self, x, weight, bias, dy, saved: NormOutputs, eps, out: NormGrads) -> None:
        n = x.shape[-1]
        dx, dw, _, _ = _quack().rmsnorm_bwd(as_quack_takes(x, n), weight, as_quack_takes(dy, n),
                                            saved.rstd.contiguous())
        out.dx.copy_(dx.view(out.dx.shape))
        if out.dw is not None:
            out.dw.copy_(dw)

    repro_entry = "y, _, rstd = quack_rmsnorm.rmsnorm_fwd(x, weight, eps=eps, store_rstd=True)\nmean = None"
    repro_backward = """
n = x.shape[-1]
dx, dw, _, _ = quack_rmsnorm.rmsnorm_bwd(as_quack_takes(x, n), weight, as_quack_takes(dy, n), saved.rstd.contiguous())
out.dx.copy_(dx.view(out.dx.shape))
if out.dw is not None:
    out.dw.copy_(dw)
"""


def _f32(t: torch.Tensor | None, n: int) -> torch.Tensor | None:
    return None if t is None else as_quack_takes(t.float(), n)


@register
class QuackLayerNorm(_QuackDefault):
    op = "layer_norm"
    outputs = ("y", "mean", "rstd")
    call_name = "quack.rmsnorm.layernorm_fwd(x, weight_f32, bias_f32, eps, return_rstd=True, return_mean=True)"

    def unsupported(self, spec: NormSpec) -> str | None:
        reason = super().unsupported(spec)
        if reason:
            return reason
        if not spec.has_weight:
            return "quack's layernorm_fwd and layernorm_bwd need a weight (they assert weight.dim() == 1)"
        return None

    def _inputs(self, x, weight, bias):
        n = x.shape[-1]
        return as_quack_takes(x, n), _f32(weight, n), _f32(bias, n)

    def _entry(self, x, weight, bias, eps):
        y, rstd, mean = _quack().layernorm_fwd(x, weight, bias, eps, return_rstd=True, return_mean=True)
        return y, mean, rstd

    def _backward(self, x, weight, bias, dy, saved: NormOutputs, eps, out: NormGrads) -> None:
        n = x.shape[-1]
        dx, dw, db = _quack().layernorm_bwd(as_quack_takes(x, n), _f32(weight, n), as_quack_takes(dy, n),
                                            saved.rstd.contiguous(), saved.mean.contiguous(),
                                            has_bias=bias is not None)
        out.dx.copy_(dx.view(out.dx.shape))
        out.dw.copy_(dw)
        if out.db is not None:
            out.db.copy_(db)

    repro_inputs = "x, weight, bias = as_quack_takes(x, n), _f32(weight, n), _f32(bias, n)"
    repro_entry = "y, rstd, mean = quack_rmsnorm.layernorm_fwd(x, weight, bias, eps, return_rstd=True, return_mean=True)"
    repro_backward = """
n = x.shape[-1]
dx, dw, db = quack_rmsnorm.layernorm_bwd(as_quack_takes(x, n), _f32(weight, n), as_quack_takes(dy, n),
                                         saved.rstd.contiguous(), saved.mean.contiguous(), has_bias=bias is not None)
out.dx.copy_(dx.view(out.dx.shape))
out.dw.copy_(dw)
if out.db is not None:
    out.db.copy_(db)
"""


class _QuackTuned(_Quack):
    variant = "tuned"
    is_layernorm = False
    # What bounds its preparation (the benchmark's preparation table prints it).
    autotune_cap = (f"autotuning: at most {AUTOTUNE_MAX_CONFIGS} of QuACK's launch configs per shape, those "
                    "nearest its analytical heuristic")

    def _launch_over(self, dtype: torch.dtype, n: int) -> int:
        """The most shared memory a config the capped autotuner benches at N asks beyond sm_90's
        limit (0: none over it, or QuACK missing)."""
        x_bits = 8 * torch.empty((), dtype=dtype).element_size()
        widest = 32 if self.is_layernorm else x_bits  # LayerNorm's weight and bias go as float32
        configs = benched_configs(n, x_bits, self.is_layernorm) or []
        worst = max((tile_smem(c, n, x_bits, widest) for c in configs), default=0)
        return worst if worst > SM90_SMEM_BYTES else 0

    def known_issue(self, case, device: str, inputs=None) -> str | None:
        dtype, n = case_dtype(case.dtype), case.n
        if device != "cuda" or dtype is None or odd_16bit(dtype, n):  # odd 16-bit rows: refused (unsupported)
            return None
        if n < TUNED_MIN_N:
            return AUTOTUNE_EMPTY
        worst = self._launch_over(dtype, n)
        return LAUNCH_SMEM.format(n=n, worst=worst) if worst else None

    def known_issue_may_pass(self, case, device: str, inputs=None) -> bool:
        # the launch issue: the failing config of the GPU run is not known
        return case_dtype(case.dtype) is not None and case.n >= TUNED_MIN_N

    def unsupported(self, spec: NormSpec) -> str | None:
        reason = super().unsupported(spec)
        if reason:
            return reason
        if odd_16bit(spec.dtype, spec.n):
            return ODD_16BIT + " (declared as quack.default's known issue)"
        return None

    def compile_key(self, spec: NormSpec):
        stride = min(spec.row_stride, 2) if spec.rows > 1 else None
        return ("quack", self.variant, spec.op, spec.dtype, spec.rows, spec.n, stride, spec.has_weight, spec.has_bias)

    def _entry(self, x, weight, bias, eps):
        _cap_autotuner(_quack().rmsnorm_fwd_tuned)
        y = torch.empty_like(x)
        rstd = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
        mean = torch.empty_like(rstd) if self.is_layernorm else None
        _quack().rmsnorm_fwd_tuned(x, weight, y, bias, rstd, mean, eps=eps,
                                   is_layernorm=self.is_layernorm, per_head=False)
        return y, mean, rstd

    @property
    def repro_entry(self) -> str:
        return f"""
_cap_autotuner(quack_rmsnorm.rmsnorm_fwd_tuned)
y = torch.empty_like(x)
rstd = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
mean = {"torch.empty_like(rstd)" if self.is_layernorm else None}
quack_rmsnorm.rmsnorm_fwd_tuned(x, weight, y, bias, rstd, mean, eps=eps, is_layernorm={self.is_layernorm}, per_head=False)
"""

    def workspace_bytes(self, spec: NormSpec) -> int:
        size = torch.empty((), dtype=spec.dtype).element_size()
        args = 2 * spec.rows * spec.row_stride * size + 8 * spec.rows + 8 * spec.n  # x, y, stats, w, b
        clones = max(4 * args, min(16 * args, 3 * L2_BYTES + args))
        return super().workspace_bytes(spec) + clones


@register
class QuackTunedRMSNorm(_QuackTuned):
    op = "rms_norm"
    outputs = ("y", "rstd")
    call_name = "quack.rmsnorm.rmsnorm_fwd_tuned(x, weight, out, None, rstd, None, eps=eps, is_layernorm=False)"


@register
class QuackTunedLayerNorm(_QuackTuned):
    op = "layer_norm"
    outputs = ("y", "mean", "rstd")
    is_layernorm = True
    call_name = ("quack.rmsnorm.rmsnorm_fwd_tuned(x, weight_f32, out, bias_f32, rstd, mean, eps=eps, "
                 "is_layernorm=True)")
    repro_inputs = QuackLayerNorm.repro_inputs

    def _inputs(self, x, weight, bias):
        n = x.shape[-1]
        return as_quack_takes(x, n), _f32(weight, n), _f32(bias, n)


# -- the fused family (impls.fused) -----------------------------------------------------------------
# QuACK's residual add and weight offset, through the public rmsnorm_fwd and rmsnorm_bwd
# (rmsnorm.py of the 0.6.5 wheel, as above):
# - rmsnorm_fwd(x, weight, residual=, residual_dtype=, eps=, store_rstd=, weight_offset=) (:473-506)
#   returns (out, residual_out, rstd), all new (:487-497): writes "new" only.
# - the add: x + residual in float32 (:252-255), residual_out its rounding to residual_dtype
#   (:256-260), which defaults to the residual's dtype (:490-495); the statistics and y are taken on
#   the float32 sum (:313-324, reloaded the same way :338-349): stats_on "float32_sum". The residual
#   may be float32, float16 or bfloat16 whatever x is (:399-400): residual_dtypes all three.
# - weight_offset: any float, added to the weight in float32, baked in at compile time (:72-79,
#   :354-356); QuACK's Gemma is 1.0 (:1683-1686). Declared 0 and 1.
# - rstd is returned (store_rstd=True, :489); no fp8 output (out_dtype casts y without a scale).
# - backward: what RMSNormFunction does (:1635, :1645-1663): rmsnorm_bwd on the forward's
#   residual_out (the rounded sum), with d_residual_out added to dx (:1132-1133), has_residual=True
#   (dresidual is dx, :1379-1380 and :1423-1424), the offset added to the weight (:1119-1120). dx
#   is in residual_out's dtype (:1382, :1443), copied into x's.
# - layernorm_fwd takes no residual (it passes None, :1778), so QuACK's add_layer_norm is not
#   reachable through its public LayerNorm entry point (only through rmsnorm_fwd_tuned's
#   is_layernorm=True, the autotuned one): not declared.
# Found by reading (documentation vs code): _rmsnorm_fwd's docstring (:391-392) says it returns the
# normalised tensor, and _rmsnorm_bwd's (:1239-1242) a tuple (dx, dw); both return None and write
# into the tensors they are given (:384, :1229); rmsnorm_fwd's comment at :503 names a dropout_p
# that is not one of its parameters.
class _QuackFused(FusedNormKernel):
    backend = "quack"
    packages = ("quack-kernels", "nvidia-cutlass-dsl")
    devices = ("cuda",)
    max_n = MAX_N
    rounding = "once"
    weight_offsets = (0.0, 1.0)

    note = _Quack.note

    def availability(self) -> str | None:
        return availability()

    def known_issue(self, case, device: str, inputs=None) -> str | None:
        """16-bit rows of odd N do not compile (the known issue above): x's, or a 16-bit residual's,
        which goes into shared memory by the same cp.async (:239-241; the vector is one element
        when N is odd, :126). A fused case's residual_dtype is None where it is x's."""
        dtypes = [d for d in (case_dtype(case.dtype), case_dtype(getattr(case, "residual_dtype", None))) if d]
        if device != "cuda" or not dtypes:
            return None
        return ODD_16BIT if any(odd_16bit(d, case.n) for d in dtypes) else None

    def backward_unsupported(self, spec) -> str | None:
        reason = super().backward_unsupported(spec)
        if reason:
            return reason
        src = spec.residual_dtype if spec.op in ADD_OPS and spec.residual_dtype is not None else spec.dtype
        if src == torch.float32 and spec.n > BACKWARD_F32_MAX_N:
            return (f"N={spec.n}: quack's backward takes float32 rows of at most {BACKWARD_F32_MAX_N} "
                    "(RMSNormBackward: not enough shared memory beyond 128 Ki 32-bit elements)")
        return None

    def _grads(self, src, weight, dy, d_residual_out, saved: FusedOutputs, weight_offset, out: FusedGrads) -> None:
        n = src.shape[-1]
        dres = None if d_residual_out is None else as_quack_takes(d_residual_out, n)
        dx, dw, _, dresidual = _quack().rmsnorm_bwd(
            as_quack_takes(src, n), weight, as_quack_takes(dy, n), saved.rstd.contiguous(), dres,
            has_bias=False, has_residual=out.dresidual is not None, weight_offset=weight_offset)
        out.dx.copy_(dx.view(out.dx.shape))
        if out.dresidual is not None:
            out.dresidual.copy_(dresidual.view(out.dresidual.shape))
        if out.dw is not None:
            out.dw.copy_(dw)

    repro_call = repro_call
    repro_grads = """
n = src.shape[-1]
dres = {dres}
dx, dw, _, dresidual = quack_rmsnorm.rmsnorm_bwd(
    as_quack_takes(src, n), weight, as_quack_takes(dy, n), saved.rstd.contiguous(), dres,
    has_bias=False, has_residual=out.dresidual is not None, weight_offset=weight_offset)
out.dx.copy_(dx.view(out.dx.shape))
if out.dresidual is not None:
    out.dresidual.copy_(dresidual.view(out.dresidual.shape))
if out.dw is not None:
    out.dw.copy_(dw)
"""  # _grads, with what its caller passes as d_residual_out


# The residual backward on 16-bit rows (docs/checks.md, *Found by it*): RMSNormFunction saves
# residual_out rounded to 16 bits and the forward's rstd, taken on the float32 sum
# (rmsnorm.py:1635-1663); rmsnorm_bwd (:1350-1425) then normalises the rounded residual_out with
# that rstd, so x^ = round(s) * rstd(s) is not unit-RMS and dx and dw err by a few 16-bit ulps.
# Declared by its condition (``residual_bwd_16bit``): a backward of the add with a 16-bit
# residual_out (in the residual's dtype, :490-495; x's dtype does not enter), in the one write
# convention QuACK has ("new"). Every such case of 64 or more rows failed (64 and 129 rows, N of
# 1000 to 8192), so it must fail there (a fix must undeclare it); fewer rows give the rounding
# fewer elements to show in, and may pass.
RESIDUAL_BWD_16BIT = ("quack 0.6.5's residual backward normalises residual_out rounded to 16 bits with the rstd of "
                      "the float32 sum (rmsnorm.py:1350-1425, :1635-1663): dx and dw off by up to 19x the allowance")
RESIDUAL_BWD_STRICT_ROWS = 64


def residual_bwd_16bit(case, device: str) -> bool:
    """A backward case of an add op on CUDA whose residual_out (the residual's dtype) is 16-bit."""
    residual = getattr(case, "residual_dtype", None) or case.dtype
    return (device == "cuda" and case.op in ADD_OPS and case.dy_dist is not None
            and residual in ("float16", "bfloat16"))


@register
class QuackAddRMSNorm(_QuackFused):
    op = "add_rms_norm"
    variant = "residual"
    outputs = ("y", "residual_out", "rstd")
    writes = ("new",)
    stats_on = "float32_sum"
    residual_dtypes = ("same", "float32", "float16", "bfloat16")
    call_name = ("quack.rmsnorm.rmsnorm_fwd(x, weight, residual=residual, eps=eps, store_rstd=True, "
                 "weight_offset=offset)")
    source = ("quack/rmsnorm.py:473-506 (rmsnorm_fwd: new out and residual_out, residual_out in the residual's "
              "dtype :490-495), :252-260 and :313-324 (float32 sum, rstd on it), :354-356 (weight_offset); "
              "backward :1350-1425 (rmsnorm_bwd with dresidual_out, has_residual), as RMSNormFunction :1635-1663")

    def _forward(self, x, residual, weight, bias, eps, params: FusedParams, out: FusedOutputs) -> None:
        n = x.shape[-1]
        y, r_out, rstd = _quack().rmsnorm_fwd(as_quack_takes(x, n), as_quack_takes(weight, n),
                                              residual=as_quack_takes(residual, n), eps=eps, store_rstd=True,
                                              weight_offset=float(params.weight_offset))
        out.y.copy_(y.view(out.y.shape))
        out.residual_out.copy_(r_out.view(out.residual_out.shape))
        out.rstd.copy_(rstd.reshape(-1))

    def bench_fused_callable(self, x, residual, weight, bias, eps, params, out):
        """rmsnorm_fwd as a user calls it (it allocates its outputs), without the copies into ``out``."""
        n, fn = x.shape[-1], _quack().rmsnorm_fwd
        args = (as_quack_takes(x, n), as_quack_takes(weight, n))
        r, offset = as_quack_takes(residual, n), float(params.weight_offset)
        return lambda: fn(*args, residual=r, eps=eps, store_rstd=True, weight_offset=offset)

    def _backward(self, src, weight, bias, dy, d_residual_out, saved, eps, weight_offset, out: FusedGrads) -> None:
        self._grads(src, weight, dy, d_residual_out, saved, weight_offset, out)

    repro_forward = """
n = x.shape[-1]
y, r_out, rstd = quack_rmsnorm.rmsnorm_fwd(as_quack_takes(x, n), as_quack_takes(weight, n),
                                           residual=as_quack_takes(residual, n), eps=eps, store_rstd=True,
                                           weight_offset=float(params.weight_offset))
out.y.copy_(y.view(out.y.shape))
out.residual_out.copy_(r_out.view(out.residual_out.shape))
out.rstd.copy_(rstd.reshape(-1))
"""
    repro_backward = _QuackFused.repro_grads.format(
        dres="None if d_residual_out is None else as_quack_takes(d_residual_out, n)")

    def known_issue(self, case, device: str, inputs=None) -> str | None:
        # Odd 16-bit rows compile nothing: that issue, not the backward's values.
        odd = super().known_issue(case, device, inputs)
        return odd or (RESIDUAL_BWD_16BIT if residual_bwd_16bit(case, device) else None)

    def known_issue_may_pass(self, case, device: str, inputs=None) -> bool:
        return (not super().known_issue(case, device, inputs) and residual_bwd_16bit(case, device)
                and case.rows < RESIDUAL_BWD_STRICT_ROWS)


@register
class QuackRMSNormOffset(_QuackFused):
    """rms_norm with Gemma's (1 + w): rmsnorm_fwd's weight_offset (:482, :498-499)."""

    op = "rms_norm"
    variant = "offset"
    outputs = ("y", "rstd")
    writes = ("new",)
    call_name = "quack.rmsnorm.rmsnorm_fwd(x, weight, eps=eps, store_rstd=True, weight_offset=offset)"
    source = ("quack/rmsnorm.py:473-506 (rmsnorm_fwd, weight_offset :482, :498-499), :72-79 and :350-360 "
              "(w + offset in float32); backward :1350-1425 (weight_offset :1358), :1119-1120")

    def _forward(self, x, residual, weight, bias, eps, params: FusedParams, out: FusedOutputs) -> None:
        n = x.shape[-1]
        y, _, rstd = _quack().rmsnorm_fwd(as_quack_takes(x, n), as_quack_takes(weight, n), eps=eps,
                                          store_rstd=True, weight_offset=float(params.weight_offset))
        out.y.copy_(y.view(out.y.shape))
        out.rstd.copy_(rstd.reshape(-1))

    def bench_fused_callable(self, x, residual, weight, bias, eps, params, out):
        n, fn = x.shape[-1], _quack().rmsnorm_fwd
        args, offset = (as_quack_takes(x, n), as_quack_takes(weight, n)), float(params.weight_offset)
        return lambda: fn(*args, eps=eps, store_rstd=True, weight_offset=offset)

    def _backward(self, src, weight, bias, dy, d_residual_out, saved, eps, weight_offset, out: FusedGrads) -> None:
        self._grads(src, weight, dy, None, saved, weight_offset, out)

    repro_forward = """
n = x.shape[-1]
y, _, rstd = quack_rmsnorm.rmsnorm_fwd(as_quack_takes(x, n), as_quack_takes(weight, n), eps=eps, store_rstd=True,
                                       weight_offset=float(params.weight_offset))
out.y.copy_(y.view(out.y.shape))
out.rstd.copy_(rstd.reshape(-1))
"""
    repro_backward = _QuackFused.repro_grads.format(dres="None")
