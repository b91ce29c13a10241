#!/usr/bin/env bash
# FSDP configured as a Hugging Face user does, on 2 processes over Gloo (the demo job, a llama
# decoder of 2 layers): transformer_layer_cls_to_wrap "LlamaDecoderLayer" gives each layer its
# own group under FSDP2 and FSDP1 (before: "1 groups (0 units + root)", silently); a made-up
# class name ends the run naming the classes there are; fsdp's string form
# "full_shard auto_wrap" is FSDP1 FULL_SHARD with the layers wrapped.
set -euo pipefail
train="$1"
config="$2"
launch="$3"
fail() { echo "FAIL: $1"; [[ -n "${2:-}" ]] && cat "$2"; exit 1; }
common=(--config="$config" --set=args.max_steps=2 --set=args.eval_strategy=NO
        --set=args.save_strategy=NO --set=args.use_cpu=true)

# Runs the job with the extra --set flags; the log is $TEST_TMPDIR/$1.log.
run() {
  local name="$1"; shift
  timeout 300 "$launch" --nproc_per_node=2 --master_port=0 "$train" "${common[@]}" "$@" \
    --set="args.output_dir=$TEST_TMPDIR/$name" >/dev/null 2>"$TEST_TMPDIR/$name.log"
}

run fsdp2 '--set=args.fsdp={version: 2 transformer_layer_cls_to_wrap: "LlamaDecoderLayer"}' ||
  fail "FSDP2 with LlamaDecoderLayer failed" "$TEST_TMPDIR/fsdp2.log"
grep -q "FullyShard: 3 groups (2 units + root)" "$TEST_TMPDIR/fsdp2.log" ||
  fail "FSDP2 did not wrap the 2 layers" "$TEST_TMPDIR/fsdp2.log"
run fsdp1 '--set=args.fsdp={version: 1 transformer_layer_cls_to_wrap: "LlamaDecoderLayer"}' ||
  fail "FSDP1 with LlamaDecoderLayer failed" "$TEST_TMPDIR/fsdp1.log"
grep -q "FlatShard: 3 flat parameters (2 units + root)" "$TEST_TMPDIR/fsdp1.log" ||
  fail "FSDP1 did not wrap the 2 layers" "$TEST_TMPDIR/fsdp1.log"
echo "LlamaDecoderLayer: $(grep -o 'FullyShard: [0-9]* groups ([^)]*)' "$TEST_TMPDIR/fsdp2.log" | head -1); $(grep -o 'FlatShard: [0-9]* flat parameters ([^)]*)' "$TEST_TMPDIR/fsdp1.log" | head -1)"

rc=0; run made_up '--set=args.fsdp={version: 2 transformer_layer_cls_to_wrap: "MadeUpLayer"}' || rc=$?
[[ "$rc" -ne 0 ]] || fail "a made-up class name trained (exit 0)" "$TEST_TMPDIR/made_up.log"
grep -q 'transformer_layer_cls_to_wrap names "MadeUpLayer".*DecoderLayer (also LlamaDecoderLayer)' \
  "$TEST_TMPDIR/made_up.log" || fail "the error does not list the classes" "$TEST_TMPDIR/made_up.log"
echo "MadeUpLayer: exit $rc"

run string '--set=args.fsdp=full_shard auto_wrap' ||
  fail "fsdp=full_shard auto_wrap failed" "$TEST_TMPDIR/string.log"
grep -q "FSDP1: FULL_SHARD over 1 x 2 ranks" "$TEST_TMPDIR/string.log" &&
  grep -q "FlatShard: 3 flat parameters (2 units + root)" "$TEST_TMPDIR/string.log" ||
  fail "fsdp=full_shard auto_wrap is not FSDP1 FULL_SHARD with the layers wrapped" "$TEST_TMPDIR/string.log"
echo "fsdp=full_shard auto_wrap: $(grep -o 'FSDP1: FULL_SHARD over 1 x 2 ranks' "$TEST_TMPDIR/string.log" | head -1)"
echo PASS
