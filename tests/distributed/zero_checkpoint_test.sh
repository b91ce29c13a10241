#!/usr/bin/env bash
# ZeRO checkpoints in the checkpoint matrix: each leg resumes from another engine's checkpoint
# at another world size, AdamW state included, and must continue the uninterrupted 4-rank
# stage 2 run's losses (relative 1e-4, as checkpoint_test.sh holds the others):
#   ZeRO-2 4 -> ZeRO-1 3 -> FSDP1 2 -> ZeRO-3 3 -> DDP 2;  ZeRO-1 3 -> ZeRO-2 2 (offload)
#   ZeRO-2 4 -> one local process -> ZeRO-3 2 (offload) -> FSDP2 3
# Stages 1 and 2 write what DDP writes (rank 0, whole tensors: the optimizer state gathered
# from its owners); stage 3 writes what FSDP1 writes (rows split over the ranks).
set -uo pipefail
launch="$1"
program="$2"
fail=0
source "$(dirname "$0")/variants.sh"

leg() {  # name, processes, flags...
  local name=$1 n=$2
  shift 2
  timeout 300 "$launch" --nproc_per_node="$n" --master_port=0 "$program" \
    --output_dir="$TEST_TMPDIR/$name" $(placement "$n") "$@" > "$TEST_TMPDIR/$name.log" 2>&1
  local code=$?
  echo "== leg $name: $n processes on the $([[ -z "$(placement "$n")" ]] && echo CUDA || echo CPU) $*"
  if [[ $code -ne 0 ]]; then
    tail -30 "$TEST_TMPDIR/$name.log"; echo "FAIL: leg $name exited $code"
  fi
  record "$n" $code
  grep -o "LOSS .*" "$TEST_TMPDIR/$name.log" > "$TEST_TMPDIR/$name.losses"
}

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

for name in $checked; do
  if ! awk -v name="$name" '
      NR == FNR { want[$2] = $3; next }
      { seen++; d = $3 - want[$2]; if (d < 0) d = -d; if (d / want[$2] > worst) worst = d / want[$2];
        if (!($2 in want) || d > 1e-4 * want[$2]) { print "step " $2 ": " $3 " vs " want[$2]; bad = 1 } }
      END { if (seen == 0) { print name ": no losses"; bad = 1 }
            printf "%s: %d resumed steps, max relative loss difference %.2g\n", name, seen, worst;
            exit bad }' \
      "$TEST_TMPDIR/zero2_4.losses" "$TEST_TMPDIR/$name.losses"; then
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
