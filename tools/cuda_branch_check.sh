#!/usr/bin/env bash
# Compiles, syntax only, the C++ sources whose CUDA branches (#if CPPTRAIN_HAS_CUDA,
# CPPTRAIN_HAS_CUDA_KERNELS) only the GPU hosts' CMake build compiles, against the CUDA headers
# of PyPI's torch in VENV and the CUDA toolkit's. The Bazel build here compiles their CPU
# branches only, so an error in a CUDA branch used to surface first on a GPU lease, costing its
# build. PyPI's torch is newer than the GPU hosts' LibTorch 2.11 and wants C++20, so a pass
# here is strong evidence, not proof, that the GPU build compiles. Prints SKIPPED (and passes)
# where VENV has no torch with CUDA headers or no CUDA toolkit is installed.
#   tools/cuda_branch_check.sh ~/.cache/cpptrain-venv
set -uo pipefail
cd "$(dirname "$0")/.."
venv="${1:?usage: tools/cuda_branch_check.sh VENV}"
torch_dir=$("$venv/bin/python" -c 'import os, torch; print(os.path.dirname(torch.__file__))' \
  2>/dev/null)
cuda_include=""
for candidate in "${CUDA_HOME:-/nonexistent}/include" /usr/local/cuda/include; do
  [[ -z "$cuda_include" && -f "$candidate/cuda_runtime_api.h" ]] && cuda_include=$candidate
done
if [[ -z "$torch_dir" || ! -f "$torch_dir/include/ATen/cuda/CUDAContext.h" || -z "$cuda_include" ]]
then
  echo "SKIPPED cuda_branch_check: needs torch with CUDA headers in $venv and a CUDA toolkit"
  echo "cuda_branch_check: 0 checked, 1 skipped"
  exit 0
fi
mapfile -t sources < <(git grep -l -E 'CPPTRAIN_HAS_CUDA' -- '*.cc' ':!third_party')
check() {
  g++ -std=c++20 -fsyntax-only -DCPPTRAIN_HAS_CUDA=1 -DCPPTRAIN_HAS_CUDA_KERNELS=1 -I. \
    -Ibazel-bin -I"$2/include" -I"$2/include/torch/csrc/api/include" -I"$3" "$1" 2>&1 |
    grep -E 'error' | head -5 | sed "s|^|$1: |"
}
export -f check
failures=$(printf '%s\n' "${sources[@]}" |
  xargs -P "$(nproc)" -I{} bash -c 'check "$@"' _ {} "$torch_dir" "$cuda_include")
echo "$failures" | grep . || true
failed=$(echo "$failures" | grep -o '^[^:]*' | sort -u | grep -c . || true)
version=$("$venv/bin/python" -c 'import torch; print(torch.__version__)')
echo "cuda_branch_check: $((${#sources[@]} - failed)) of ${#sources[@]} sources compile" \
  "(torch $version headers)"
((failed == 0 && ${#sources[@]} > 0))
