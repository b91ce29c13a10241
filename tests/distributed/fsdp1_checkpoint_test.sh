#!/usr/bin/env bash
# FSDP1 checkpoints (fsdp { version: 1 }, flat parameters) in the checkpoint matrix: each leg
# resumes from another engine's checkpoint at another world size, AdamW state included, and
# must continue the uninterrupted 4-rank FSDP1 run's losses (relative 1e-4, as
# checkpoint_test.sh holds the others):
#   FSDP1 4 (sharded) -> FSDP2 2 -> FSDP1 3 -> DDP 2 -> FSDP1 2      (pieces <-> rows, both ways)
#   FSDP1 4 -> one local process;  local -> FSDP1 3
#   FSDP1 4 -> FSDP1 3 saving FULL_STATE_DICT -> DDP 3
# The sharded checkpoint FSDP1 writes is the one FSDP2 writes (rows split over the shard
# group), so every engine reads it; FULL_STATE_DICT writes model.safetensors with Hugging
# Face names.
set -uo pipefail
launch="$1"
program="$2"
fail=0
source "$(dirname "$0")/variants.sh"

leg fsdp1_4 4 --engine=fsdp1
leg fsdp2_2 2 --engine=fsdp --resume="$TEST_TMPDIR/fsdp1_4/checkpoint-2"
leg fsdp1_3 3 --engine=fsdp1 --resume="$TEST_TMPDIR/fsdp2_2/checkpoint-4"
leg ddp2 2 --engine=ddp --resume="$TEST_TMPDIR/fsdp1_3/checkpoint-6"
leg fsdp1_2 2 --engine=fsdp1 --resume="$TEST_TMPDIR/ddp2/checkpoint-8"
leg local1 1 --engine=local --resume="$TEST_TMPDIR/fsdp1_4/checkpoint-4"
leg fsdp1_3b 3 --engine=fsdp1 --resume="$TEST_TMPDIR/local1/checkpoint-6"
leg fsdp1_full3 3 --engine=fsdp1_full --resume="$TEST_TMPDIR/fsdp1_4/checkpoint-2"
leg ddp3 3 --engine=ddp --resume="$TEST_TMPDIR/fsdp1_full3/checkpoint-4"
checked="fsdp2_2 fsdp1_3 ddp2 fsdp1_2 local1 fsdp1_3b fsdp1_full3 ddp3"

for name in $checked; do
  if ! continues fsdp1_4 "$name"; then
    echo "FAIL: $name does not continue the 4-rank FSDP1 run"; fail=1
  fi
done
[[ -f "$TEST_TMPDIR/fsdp1_full3/checkpoint-4/model.safetensors" ]] ||
  { echo "FAIL: fsdp.state_dict_type FULL_STATE_DICT should write model.safetensors"; fail=1; }
[[ -f "$TEST_TMPDIR/fsdp1_4/checkpoint-2/shard-00003-of-00004.safetensors" ]] ||
  { echo "FAIL: a sharded 4-rank FSDP1 checkpoint should hold 4 shard files"; fail=1; }
grep -q "fsdp1" "$TEST_TMPDIR/fsdp1_4/checkpoint-2/manifest.pb" ||
  { echo "FAIL: the manifest should name the engine that wrote it (fsdp1)"; fail=1; }

(( fail )) && failed=$((failed + 1))
variants_done
