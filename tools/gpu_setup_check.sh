#!/usr/bin/env bash
# The GPU set-up path of the README on a machine without index access: the CUDA torch that is
# there, the project installed from the checkout with no index, then the doctor.
# tools/gpu_setup_check.sh OUT
set -uo pipefail
out=$1
mkdir -p "$out"
python -m pip install --no-index --no-build-isolation -e '.[triton,test]' > "$out/setup.log" 2>&1
echo "pip install --no-index -e '.[triton,test]': exit $?" | tee -a "$out/setup.log"
python -m pip show normdiff torch triton pytest-xdist 2>/dev/null | grep -E '^(Name|Version):' | paste - - | tee -a "$out/setup.log"
python -m harness.doctor --backend-file examples/liger_backend.py | tee "$out/doctor.txt"
