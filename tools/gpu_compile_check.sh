#!/usr/bin/env bash
# Compiles, on a machine without a GPU, every translation unit whose code differs in a CUDA
# build (CPPTRAIN_HAS_CUDA / CPPTRAIN_HAS_NCCL branches, *_cuda.cc, nccl_*.cc): the CMake
# build configured against PyPI's CUDA torch (the venv tools/test makes, whose torch is the
# current CUDA wheel with NCCL's headers beside it) and the CUDA toolkit's nvcc. It catches
# what would otherwise first fail on a GPU host, inside a lease of device time. It compiles;
# it links and runs nothing (the GPU host's LibTorch is 2.11, this one's is newer, so an API
# that only 2.11 lacks still slips through).
#   tools/gpu_compile_check.sh [VENV]     (default ~/.cache/cpptrain-venv; build in
#                                          ~/.cache/cpptrain-gpu-compile, kept between runs)
# Exits 0 when every such file compiled, 1 when one failed (its errors printed), 2 when the
# venv's torch has no CUDA or nvcc is missing.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
venv="${1:-${CPPTRAIN_VENV:-$HOME/.cache/cpptrain-venv}}"
build="${CPPTRAIN_GPU_COMPILE_BUILD:-$HOME/.cache/cpptrain-gpu-compile}"
nvcc="${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
site=$("$venv/bin/python" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' 2>/dev/null)
if [[ -z "$site" || ! -x "$nvcc" ]] ||
  ! "$venv/bin/python" -c 'import sys, torch; sys.exit(torch.version.cuda is None)' 2>/dev/null; then
  echo "gpu_compile_check: needs $venv with PyPI's CUDA torch (tools/install_torchrun.sh) and nvcc" >&2
  exit 2
fi
start=$SECONDS
if ! cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$site/torch/share/cmake" -DNCCL_ROOT="$site/nvidia/nccl" \
  -DCMAKE_CUDA_COMPILER="$nvcc" -DTORCH_CUDA_ARCH_LIST=9.0 -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCPPTRAIN_BUILD_TESTS=ON -DCPPTRAIN_BUILD_TOOLS=ON >"$build.configure.log" 2>&1; then
  tail -30 "$build.configure.log"
  echo "gpu_compile_check: CMake configure FAILED"
  exit 1
fi
grep -q "CUDA=ON CUDA kernels=ON NCCL=ON" "$build.configure.log" || {
  grep "cpptrain:" "$build.configure.log"
  echo "gpu_compile_check: the configuration lacks CUDA, its kernels or NCCL"
  exit 1
}
# The files whose compiled code a CUDA build changes, as object targets of the Makefiles.
mapfile -t sources < <(
  { git ls-files '*.cc' | xargs grep -l -E 'CPPTRAIN_HAS_(CUDA|NCCL)' ;
    git ls-files '*_cuda.cc' 'sharding/nccl_*.cc'; } | sort -u)
objects=()
for src in "${sources[@]}"; do objects+=("${src%.cc}.o"); done
failed=0
# The generated protobuf headers first (an object target alone does not generate them).
mapfile -t protos < <(make -C "$build" help | sed -n 's/^\.\.\. \(proto_[a-z_]*_cc_proto\)$/\1/p')
if ! out=$(make -C "$build" "${protos[@]}" 2>&1); then
  echo "$out" | grep -E "error" | head -20
  echo "FAILED: the protobuf libraries"
  failed=1
fi
for object in "${objects[@]}"; do
  if ! out=$(make -C "$build" "$object" 2>&1); then
    if grep -q "No rule to make target" <<<"$out"; then
      echo "not in the CUDA build: ${object%.o}.cc"
      continue
    fi
    echo "$out" | grep -E "error|Error" | head -20
    echo "FAILED: ${object%.o}.cc"
    failed=1
  fi
done
# The CUDA kernels themselves (nvcc, sm_90).
if ! out=$(make -C "$build" kernels_cuda_sources 2>&1); then
  echo "$out" | grep -E "error" | head -20
  echo "FAILED: kernels_cuda_sources"
  failed=1
fi
echo "gpu_compile_check: ${#objects[@]} files with CUDA branches and the kernels," \
  "$( ((failed)) && echo FAILED || echo compiled) in $((SECONDS - start)) s"
exit "$failed"
