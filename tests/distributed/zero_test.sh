#!/usr/bin/env bash
# ZeRO (zero { stage: 1|2|3 }) through the real launcher: evaluate/predict before train, then
# training equivalence with the LocalEngine (losses at each of 5 steps and the final
# parameters, relative 1e-5; parameters 5e-5 with AdamW as for the other engines), clipping to
# a norm of 0.1. Worlds of 2 to 4 processes; the tiny decoder's parameter sizes are not
# multiples of 3 or 4. AdamW (weight-decay groups by name) unless a variant says SGD. Every
# stage with and without offload_optimizer, with 2 micro-batches per step (the first unsynced)
# and without accumulation; small buckets (--bucket) put bucket parts across parameters.
set -uo pipefail
launch="$1"
program="$2"
show="relative difference|EQUIVALENT|MISMATCH|ERROR|Error"
source "$(dirname "$0")/variants.sh"

for stage in 1 2 3; do
  variant "stage${stage}_w2" 2 --stage=$stage --optimizer=adamw
  variant "stage${stage}_w3" 3 --stage=$stage --optimizer=adamw --bucket=5000 --persistence=0
  variant "stage${stage}_w4_offload" 4 --stage=$stage --optimizer=adamw --offload --bucket=20000
  variant "stage${stage}_w3_offload_noacc" 3 --stage=$stage --optimizer=adamw --offload \
    --accumulation=1
  variant "stage${stage}_w2_noacc" 2 --stage=$stage --optimizer=adamw --accumulation=1
done
variant stage1_w3_sync_each 3 --stage=1 --optimizer=adamw --sync_each_batch --bucket=3000
variant stage2_w3_sgd_frozen 3 --stage=2 --frozen --bucket=7000
variant stage3_w4_no_prefetch 4 --stage=3 --optimizer=adamw --persistence=0 --no_prefetch
variant stage2_w3_uneven 3 --stage=2 --optimizer=adamw --uneven

variants_done
