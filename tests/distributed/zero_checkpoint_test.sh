#!/usr/bin/env bash
# ZeRO checkpoints in the checkpoint matrix: each leg resumes from another engine's checkpoint
# at another world size, AdamW state included, and must continue the uninterrupted 4-rank
# stage 2 run's losses (relative 1e-4, as checkpoint_test.sh holds the others):
#   ZeRO-2 4 -> ZeRO-1 3 -> FSDP1 2 -> ZeRO-3 3 -> DDP 2;  ZeRO-1 3 -> ZeRO-2 2 (offload)
#   ZeRO-2 4 -> one local process -> ZeRO-3 2 (offload) -> FSDP2 3
# and under bf16, where stages 1 and 2 train bf16 working copies of fp32 masters, a checkpoint
# must hold the masters (F32, not their bf16 rounding) for a resume to continue the run:
#   ZeRO-2 bf16 2 -> ZeRO-1 bf16 2 (offload), and -> ZeRO-2 bf16 2 (offload), at one world
#   size so the bf16 gradients are the same and only a lost master would show (a cross-size
#   bf16 resume differs by ~1e-4 anyway); the local and DDP engines' bf16 working copies too
# Stages 1 and 2 write what DDP writes (rank 0, whole tensors: the optimizer state gathered
# from its owners); stage 3 writes what FSDP1 writes (rows split over the ranks).
set -uo pipefail
launch="$1"
program="$2"
fail=0
source "$(dirname "$0")/variants.sh"

leg zero2_4 4 --engine=zero2
leg zero1_3 3 --engine=zero1 --resume="$TEST_TMPDIR/zero2_4/checkpoint-2"
leg fsdp1_2 2 --engine=fsdp1 --resume="$TEST_TMPDIR/zero1_3/checkpoint-4"
leg zero3_3 3 --engine=zero3 --resume="$TEST_TMPDIR/fsdp1_2/checkpoint-6"
leg ddp2 2 --engine=ddp --resume="$TEST_TMPDIR/zero3_3/checkpoint-8"
leg zero2_2 2 --engine=zero2_offload --resume="$TEST_TMPDIR/zero1_3/checkpoint-6"
leg local1 1 --engine=local --resume="$TEST_TMPDIR/zero2_4/checkpoint-4"
leg zero3_2 2 --engine=zero3_offload --resume="$TEST_TMPDIR/local1/checkpoint-6"
leg fsdp2_3 3 --engine=fsdp --resume="$TEST_TMPDIR/zero3_2/checkpoint-8"
checked="zero1_3 fsdp1_2 zero3_3 ddp2 zero2_2 local1 zero3_2 fsdp2_3"
leg zero2bf_2 2 --engine=zero2 --bf16
leg zero1bf_2 2 --engine=zero1_offload --bf16 --resume="$TEST_TMPDIR/zero2bf_2/checkpoint-4"
# Stage 2 with offload: its step rounds the masters to bf16 itself and copies each bucket back
# while it steps the next (the benchmarked configuration).
leg zero2obf_2 2 --engine=zero2_offload --bf16 --resume="$TEST_TMPDIR/zero2bf_2/checkpoint-2"
# Same world size, same bf16 gradients, the same clip norm on every path: on the CPU exactly
# the same losses. On a GPU the offloaded legs step with the CPU's AdamW and ZeRO-2 with the
# CUDA one, whose roundings differ in the last bit and grow through bf16 (4e-5 and 9e-5 with
# processes sharing an H100): there, within the matrix's 1e-4.
same_device_tolerance=0
[[ -z "$(placement 2)" ]] && same_device_tolerance=1e-4
for resumed in zero1bf_2 zero2obf_2; do
  if ! continues zero2bf_2 "$resumed" "$same_device_tolerance"; then
    echo "FAIL: $resumed does not continue the 2-rank bf16 ZeRO-2 run" \
      "(relative tolerance $same_device_tolerance)"; fail=1
  fi
done
# bf16 working copies in the local and DDP engines: their checkpoints hold the fp32 masters and
# each parameter's AdamW state (kept under its master), so a local resume continues its own run
# exactly, and DDP resumed from the ZeRO-2 bf16 checkpoint (same world size and bf16 gradients;
# the clip norm is summed in another order, so bf16 roundings drift apart by ~1e-4 as a
# cross-size resume does) continues that run within the matrix's 1e-4.
leg localbf_1 1 --engine=local --bf16
leg localbf_1r 1 --engine=local --bf16 --resume="$TEST_TMPDIR/localbf_1/checkpoint-2"
leg ddpbf_2 2 --engine=ddp --bf16 --resume="$TEST_TMPDIR/zero2bf_2/checkpoint-2"
continues localbf_1 localbf_1r 0 ||
  { echo "FAIL: local bf16 resumed does not continue its run exactly"; fail=1; }
continues zero2bf_2 ddpbf_2 ||
  { echo "FAIL: DDP bf16 resumed from ZeRO-2 bf16 does not continue that run"; fail=1; }
grep -q "exp_avg_sq" "$TEST_TMPDIR/localbf_1/checkpoint-2/manifest.pb" ||
  { echo "FAIL: the local bf16 checkpoint should hold the optimizer state"; fail=1; }
header=$(head -c 100000 "$TEST_TMPDIR/localbf_1/checkpoint-2/model.safetensors" | tr -d '\0')
[[ "$header" == *'"F32"'* && "$header" != *'"BF16"'* ]] ||
  { echo "FAIL: the local bf16 checkpoint should hold the fp32 masters (F32), not BF16"; fail=1; }
# The safetensors header (JSON after an 8-byte length) names each tensor's dtype.
header=$(head -c 100000 "$TEST_TMPDIR/zero2bf_2/checkpoint-4/model.safetensors" | tr -d '\0')
if [[ "$header" != *'"F32"'* || "$header" == *'"BF16"'* ]]; then
  echo "FAIL: the bf16 ZeRO-2 checkpoint should hold the fp32 masters (F32), not BF16"; fail=1
fi

for name in $checked; do
  if ! continues zero2_4 "$name"; then
    echo "FAIL: $name does not continue the 4-rank ZeRO-2 run"; fail=1
  fi
done
[[ -f "$TEST_TMPDIR/zero2_4/checkpoint-2/model.safetensors" ]] ||
  { echo "FAIL: a ZeRO-2 checkpoint should hold model.safetensors (replicated parameters)"; fail=1; }
[[ -f "$TEST_TMPDIR/zero3_3/checkpoint-8/shard-00002-of-00003.safetensors" ]] ||
  { echo "FAIL: a 3-rank ZeRO-3 checkpoint should hold 3 shard files"; fail=1; }
grep -q "zero2" "$TEST_TMPDIR/zero2_4/checkpoint-2/manifest.pb" ||
  { echo "FAIL: the manifest should name the engine that wrote it (zero2)"; fail=1; }

(( fail )) && failed=$((failed + 1))
variants_done
