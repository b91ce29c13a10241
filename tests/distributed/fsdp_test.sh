#!/usr/bin/env bash
# FSDP2 through the real launcher, Gloo on the CPU (NCCL, one process per GPU, on a CUDA
# host): evaluate/predict before train, training equivalence with the LocalEngine, and a
# model sharded at load time adopted by a Trainer that names no engine. Worlds of 2, 3 and 4
# processes, and one run per variant.
set -uo pipefail
launch="$1"
program="$2"
fail=0

gpus=0
if gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU'); then
  echo "CUDA host with $gpus GPUs: runs needing more processes are left out"
fi

run() {  # name, processes, flags...
  local name=$1 n=$2
  shift 2
  if (( gpus > 0 && n > gpus )); then echo "SKIP $name: $n processes > $gpus GPUs"; return; fi
  local out code
  out=$(timeout 300 "$launch" --nproc_per_node="$n" --master_port=0 "$program" \
        --output_dir="$TEST_TMPDIR/$name" "$@" 2>&1)
  code=$?
  echo "== $name ($n processes $*)"
  echo "$out" | grep -E "relative difference|groups unsharded|peak parameter|sharded at load time|built deferred|EQUIVALENT|MISMATCH|ERROR|Error" | head -16
  if [[ $code -ne 0 || "$out" != *"EQUIVALENT"* ]]; then
    echo "$out" | tail -30
    echo "FAIL: $name (exit $code)"; fail=1
  fi
}

run world1 1
run world2 2
run world3 3
run world4 4
run keep_after_forward 2 --reshard_after_forward=false
run no_wrap 3 --wrap=none
run size_wrap 2 --wrap=size
run hsdp 4 --hsdp
run checkpointing 3 --checkpointing
run bf16 2 --bf16
run sync_each_batch 3 --sync_each_batch
run offload 2 --offload

[[ $fail -eq 0 ]] && echo PASS
exit $fail
