# The verify plan of tools/gpu_run.sh (sourced by it: out, jobs, liger and ORIG_PYTHONPATH come from
# there). Four device calls, each a subcommand that prints its wall time and phases and writes one
# archive, $OUT/verify-<step>.tar.xz (its reports under reports/runs/verify-<step>/, so a report's
# resume command works as printed once the archive is unpacked in the project's root):
#   verify-checks   carry .devdeps/gpu-site.tar.xz and .gpu/apex-src: TileLang and Liger unpacked,
#                   apex built (beside the warm-up), harness.warm, then the full checks with Liger
#                   and apex (pytest harness --backend all, plain and fused, full profile)
#   verify-memory   carry .devdeps/peers-site.1.tar.xz: unpacked, then the 24 GiB run
#                   (--gpu-memory 24GiB --min-check-memory 1GiB) with Liger and apex
#   verify-peers    carry .devdeps/peers-site.2.tar.xz: unpacked, then QuACK and FlashInfer through
#                   every plain and fused check, full profile, with their plug-ins
#   verify-pdl      carry .devdeps/peers-site.1.tar.xz: unpacked, then the tests of programmatic
#                   dependent launch that need a card (the dependent-launch check against its planted
#                   kernel, the native replay with the attribute, TileLang's PDL programs)
#   verify-bench    carry .devdeps/peers-site.2.tar.xz where it is not unpacked yet (else nothing): the
#                   two-pass benchmark (headline, plain and fused) with every peer; then the peers'
#                   dependent-launch checks, and with the time left the decode and fp8 probe's
#                   candidates (tools/decode_fp8_candidates.py) in one pass of their own
# The decode plan (three calls): verify-checks, verify-pdl, verify-bench.
# The peers' two parts exceed one call's 64 MiB together, so they travel in consecutive calls on a
# machine kept warm (it goes back after 30 s idle): verify-memory's call brings the first part and
# runs the 24 GiB run meanwhile, verify-peers the second. Each step cuts itself short at its own time
# limit (VERIFY_LIMIT seconds from its start, default 560, under the device's 600): pytest gets SIGINT,
# writes its report with the checks it did not run (not-run.txt and the command that runs only
# those), and the archive is still written. With time left after a cut (a crash, an interrupt), the
# step runs that command itself and merges the two reports.
# GPU_RUN_DRY=1 (tools/gpu_run.sh verify-dry OUT runs the four in turn): the same steps on a CPU with
# tiny selections, the first cut short on purpose (tests/plugins/interrupt.py) and resumed.

