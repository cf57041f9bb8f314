#!/usr/bin/env bash
# A batched GPU session, in phases that each fit one device call (10 minutes):
#   tools/gpu_run.sh verify OUT   prints the verify plan: four calls (verify-checks, verify-memory,
#                                 verify-peers, verify-bench), what each carries and runs, one archive
#                                 each (tools/gpu_verify.sh); verify-dry OUT runs them on a CPU
#   tools/gpu_run.sh checks OUT   correctness, full profile, every backend (one command: xdist workers),
#                                 after harness.warm (WARM_LIMIT seconds, default 90; CHECKS_WARM=0: none);
#                                 CHECKS_K selects a part (pytest -k), e.g. to time it alone;
#                                 CHECKS_ARGS adds pytest arguments (e.g. "--shard 1/2" for half a run);
#                                 CHECKS_CANDIDATES=1 checks the long-row probe's open candidates
#                                 instead (tools/candidate_backend.py; NORMDIFF_CANDIDATES narrows)
#   tools/gpu_run.sh setup OUT    once per machine: TileLang and Liger unpacked from .devdeps into
#                                 /tmp/site, apex's extension built from .gpu/apex-src into
#                                 /tmp/apex (NVIDIA/apex's csrc layer-norm files, carried); later
#                                 phases find both there (a warm machine keeps /tmp)
#   tools/gpu_run.sh memory OUT   the checks on a card of 24 GiB where memory decides: every backend
#                                 with Liger, --gpu-memory 24GiB --min-check-memory 1GiB
#   tools/gpu_run.sh peers OUT    one part of QuACK and FlashInfer (PEERS_PART=1 or 2; tools/pack_peer_wheels.sh)
#                                 unpacked into /tmp/site: one part a call, the machine kept warm between
#   tools/gpu_run.sh fused OUT    the fused family's checks (harness/test_fused.py), full profile, with the
#                                 three plug-ins; FUSED_BACKENDS (default all), FUSED_ARGS adds pytest arguments
#   tools/gpu_run.sh tests OUT    the framework's tests
#   tools/gpu_run.sh bench OUT    the benchmark suite (BENCH_SET, default full: the whole sweep; BENCH_REPEAT passes of the bandwidth
#                                 part, default 2), the measured shapes (docs/measurements.md); tools.host_cost. BENCH_ARGS adds
#                                 pytest arguments (e.g. "--dtype float16" for one share of a split
#                                 run); BENCH_BACKENDS the backends (default all: the warm-up then
#                                 compiles those among triton, tilelang, torch_compile, apex, liger);
#                                 BENCH_K a pytest -k selection; BENCH_EXTRAS=0 leaves out the measured
#                                 shapes and tools.host_cost
#   tools/gpu_run.sh sweep OUT [ARGS]   the Triton launch-setting sweep (python -m tools.triton_sweep ARGS)
#   tools/gpu_run.sh longprobe OUT   tools.long_row_probe (x of about 1 GiB) for each of PROBE_DTYPES
#                                 (default bfloat16; with Triton's compiles, about one dtype fits a
#                                 call): LayerNorm's candidates matching PROBE_LN, then RMSNorm's
#                                 matching PROBE_RMS (regular expressions, "" for none; defaults: the
#                                 registered kernels and the candidates not measured yet), each probe
#                                 under PROBE_BUDGET seconds (default 150), each N's candidates timed
#                                 twice (--again); one output folder each
# The GPU machine has torch, triton and pytest but the project is not installed: PYTHONPATH.
# TileLang and Liger come unpacked on PYTHONPATH (../shared/device/README.md), apex's extension
# wherever APEX_LIB points. The checks are one pytest run whose xdist workers share the GPU and
# compile in parallel; the benchmark's compilation is done first in parallel (harness.warm) so the
# timing process loads compiled code. A timeout sends SIGINT: pytest then still writes the report.
set -uo pipefail
phase=$1 out=$2
mkdir -p "$out"
ORIG_PYTHONPATH=${PYTHONPATH:-}
case $phase in
verify)
  cat <<PLAN
