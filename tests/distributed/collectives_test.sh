#!/usr/bin/env bash
# Every collective against its formula through the real launcher: the CPU communicator with 2,
# 3 and 4 processes everywhere; on a CUDA host also NCCL, one process per GPU (2 and 4 where
# present).
set -uo pipefail
launch="$1"
program="$2"
fail=0
# The CPU communicator (Gloo, or the store communicator in builds without Gloo) on every
# machine; NCCL on a CUDA host with as many GPUs.
runs=("cpu 2" "cpu 3" "cpu 4")
if gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU'); then
  for n in 2 4; do (( n <= gpus )) && runs+=("cuda $n"); done
  echo "CUDA host with $gpus GPUs: checks on ${runs[*]}"
fi
for run in "${runs[@]}"; do
  read -r device n <<<"$run"
  out=$(timeout 240 "$launch" --nproc_per_node="$n" --master_port=0 "$program" --device="$device" 2>&1)
  code=$?
  echo "$out" | grep -E "checks passed|timeout check|ERROR|E[0-9]{4}" | head -8
  passed=$(grep -c "checks passed" <<<"$out")
  if ! grep -q "timeout check passed" <<<"$out"; then
    echo "FAIL: $device: a collective no peer joined did not fail with a clear timeout"; fail=1
  fi
  if [[ $code -ne 0 || $passed -ne $n ]]; then
    echo "FAIL: $device with $n processes (exit $code, $passed ranks passed)"; fail=1
  fi
done
echo "runs: ${#runs[@]} (${runs[*]}), $fail failed"
[[ $fail -eq 0 ]] && echo PASS
exit $fail
