#!/usr/bin/env bash
# DDP through the real launcher, Gloo on the CPU: equivalence with the LocalEngine on 2 and 4
# processes, and the unused-parameter error on every rank without a hang.
set -uo pipefail
launch="$1"
program="$2"
fail=0

# One process per GPU where there are GPUs (NCCL); 2 and 4 processes on the CPU (Gloo).
counts="2 4"
if gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU'); then
  counts=$(for n in 2 4; do (( n <= gpus )) && echo $n; done)
  echo "CUDA host with $gpus GPUs: DDP equivalence on $(echo $counts) processes"
fi
[[ -n "$counts" ]] || { echo "FAIL: DDP needs at least 2 GPUs on a CUDA host"; exit 1; }
for n in $counts; do
  out=$(timeout 300 "$launch" --nproc_per_node="$n" --master_port=0 "$program" \
        --output_dir="$TEST_TMPDIR/eq$n" 2>&1)
  code=$?
  echo "$out" | grep -E "max relative difference|evaluation|EQUIVALENT|MISMATCH|ERROR"
  if [[ $code -ne 0 || "$out" != *"EQUIVALENT"* ]]; then
    echo "FAIL: DDP on $n processes is not equivalent to the local engine (exit $code)"; fail=1
  fi
done

start=$SECONDS
out=$(timeout 120 "$launch" --nproc_per_node=2 --master_port=0 --grace_period_s=5 "$program" \
      --unused --output_dir="$TEST_TMPDIR/unused" 2>&1)
code=$?
echo "$out" | grep -E "unused_head|launch:" | head -5
if [[ $code -eq 0 || $code -eq 124 ]]; then
  echo "FAIL: an unused parameter should fail training (exit $code)"; fail=1
fi
for r in 0 1; do
  if ! grep -q "^\[rank $r\].*received no gradient.*unused_head_weight.*find_unused_parameters" <<<"$out"; then
    echo "FAIL: rank $r did not report the unused parameter"; fail=1
  fi
done
echo "unused-parameter run ended in $((SECONDS - start)) s with exit $code"

out=$(timeout 120 "$launch" --nproc_per_node=2 --master_port=0 "$program" --unused --find_unused \
      --output_dir="$TEST_TMPDIR/find_unused" 2>&1)
code=$?
if [[ $code -ne 0 ]]; then
  echo "$out" | tail -20; echo "FAIL: find_unused_parameters=true should train (exit $code)"; fail=1
fi

[[ $fail -eq 0 ]] && echo PASS
exit $fail