The verify plan: four device calls back to back (the machine goes back after 30 s idle), each
under its own limit (VERIFY_LIMIT, default 560 s; timeout_s 600), each writing \$OUT/verify-<step>.tar.xz.
Set NORMDIFF_COMMIT to the commit carried (the machine's git record may be stale).
  1. carry .devdeps/gpu-site.tar.xz .gpu/apex-src:
       NORMDIFF_COMMIT=\$(git rev-parse --short HEAD) tools/gpu_run.sh verify-checks \$OUT
  2. carry .devdeps/peers-site.1.tar.xz:
       NORMDIFF_COMMIT=... tools/gpu_run.sh verify-memory \$OUT
  3. carry .devdeps/peers-site.2.tar.xz:
       NORMDIFF_COMMIT=... tools/gpu_run.sh verify-peers \$OUT
  4. carry nothing:
       NORMDIFF_COMMIT=... tools/gpu_run.sh verify-bench \$OUT
The decode plan (three calls, back to back): 1 as above; then
  2. carry .devdeps/peers-site.1.tar.xz:  NORMDIFF_COMMIT=... tools/gpu_run.sh verify-pdl \$OUT
  3. carry .devdeps/peers-site.2.tar.xz:  NORMDIFF_COMMIT=... tools/gpu_run.sh verify-bench \$OUT
Unpack each archive in the project's root (tar -xJf verify-<step>.tar.xz): its reports land in
reports/runs/verify-<step>/, where a cut-short run's printed command runs what it left (carry
that folder) and python -m harness.report merges the two.
PLAN
  exit 0 ;;
verify-dry)
  rc=0
  for s in checks memory peers pdl bench; do
    GPU_RUN_DRY=1 VERIFY_LIMIT=${VERIFY_LIMIT:-420} "$0" "verify-$s" "$out" || rc=1
    [[ -f $out/verify-$s.tar.xz ]] || { echo "verify-dry: no archive of verify-$s"; rc=1; }
  done
  for s in checks memory peers; do
    tar -tJf "$out/verify-$s.tar.xz" | grep "correctness.json$" > /dev/null || { echo "verify-dry: verify-$s holds no report"; rc=1; }
  done
  tar -tJf "$out/verify-bench.tar.xz" | grep "benchmark.json$" > /dev/null || { echo "verify-dry: verify-bench holds no report"; rc=1; }
  echo "verify-dry: exit $rc"; ls -la "$out"
  exit $rc ;;
esac
[[ -d /tmp/site ]] && PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
# nvidia-cutlass-dsl's .pth file, which a PYTHONPATH folder does not read (tools/pack_peer_wheels.sh)
[[ -d /tmp/site/nvidia_cutlass_dsl/dsl_packages ]] && PYTHONPATH=$PYTHONPATH:/tmp/site/nvidia_cutlass_dsl/dsl_packages
[[ -d /tmp/apex && -z ${APEX_LIB:-} ]] && APEX_LIB=/tmp/apex
export PYTHONPATH=$PWD${APEX_LIB:+:$APEX_LIB}${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TORCHINDUCTOR_FX_GRAPH_CACHE=1
jobs=$(nproc)
liger=(--backend-file examples/liger_backend.py)
command -v nvidia-smi > /dev/null &&
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$out/nvidia-smi.txt"
python -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
# The native launcher (impls.native), built once up front rather than by the first worker to ask.
[[ ${GPU_RUN_DRY:-0} == 1 ]] ||
  python -m impls.native > "$out/native.log" 2>&1 || echo "native launcher: $(tail -n 1 "$out/native.log")"
pt() { timeout -s INT -k 20 "$1" python -m pytest "${@:2}" -q -p no:randomly; }
case $phase in
setup)
  start=$SECONDS
  mkdir -p /tmp/site && tar -C /tmp/site -xJf .devdeps/gpu-site.tar.xz
  mkdir -p /tmp/apex && TORCH_CUDA_ARCH_LIST=9.0 python -c "
from torch.utils.cpp_extension import load
src = '.gpu/apex-src/'
load('fused_layer_norm_cuda', [src + 'layer_norm_cuda.cpp', src + 'layer_norm_cuda_kernel.cu'], build_directory='/tmp/apex',
     extra_cflags=['-O3'], extra_cuda_cflags=['-O3', '--use_fast_math', '-maxrregcount=50'])" > "$out/apex-build.log" 2>&1
  echo "setup: apex exit $?, $((SECONDS - start)) s"
  PYTHONPATH=/tmp/site:/tmp/apex:$PYTHONPATH python -m harness.doctor --backend-file examples/liger_backend.py | tee "$out/doctor.txt"
  ;;