vstart=$SECONDS
limit=${VERIFY_LIMIT:-560}
dry=${GPU_RUN_DRY:-0}
peers_files=(--backend-file examples/quack_backend.py --backend-file examples/flashinfer_backend.py)
step=${phase#verify-}
work=reports/runs/verify-$step

left() { echo $((limit - (SECONDS - vstart) - ${1:-0})); }

site() {  # the unpacked packs and apex on PYTHONPATH (a warm machine keeps /tmp)
  local p=$PWD
  [[ -d /tmp/apex ]] && p=$p:/tmp/apex
  [[ -d /tmp/site ]] && p=$p:/tmp/site
  [[ -d /tmp/site/nvidia_cutlass_dsl/dsl_packages ]] && p=$p:/tmp/site/nvidia_cutlass_dsl/dsl_packages
  export PYTHONPATH=$p${ORIG_PYTHONPATH:+:$ORIG_PYTHONPATH}
}

unpack() {  # a carried pack into /tmp/site
  local pack=$1 t=$SECONDS
  if [[ ! -f $pack ]]; then echo "$step: $pack not carried: not unpacked"; return; fi
  if [[ $dry == 1 ]]; then echo "$step: $pack not unpacked (a dry run: its wheels are the card's Python's)"; return; fi
  mkdir -p /tmp/site && tar -C /tmp/site -xJf "$pack"
  echo "$step: $pack unpacked, exit $?, $((SECONDS - t)) s"
}

build_apex() {  # NVIDIA/apex's layer-norm extension from the carried sources, into /tmp/apex
  [[ -d .gpu/apex-src ]] || { echo "$step: .gpu/apex-src not carried: apex not built"; return; }
  ls /tmp/apex/fused_layer_norm_cuda*.so > /dev/null 2>&1 && return
  mkdir -p /tmp/apex && TORCH_CUDA_ARCH_LIST=9.0 python -c "
from torch.utils.cpp_extension import load
src = '.gpu/apex-src/'
load('fused_layer_norm_cuda', [src + 'layer_norm_cuda.cpp', src + 'layer_norm_cuda_kernel.cu'], build_directory='/tmp/apex',
     extra_cflags=['-O3'], extra_cuda_cflags=['-O3', '--use_fast_math', '-maxrregcount=50'])" > "$work/apex-build.log" 2>&1
  echo "$step: apex built, exit $?"
}

warm_up() {  # SECONDS ARGS...: harness.warm under its own time limit
  local secs=$1 t=$SECONDS; shift
  (( secs < 10 )) && { echo "$step: warm-up not run: $secs s left"; return; }
  python -m harness.warm "$@" --jobs "$jobs" --time-limit "$secs" > "$work/warm.log" 2>&1
  echo "$step: warm-up exit $?, wall $((SECONDS - t)) s (limit $secs s): $(grep -m1 '^warmed in' "$work/warm.log")"
}

pytest_step() {  # NAME SECONDS ARGS...: one pytest run into $work/NAME, SIGINT at SECONDS
  local name=$1 secs=$2 t=$SECONDS; shift 2
  if (( secs < 30 )); then echo "$name: not run: $secs s left of the step's $limit"; return 1; fi
  timeout -s INT -k 30 "$secs" python -m pytest "$@" -q -p no:randomly --report-dir="$work/$name" > "$work/$name.log" 2>&1
  echo "$name: exit $?, wall $((SECONDS - t)) s (limit $secs s)" | tee -a "$work/$name.log"
  grep -E "^[0-9]+ (passed|failed|skipped)|^(normdiff phases|  worker time|  first compiles)|did not run|^  pytest|^then merge" \
    "$work/$name.log" | tail -n 8
}

resume_rest() {  # NAME: what a cut-short run left, run now where time is left, then the two merged
  local name=$1 listing=$work/$1/not-run.txt
  [[ -f $listing ]] || return 0
  local secs; secs=$(left 40)
  if (( secs < 90 )); then
    echo "$name: $(wc -l < "$listing") checks not run, left for a later call: $(grep -m1 -A1 'run only those' "$work/$name.log" | tail -n 1)"
    return 0
  fi
  local cmd; cmd=$(python -c "import json,sys; print(json.load(open(sys.argv[1]))['resume']['command'])" "$work/$name/correctness.json")
  echo "$name: resuming what it left: $cmd"
  eval "set -- ${cmd#pytest }"
  pytest_step "$name-rest" "$secs" "$@" ${dry_args[@]+"${dry_args[@]}"}
  python -m harness.report "$work/$name/correctness.json" "$work/$name-rest/correctness.json" --out "$work/$name-merged" \
    > /dev/null && python -m harness.report --phases "$work/$name-merged/correctness.json"
}

findings() {  # docs/findings/*.py, each a standalone repro, run on this card with the time left
  mkdir -p "$work/findings"
  for f in docs/findings/*.py; do
    local secs; secs=$(left 20)
    (( secs < 15 )) && { echo "findings: $f and those after it not run: $secs s left"; break; }
    local name rc; name=$(basename "$f" .py)
    timeout -k 5 "$(( secs < 60 ? secs : 60 ))" python "$f" > "$work/findings/$name.txt" 2>&1
    rc=$?  # 0: within the allowance; 1: the defect shows; 2: its library is not here; 124: out of time
    echo "finding $name: exit $rc" | tee -a "$work/findings/exits.txt"
  done
}

archive() {  # the step's one archive in $OUT
  echo "$step: wall $((SECONDS - vstart)) s" | tee "$work/wall.txt"
  cp "$out"/nvidia-smi.txt "$out"/native.log "$work"/ 2> /dev/null
  tar -C "$PWD" -cJf "$out/verify-$step.tar.xz" "$work" && rm -f "$out"/nvidia-smi.txt "$out"/native.log
  echo "$step: $out/verify-$step.tar.xz ($(du -h "$out/verify-$step.tar.xz" | cut -f1))"
}

rm -rf "$work" && mkdir -p "$work"
site
if [[ $dry == 1 ]]; then  # the CPU: tiny selections; the checks' run interrupted on purpose
  checks_sel=(--profile quick --backend torch --op rms_norm --dtype float32 -k "769 or 1000")
  dry_args=(-p tests.plugins.interrupt)
  export NORMDIFF_INTERRUPT_AFTER=${DRY_INTERRUPT_AFTER:-8}
  memory_sel=(--profile quick --backend torch --op rms_norm --dtype float32 --simulate-gpu 24GiB --min-check-memory 40MiB)
  peers_sel=(--profile quick --backend 'quack*,flashinfer*' "${peers_files[@]}" --op rms_norm,add_rms_norm --dtype float32 -k "769")
  bench_sel=(--profile quick --bench-rounds 3 --backend torch,liger,quack,flashinfer "${liger[@]}" "${peers_files[@]}"
             --op rms_norm,add_rms_norm --dtype bfloat16)
  warm_sel=(--profile quick --backend torch_compile)
  pdl_sel=(--profile quick --backend 'flashinfer*,triton' "${peers_files[@]}")
  probe_sel=(--profile quick --bench-rounds 3 --backend 'probe_*' --backend-file tools/decode_fp8_candidates.py
             --op rms_norm,add_rms_norm --dtype bfloat16)
else
  checks_sel=(--profile full --backend all "${liger[@]}")
  dry_args=()
  memory_sel=(--profile full --backend all "${liger[@]}" --gpu-memory 24GiB --min-check-memory 1GiB)
  peers_sel=(--profile full --backend 'quack*,flashinfer*' "${peers_files[@]}")
  bench_sel=(--profile full --bench-set headline --backend all "${liger[@]}" "${peers_files[@]}")
  warm_sel=(--profile full --backend triton,tilelang,torch_compile,liger "${liger[@]}")
  pdl_sel=(--profile full --backend 'flashinfer*' "${peers_files[@]}")
  probe_sel=(--profile full --bench-set headline --backend 'probe_*,triton,tilelang,flashinfer*'
             --backend-file tools/decode_fp8_candidates.py "${peers_files[@]}"
             -k "${PROBE_K:-e4m3 or 1x4096 or 64x4096 or 1x8192 or 64x8192}")
fi
case $step in
checks)
  unpack .devdeps/gpu-site.tar.xz
  [[ $dry == 1 ]] || { build_apex & }
  site
  warm_up "$(( ${WARM_LIMIT:-90} < $(left 400) ? ${WARM_LIMIT:-90} : $(left 400) ))" "${warm_sel[@]}"
  wait
  site
  pytest_step checks "$(left 40)" harness "${checks_sel[@]}" ${dry_args[@]+"${dry_args[@]}"}
  unset NORMDIFF_INTERRUPT_AFTER
  dry_args=()
  resume_rest checks
  ;;
memory)
  unpack .devdeps/peers-site.1.tar.xz
  [[ $dry == 1 || -d /tmp/site/tilelang ]] || echo "memory: TileLang and Liger not unpacked here (a fresh machine): verify-checks first"
  site
  pytest_step memory24 "$(left 40)" harness "${memory_sel[@]}"
  resume_rest memory24
  ;;
peers)
  unpack .devdeps/peers-site.2.tar.xz
  site
  pytest_step peers "$(left 100)" harness "${peers_sel[@]}"
  resume_rest peers
  findings
  ;;
pdl)
  unpack .devdeps/peers-site.1.tar.xz
  site
  pytest_step pdl-tests "$(left 30)" tests/test_dependent_launch.py tests/test_native_pdl.py tests/test_tilelang_pdl.py \
    tests/test_native.py -n 0 -rs
  ;;
bench)
  [[ $dry == 1 || -d /tmp/site/flashinfer ]] || unpack .devdeps/peers-site.2.tar.xz
  site
  [[ $dry == 1 ]] || warm_up "${WARM_LIMIT:-60}" --bench --profile full --backend triton,tilelang,torch_compile,liger "${liger[@]}"
  t=$SECONDS
  timeout -s INT -k 30 "$(left "${PROBE_RESERVE:-100}")" python -m pytest benchmarks --benchmark-only --bench-repeat 2 \
    "${bench_sel[@]}" -q -p no:randomly --report-dir="$work/bench" > "$work/bench.log" 2>&1
  echo "bench: exit $?, wall $((SECONDS - t)) s" | tee -a "$work/bench.log"
  tail -n 3 "$work/bench.log"
  pytest_step pdl-peers "$(( $(left 20) < 60 ? $(left 20) : 60 ))" harness/test_dependent_launch.py "${pdl_sel[@]}"
  pytest_step probe "$(left 20)" benchmarks --benchmark-only --bench-repeat 1 "${probe_sel[@]}"
  ;;
*) echo "usage: tools/gpu_run.sh verify|verify-dry|verify-checks|verify-memory|verify-peers|verify-pdl|verify-bench OUT" >&2; exit 2 ;;
esac
archive
