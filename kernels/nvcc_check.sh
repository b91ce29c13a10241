#!/usr/bin/env bash
# Compiles every CUDA source of kernels/ for sm_90 with nvcc, as the GPU hosts' CMake build
# does, so a machine without a GPU (CI) still catches a kernel that does not build. Prints
# SKIPPED (and passes) only where no nvcc is installed; CI has one.
#   kernels/nvcc_check.sh            (from the repository root or a Bazel runfiles tree)
set -uo pipefail
cd "$(dirname "$0")/.."
nvcc=$(command -v nvcc || true)
for candidate in "${CUDA_HOME:-}/bin/nvcc" /usr/local/cuda/bin/nvcc; do
  [[ -z "$nvcc" && -x "$candidate" ]] && nvcc=$candidate
done
if [[ -z "$nvcc" ]]; then
  echo "SKIPPED nvcc_check: no nvcc on this machine (PATH, CUDA_HOME, /usr/local/cuda)"
  echo "nvcc_check: 0 compiled, 1 skipped"
  exit 0
fi
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
compiled=0
failed=0
for source in kernels/*.cu; do
  if "$nvcc" -std=c++17 -arch=sm_90 -O3 -I. -Xptxas -warn-spills -Werror all-warnings \
    -c "$source" -o "$scratch/$(basename "$source").o"; then
    compiled=$((compiled + 1))
  else
    echo "FAILED: $source does not compile with $nvcc"
    failed=$((failed + 1))
  fi
done
echo "nvcc_check: $compiled compiled, $failed failed ($("$nvcc" --version | tail -1))"
[[ $failed -eq 0 && $compiled -gt 0 ]]