memory)
  start=$SECONDS
  timeout -s INT -k 20 "${MEMORY_TIMEOUT:-400}" python -m pytest harness --profile full --backend all "${liger[@]}" \
     --gpu-memory 24GiB --min-check-memory 1GiB -q -p no:randomly --report-dir="$out" > "$out/memory.log" 2>&1
  echo "memory: exit $?, wall $((SECONDS - start)) s" | tee -a "$out/memory.log"
  tail -n 6 "$out/memory.log"
  ;;
verify-*)
  source tools/gpu_verify.sh
  ;;
checks)
  select=(); [[ -n ${CHECKS_K:-} ]] && select=(-k "$CHECKS_K")
  chosen=(--backend all "${liger[@]}")
  [[ ${CHECKS_CANDIDATES:-0} == 1 ]] && chosen=(--backend 'candidate_*' --backend-file tools/candidate_backend.py)
  start=$SECONDS
  # Every check's specialisations compiled first, in parallel (harness.warm); the run loads them.
  [[ ${CHECKS_WARM:-1} == 1 && ${CHECKS_CANDIDATES:-0} == 0 ]] &&
    python -m harness.warm --profile full --backend triton,tilelang,torch_compile,liger "${liger[@]}" --jobs "$jobs" \
      --time-limit "${WARM_LIMIT:-90}" 2>&1 | tail -n 12 | tee "$out/warm.log"
  timeout -s INT -k 20 "${CHECKS_TIMEOUT:-560}" python -m pytest harness \
     --profile full "${chosen[@]}" -q -p no:randomly --report-dir="$out" "${select[@]}" ${CHECKS_ARGS:-} \
     > "$out/checks.log" 2>&1
  echo "checks: exit $?, wall $((SECONDS - start)) s" | tee -a "$out/checks.log"
  tail -n 6 "$out/checks.log"
  ;;
peers)
  start=$SECONDS
  mkdir -p /tmp/site && tar -C /tmp/site -xJf ".devdeps/peers-site.${PEERS_PART:?PEERS_PART=1 or 2}.tar.xz"
  echo "peers part $PEERS_PART: exit $?, $((SECONDS - start)) s"
  ;;
fused)
  peers=("${liger[@]}" --backend-file examples/quack_backend.py --backend-file examples/flashinfer_backend.py)
  start=$SECONDS
  timeout -s INT -k 20 "${FUSED_TIMEOUT:-500}" python -m pytest harness/test_fused.py --profile full \
     --backend "${FUSED_BACKENDS:-all}" "${peers[@]}" -q -p no:randomly --report-dir="$out" ${FUSED_ARGS:-} \
     > "$out/fused.log" 2>&1
  echo "fused: exit $?, wall $((SECONDS - start)) s" | tee -a "$out/fused.log"
  tail -n 12 "$out/fused.log"
  ;;
probe)  # the decode and fp8 candidates (tools/decode_fp8_candidates.py) beside the kernels, one pass;
  # first the PDL tests that need a card (the dependent-launch check, its planted kernel, the native replay)
  start=$SECONDS
  if [[ ${GPU_RUN_DRY:-0} == 0 && -f .devdeps/gpu-site.tar.xz && ! -d /tmp/site/tilelang ]]; then
    mkdir -p /tmp/site && tar -C /tmp/site -xJf .devdeps/gpu-site.tar.xz; echo "probe: gpu-site unpacked, exit $?"
    export PYTHONPATH=$PWD:/tmp/site${ORIG_PYTHONPATH:+:$ORIG_PYTHONPATH}
  fi
  cand=(--backend-file tools/decode_fp8_candidates.py)
  pt "${PROBE_TESTS_TIMEOUT:-150}" ${PROBE_TESTS:-tests/test_dependent_launch.py tests/test_native_pdl.py tests/test_tilelang_pdl.py} \
     -n 0 -rs > "$out/probe-tests.log" 2>&1
  echo "probe tests: exit $?, $((SECONDS - start)) s"; tail -n 4 "$out/probe-tests.log"
  pt 120 harness/test_dependent_launch.py --backend "${PROBE_BACKENDS:-triton,tilelang,probe_*}" "${cand[@]}" \
     --report-dir="$out/probe-pdl" > "$out/probe-pdl.log" 2>&1
  echo "probe dependent-launch checks: exit $?, $((SECONDS - start)) s"; tail -n 2 "$out/probe-pdl.log"
  [[ ${GPU_RUN_DRY:-0} == 1 ]] ||
    timeout 100 python -m harness.warm --bench --profile full --backend "${PROBE_BACKENDS:-triton,tilelang,probe_*}" \
      "${cand[@]}" --jobs "$jobs" > "$out/probe-warm.log" 2>&1
  pt "${PROBE_TIMEOUT:-300}" benchmarks --benchmark-only --profile full --bench-set headline --bench-repeat 1 \
     --backend "${PROBE_BACKENDS:-triton,tilelang,probe_*},torch,liger" "${cand[@]}" "${liger[@]}" \
     -k "${PROBE_K:-e4m3 or 1x4096 or 64x4096 or 1x8192 or 64x8192}" --report-dir="$out/probe" ${PROBE_ARGS:-} \
     > "$out/probe.log" 2>&1
  echo "probe: exit $?, wall $((SECONDS - start)) s"; tail -n 3 "$out/probe.log"
  ;;
