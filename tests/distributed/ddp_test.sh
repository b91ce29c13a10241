#!/usr/bin/env bash
# DDP through the real launcher against the LocalEngine: 2, 3 and 4 processes, SGD and AdamW
# with weight-decay groups, frozen embeddings and norm with gradient checkpointing (the
# recomputed layers' gradients arrive in nested backwards; find_unused_parameters off and on),
# uneven batches (even_batches off); then the unused-parameter error on every rank without a
# hang. On a CUDA host, variants needing more processes than GPUs run on the CPU.
set -uo pipefail
launch="$1"
program="$2"
show="max relative difference|evaluation|EQUIVALENT|MISMATCH|ERROR"
source "$(dirname "$0")/variants.sh"

variant sgd2 2
variant sgd4 4
variant adamw3 3 --optimizer=adamw
variant frozen_checkpointing2 2 --frozen --checkpointing
variant frozen_checkpointing3 3 --frozen --checkpointing --optimizer=adamw
variant frozen_checkpointing_find_unused3 3 --frozen --checkpointing --find_unused
variant uneven2 2 --uneven
variant uneven3 3 --uneven --optimizer=adamw

start=$SECONDS
out=$(timeout 120 "$launch" --nproc_per_node=2 --master_port=0 --grace_period_s=5 "$program" \
      --unused --output_dir="$TEST_TMPDIR/unused" $(placement 2) 2>&1)
code=$?
echo "== unused: 2 processes, an unused parameter with find_unused_parameters off"
echo "$out" | grep -E "unused_head|launch:" | head -5
ok=0
if [[ $code -eq 0 || $code -eq 124 ]]; then
  echo "FAIL: an unused parameter should fail training (exit $code)"; ok=1
fi
for r in 0 1; do
  if ! grep -q "^\[rank $r\].*received no gradient.*unused_head_weight.*find_unused_parameters" <<<"$out"; then
    echo "FAIL: rank $r did not report the unused parameter"; ok=1
  fi
done
echo "unused-parameter run ended in $((SECONDS - start)) s with exit $code"
record 2 $ok

out=$(timeout 120 "$launch" --nproc_per_node=2 --master_port=0 "$program" --unused --find_unused \
      --output_dir="$TEST_TMPDIR/find_unused" $(placement 2) 2>&1)
code=$?
echo "== find_unused: 2 processes, the same parameter with find_unused_parameters on"
if [[ $code -ne 0 ]]; then
  echo "$out" | tail -20; echo "FAIL: find_unused_parameters=true should train (exit $code)"
fi
record 2 $code

variants_done
