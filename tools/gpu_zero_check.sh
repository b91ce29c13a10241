#!/usr/bin/env bash
# The ZeRO engine on one GPU host in one call: DeepSpeed 0.19.8 from the carried .wheels/
# (installed with pip --target beside the host's own torch, whose Python may itself be a
# virtualenv that a nested venv would not see), a CMake build of what the runs need, the ZeRO
# unit tests, then tools/bench_compare.py of `tools/bench --engine=zero` against DeepSpeed's
# same stage for each of STAGES (default "1 2 3"; RUNS=3 per side, STEPS/WARMUP short so three
# stages fit one call). OFFLOAD=1 adds the Llama-3.2-3B ZeRO-2 + optimizer offload row.
# COUNTERPART=1 pairs each with PyTorch's closest counterpart instead (DDP +
# ZeroRedundancyOptimizer for stages 1 and 2, fully_shard for 3, fully_shard + CPUOffloadPolicy
# for the offload row). TESTS=0 skips the unit tests.
# Results go to $OUT (or /tmp/gpu_out) as they come, so a call cut short keeps what finished.
#   NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
#     CPPTRAIN_COMMIT=<hash> tools/gpu_zero_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
final="${OUT:-/tmp/gpu_out}"
out=/tmp/cpptrain_zero_logs
summary="$final/summary.txt"
mkdir -p "$out" "$final"
trap 'tar czf "$final/zero_logs.tgz" -C "$out" . 2>/dev/null' EXIT
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PATH="/usr/local/cuda/bin:$PATH" TORCH_CUDA_ARCH_LIST=9.0