tests)
  pt "${TESTS_TIMEOUT:-300}" tests -n 0 > "$out/tests.log" 2>&1; tail -n 3 "$out/tests.log"
  ;;
bench)
  backends=${BENCH_BACKENDS:-all} compiled=triton,tilelang,torch_compile,apex,liger
  [[ $backends != all ]] && compiled=$backends
  select=(); [[ -n ${BENCH_K:-} ]] && select=(-k "$BENCH_K")
  timeout "${WARM_TIMEOUT:-130}" python -m harness.warm --bench --backend "$compiled" "${liger[@]}" --jobs "$jobs" 2>&1 | tail -n 12 | tee "$out/warm.log"
  pt "${BENCH_TIMEOUT:-380}" benchmarks --benchmark-only --profile full --bench-set "${BENCH_SET:-full}" \
     --bench-repeat "${BENCH_REPEAT:-2}" \
     --backend "$backends" "${liger[@]}" "${select[@]}" \
     --report-dir="$out" ${BENCH_ARGS:-} > "$out/benchmark.log" 2>&1
  tail -n 15 "$out/benchmark.log"
  [[ ${BENCH_EXTRAS:-1} == 0 ]] && exit 0
  # The shapes docs/measurements.md quotes, each kernel of the project, bf16.
  timeout 50 python -m harness.measure --backend triton,tilelang --dtype bfloat16 \
     --shapes 16384x4096,16384x4000,32768x1024,4096x65536 --json "$out/measure.json" > "$out/measure.log" 2>&1
  tail -n 30 "$out/measure.log"
  timeout 120 python -m tools.host_cost "${liger[@]}" --json "$out/host_cost.json" > "$out/host_cost.log" 2>&1
  tail -n 20 "$out/host_cost.log"
  ;;
sweep)
  # Any further arguments go to the sweep, e.g. `--variants looped,rowwise --dtypes float16`.
  timeout 300 python -m tools.triton_sweep "${@:3}" --json "$out/triton-sweep.json" > "$out/triton-sweep.log" 2>&1
  tail -n 80 "$out/triton-sweep.log"
  ;;
longprobe)
  ln=${PROBE_LN-'^(tilelang\.layer_norm_cluster( wb ahead 2| 3 blocks an SM| AllReduce sums| L2 ahead [12]| cluster<=16( 2 rows)?| [0-9]+ rows in turn.*)?|triton\.split( L2 ahead [12]| L2 only( ahead 2| [0-9]+x[0-9]+w)?)?)$'}
  rms=${PROBE_RMS-'^(tilelang\.cluster( 1 row| L2 ahead [12])?|triton\.split( L2 ahead [12]| L2 only( ahead 2| [0-9]+x[0-9]+w)?)?)$'}
  budget=${PROBE_BUDGET:-150}
  for dt in ${PROBE_DTYPES:-bfloat16}; do
    for op in layer_norm rms_norm; do
      only=$ln; [[ $op == rms_norm ]] && only=$rms  # PROBE_LN= / PROBE_RMS= (empty): that op not probed
      [[ -z $only ]] && continue
      timeout -k 10 $((budget + 40)) python -m tools.long_row_probe --tiers 3 --jobs "$jobs" --ops $op --dtype "$dt" \
        --only "$only" --budget "$budget" --again --out "$out/probe-$op-$dt" > "$out/probe-$op-$dt.log" 2>&1
      echo "$op $dt: exit $?"; tail -n 1 "$out/probe-$op-$dt.log"
    done
  done
  ;;
*) echo "usage: tools/gpu_run.sh verify|verify-dry|verify-checks|verify-memory|verify-peers|verify-pdl|verify-bench|setup|peers|fused|checks|memory|probe|tests|bench|sweep|longprobe OUT [sweep arguments]" >&2; exit 2 ;;
esac
