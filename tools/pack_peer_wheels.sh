#!/usr/bin/env bash
# Packs QuACK and FlashInfer (examples/quack_backend.py, examples/flashinfer_backend.py) for the
# GPU machine, which has torch 2.11, Triton 3.6, numpy and no package index: the two libraries and
# the wheels they load that it lacks, unpacked for its Python (3.12, x86-64) the way
# ../shared/device/pack-gpu-deps packs TileLang, what the norm kernels never load left out, and
# compressed with xz -9e (with the x86 filter, which shrinks the CuTe DSL's compiler library).
#
# Packed whole it is about 72 MiB, over a device call's 64 MiB, so it is written in two parts,
# each a tar.xz of its own under 60 MiB, unpacked in either order into the same folder in
# consecutive calls while the machine stays up:
#   .devdeps/peers-site.1.tar.xz   the CuTe DSL's MLIR compiler library (about 44 MiB)
#   .devdeps/peers-site.2.tar.xz   everything else (about 29 MiB)
# On the GPU machine, one part per call (carry it), into the folder TileLang's pack uses:
#   mkdir -p /tmp/site && tar -C /tmp/site -xJf .devdeps/peers-site.N.tar.xz
#   export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PWD
# (the second entry does what nvidia-cutlass-dsl's .pth file does in a site-packages, which a
# PYTHONPATH folder does not read).
#
# Left out: FlashInfer's C++ sources, headers and vendored CUTLASS/CCCL (flashinfer/data, 330 MB
# unpacked), which only its nvcc JIT kernels compile; the norms run its CuTe DSL kernels on sm_90.
# Also the CuTe DSL's aarch64 stub, static library and C header (ahead-of-time export only).
# Users install with plain pip (docs/backends.md, Peers).
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
grep -qx '/.devdeps/' .git/info/exclude 2>/dev/null || echo '/.devdeps/' >> .git/info/exclude
cache=${XDG_CACHE_HOME:-$HOME/.cache}/gpu-wheels
mkdir -p "$cache" .devdeps
plat=()
for n in 17 24 27 28 31 34 35; do plat+=(--platform "manylinux_2_${n}_x86_64"); done
# Pinned so that one resolution travels: the versions the plug-ins are written against, the
# CuTe DSL both accept (>= 4.7) at its last 4.7 release, the apache-tvm-ffi that TileLang 0.1.15
# also accepts, and cuda-python for the machine's CUDA 13.0 driver. --no-deps: the machine's own
# torch, Triton, numpy, packaging, tqdm and typing-extensions stay the ones it has. What
# ``import quack`` and ``import flashinfer`` load besides: requests (FlashInfer's artifacts module,
# at import) and pynvml (nvidia-ml-py); FlashInfer's other requirements (cuda-tile, nccl4py,
# nccl-extensions, nvidia-cudnn-frontend, click, tabulate) and QuACK's einops are not loaded by
# the norms and stay behind.
wheels=(
  quack-kernels==0.6.5 flashinfer-python==0.7.2.post1
  nvidia-cutlass-dsl==4.7.1 nvidia-cutlass-dsl-libs-base==4.7.1 nvidia-cutlass-dsl-libs-core==4.7.1
  nvidia-cutlass-dsl-libs-cu12==4.7.1
  apache-tvm-ffi==0.1.12 torch-c-dlpack-ext==0.1.5
  cuda-python==13.0.3 cuda-bindings==13.0.3 cuda-pathfinder==1.9.1 nvidia-ml-py==13.615.71
  requests==2.34.2 urllib3==2.8.0 idna==3.21 certifi==2026.10.19.post1 charset-normalizer==3.5.3
)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${plat[@]}" --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$cache" "${wheels[@]}"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
for spec in "${wheels[@]}"; do
  name=$(echo "${spec%%==*}" | tr - _ | tr '[:upper:]' '[:lower:]')
  version=${spec##*==}
  wheel=
  for w in "$cache/$name-$version"-{py3,cp312}-*.whl; do [ -f "$w" ] && wheel=$w && break; done
  [ -n "$wheel" ] || { echo "no Python 3.12 wheel for $spec in $cache" >&2; exit 1; }
  unzip -q -o "$wheel" -d "$stage"
done
rm -rf "$stage"/flashinfer/data "$stage"/nvidia_cutlass_dsl/cu12/include \
  "$stage"/nvidia_cutlass_dsl/cu12/lib/stubs "$stage"/nvidia_cutlass_dsl/cu12/lib/*.a
rm -f "$stage"/*.pth  # read from site-packages only; PYTHONPATH above does its work
# FlashInfer's build hooks: not run here, and TileLang's pack has a build_backend.py of its own.
rm -f "$stage"/build_backend.py "$stage"/build_utils.py
find "$stage" -name __pycache__ -prune -exec rm -rf {} +
compiler=nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs
ls "$stage"/$compiler/_cutlass_ir.cu12.*.so > /dev/null
rm -f .devdeps/peers-site.*.tar.xz
pack() {  # pack OUT [tar arguments...]
  local out=$1; shift
  tar -C "$stage" -cf - "$@" | xz -T1 --x86 --lzma2=preset=9e > "$out"
}
pack .devdeps/peers-site.1.tar.xz $(cd "$stage" && ls "$compiler"/_cutlass_ir.cu12.*.so)
pack .devdeps/peers-site.2.tar.xz --exclude="./$compiler/_cutlass_ir.cu12.*.so" .
limit=$((60 * 1024 * 1024))
for f in .devdeps/peers-site.*.tar.xz; do
  size=$(stat -c %s "$f")
  mib=$(awk -v s="$size" 'BEGIN { printf "%.1f", s / 1048576 }')
  echo "$f: $size bytes ($mib MiB)$([ "$size" -lt "$limit" ] || echo ': OVER 60 MiB')"
done
echo "unpacked: $(du -sh "$stage" | cut -f1) in $(find "$stage" -type f | wc -l) files"