# DeepSpeed beside the host's torch: every carried wheel without dependency resolution (pip
# --target would look for torch among the wheels), except numpy where the host has its own.
site=/tmp/cpptrain_ds_site
wheels=(.wheels/*.whl)
python3 -c 'import numpy' 2>/dev/null && wheels=($(ls .wheels/*.whl | grep -v '/numpy-'))
python3 -m pip install -q --no-index --no-deps --target "$site" "${wheels[@]}" >"$out/pip.log" 2>&1
echo "pip exit $?" | tee -a "$summary"
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" PATH="$site/bin:$PATH"
python3 -c 'import deepspeed, torch; print("deepspeed", deepspeed.__version__, "torch", torch.__version__)' \
  2>&1 | tail -1 | tee -a "$summary"
# DeepSpeed's FusedAdam compiles itself at first use (about a minute): start it beside our build
# (not when only PyTorch's counterparts run).
jit=
if [[ "${COUNTERPART:-0}" != 1 ]]; then
  (python3 -c 'from deepspeed.ops.op_builder import FusedAdamBuilder; FusedAdamBuilder().load()' \
    >"$out/fused_adam_jit.log" 2>&1; echo "deepspeed FusedAdam JIT exit $?" >>"$summary") &
  jit=$!
fi

prefix=/tmp/cpptrain_prefix
mkdir -p "$prefix"
for f in .debs/*.deb; do dpkg -x "$f" "$prefix"; done
export LD_LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
build=/tmp/cpptrain_build
start=$SECONDS
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$(env -u PYTHONPATH python3 -c 'import torch; print(torch.utils.cmake_prefix_path)');$prefix/usr" \
  -DCMAKE_MODULE_PATH="$prefix/usr/share/glog/cmake" -DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
  >"$out/build.log" 2>&1 &&
  cmake --build "$build" -j "$(nproc)" --target tools_bench tools_launch \
    engines_zero_zero_layout_test kernels_cpu_adamw_test tools_cpu_adamw_bench \
    >>"$out/build.log" 2>&1
code=$?
echo "build exit $code in $((SECONDS - start)) s" | tee -a "$summary"
if ((code != 0)); then
  grep -E "error|Error" "$out/build.log" | head -20 | tee -a "$summary"
  exit 1
fi
find_bin() { find "$build" -type f -name "$1" -perm -u+x | head -1; }
# (zero_engine_test needs Gloo, which pip's LibTorch lacks: it runs on the CPU build only.)
for test in $([[ "${TESTS:-1}" != 0 ]] && echo engines_zero_zero_layout_test kernels_cpu_adamw_test); do
  timeout 120 "$(find_bin "$test")" >"$out/$test.log" 2>&1
  echo "$test exit $?: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/$test.log" | tr '\n' ' ')" |
    tee -a "$summary"
done
# The host side of offload: the CPU AdamW on this host's threads (ADAMW_THREADS, default
# 1,4,8,16; then with the bf16 copy the offload step writes), and what the host's memory does
# for copy, scale and norm (HOST=0 skips all; BANDWIDTH=0 the second).
if [[ "${HOST:-1}" != 0 ]]; then
  for extra in "" --bf16_copy; do
    timeout 120 "$(find_bin cpu_adamw_bench)" --numel=400000000 \
      --threads="${ADAMW_THREADS:-1,4,8,16}" $extra >>"$out/cpu_adamw_bench.log" 2>&1
    echo "cpu_adamw_bench $extra exit $?" | tee -a "$summary"
  done
  grep -v '^{' "$out/cpu_adamw_bench.log" | tee -a "$summary"
  grep '^{' "$out/cpu_adamw_bench.log" | sed "s/}\$/, \"commit\": \"${CPPTRAIN_COMMIT:-unknown}\", \"date\": \"$(date -u +%FT%TZ)\"}/" \
    >>"$final/cpu_adamw_bench.jsonl"
  if [[ "${BANDWIDTH:-1}" != 0 ]]; then
    timeout 90 python3 tools/host_bandwidth_check.py 2>&1 | tee -a "$summary"
  fi
fi
[[ -n "$jit" ]] && wait "$jit"

gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | awk '{print tolower($NF)}')
jsonl="$final/$(date -u +%F)-${NPROC:-1}x${gpu}.jsonl"  # NPROC: processes (GPUs) a run
compare() {  # name, bench_compare flags...
  local name=$1
  shift
  timeout 600 python3 tools/bench_compare.py --launch "$(find_bin launch)" --bench "$(find_bin bench)" \
    --nproc "${NPROC:-1}" --runs "${RUNS:-3}" --steps "${STEPS:-6}" --warmup "${WARMUP:-2}" \
    --timeout 240 \
    --jsonl "$jsonl" --log_dir "$out/$name" "$@" >"$out/$name.log" 2>&1
  echo "$name exit $?:" | tee -a "$summary"
  grep -E '^[0-9]+ process|^\| (ours|torch) |^ours / torch|^largest|^bench_compare|differ' \
    "$out/$name.log" | tee -a "$summary"
  grep -h "ZeRO offload" "$out/$name"/ours*run1.log 2>/dev/null | tee -a "$summary"
}
counterpart() {  # stage, offload (0|1): bench_compare's --torch_engine flag (none: DeepSpeed)
  [[ "${COUNTERPART:-0}" != 1 ]] && return
  if [[ $2 == 1 ]]; then echo "--torch_engine fsdp2_offload"
  elif (($1 == 3)); then echo "--torch_engine fsdp2"
  else echo "--torch_engine zero_redundancy"; fi
}
vs=$([[ "${COUNTERPART:-0}" == 1 ]] && echo pytorch || echo deepspeed)
for stage in ${STAGES:-1 2 3}; do
  compare "zero${stage}_vs_$vs" --engine zero --zero_stage "$stage" \
    --init_dir /tmp/cpptrain_bench_init_qwen3-0.6b $(counterpart "$stage" 0)
done
if [[ "${OFFLOAD:-0}" == 1 ]]; then
  compare "zero2_offload_llama3b_vs_$vs" --model llama3.2-3b --seq_len 4096 --micro_batch 2 \
    --engine zero --zero_stage 2 --offload_optimizer cpu --init_dir /tmp/cpptrain_bench_init_llama3.2-3b \
    --ours_arg=--activation_checkpointing --torch_arg=--activation_checkpointing $(counterpart 2 1)
fi
