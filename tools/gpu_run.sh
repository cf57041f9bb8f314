#!/usr/bin/env bash
# One batched GPU session: the full-profile correctness run, the benchmark suite (full sweep, its
# bandwidth part twice for the repeatability check) and the framework's own tests, everything
# written under $1 (default: reports/gpu-run). Extra arguments go to both pytest runs.
# A timeout sends SIGINT: pytest then still writes the reports of what had run.
# The GPU machine has torch, triton and pytest but the project is not installed: use PYTHONPATH.
set -uo pipefail
out=${1:-reports/gpu-run}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$out/nvidia-smi.txt"
python -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
status=0
timeout -s INT "${HARNESS_TIMEOUT:-480}" python -m pytest harness --backend all --profile full --report-dir "$out" -q -p no:randomly "${@:2}" 2>&1 | tail -n 40 | tee "$out/harness.log" || status=1
timeout -s INT -k 30 "${BENCH_TIMEOUT:-480}" python -m pytest benchmarks --benchmark-only --profile full --bench-repeat 2 --report-dir "$out" -q -p no:randomly "${@:2}" 2>&1 | tail -n 60 | tee "$out/benchmark.log" || status=1
python -m pytest tests -q -x 2>&1 | tail -n 15 | tee "$out/tests.log" || status=1
exit $status
