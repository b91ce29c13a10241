#!/usr/bin/env bash
# A run whose loss or gradient norm turns NaN or infinite (the demo job at learning_rate 1e30)
# must stop with an error naming the step and the value, on every rank, and save no checkpoint
# (before: exit 0, NaN checkpoints at every save_steps, the logged loss filtered to look fine).
set -euo pipefail
train="$1"
config="$2"
launch="$3"
fail() { echo "FAIL: $1"; [[ -n "${2:-}" ]] && cat "$2"; exit 1; }
common=(--config="$config" --set=args.learning_rate=1e30 --set=args.max_steps=8
        --set=args.logging_steps=4 --set=args.save_steps=3 --set=args.eval_strategy=NO)

# Expects the run in $1 (output_dir) with log $2 to have ended with exit code $3 != 0, the log
# to hold the text $4, and no checkpoint (finished or not) in the output directory.
expect_stopped() {
  local out="$1" log="$2" rc="$3" text="$4"
  [[ "$rc" -ne 0 ]] || fail "a diverged run exited 0" "$log"
  grep -qF "$text" "$log" || fail "no '$text' in the log" "$log"
  if compgen -G "$out/*checkpoint-*" >/dev/null; then
    fail "a checkpoint was saved after the run diverged: $(ls -a "$out")" "$log"
  fi
}

# One process, clipping on (the demo's max_grad_norm 1): the clipped update at lr 1e30 makes
# the step-3 gradient norm NaN, which is also the first save.
out="$TEST_TMPDIR/clipped"
rc=0; "$train" "${common[@]}" --set="args.output_dir=$out" >/dev/null 2>"$TEST_TMPDIR/clipped.log" || rc=$?
expect_stopped "$out" "$TEST_TMPDIR/clipped.log" "$rc" \
  "training diverged: the gradient norm was nan at step 3; parameter model.embed_tokens.weight held NaN or infinite values after step 3."
echo "clipped: exit $rc, $(grep -o 'training diverged: .* The optimizer' "$TEST_TMPDIR/clipped.log" | sort -u)"

# No clipping: step 3's loss is still finite (computed before its update), but the update left
# the weights NaN, which the check before the save at step 3 finds.
out="$TEST_TMPDIR/unclipped"
rc=0; "$train" "${common[@]}" --set=args.max_grad_norm=0 --set="args.output_dir=$out" \
  >/dev/null 2>"$TEST_TMPDIR/unclipped.log" || rc=$?
expect_stopped "$out" "$TEST_TMPDIR/unclipped.log" "$rc" \
  "training diverged: parameter model.embed_tokens.weight held NaN or infinite values after step 3."
echo "unclipped: exit $rc, $(grep -o 'training diverged: .* The optimizer' "$TEST_TMPDIR/unclipped.log" | sort -u)"

# Two processes over Gloo, replicated (DDP) and sharded (FSDP2: each rank checks its shard):
# every rank takes the same decision at the same step.
for engine in ddp fsdp2; do
  case "$engine" in
    ddp) engine_set='--set=args.ddp={}' ;;
    fsdp2) engine_set='--set=args.fsdp={version: 2}' ;;
  esac
  out="$TEST_TMPDIR/$engine"
  rc=0; timeout 120 "$launch" --nproc_per_node=2 --master_port=0 "$train" "${common[@]}" \
    --set=args.max_grad_norm=0 "$engine_set" --set=args.use_cpu=true \
    --set="args.output_dir=$out" >/dev/null 2>"$TEST_TMPDIR/$engine.log" || rc=$?
  expect_stopped "$out" "$TEST_TMPDIR/$engine.log" "$rc" "training diverged: "
  for rank in 0 1; do
    grep -q "^\[rank $rank\].*training diverged: parameter model.embed_tokens.weight held NaN or infinite values after step 3 on rank(s) 0, 1\." \
      "$TEST_TMPDIR/$engine.log" || fail "$engine: rank $rank did not stop with the agreed verdict" "$TEST_TMPDIR/$engine.log"
  done
  echo "$engine: exit $rc, $(grep -o 'training diverged: .* The optimizer' "$TEST_TMPDIR/$engine.log" | sort -u | tr '\n' ' ')"
done

# The test hook that tools/reliability_check.sh uses to make a diverged checkpoint keeps the
# old behaviour: exit 0, checkpoints of NaN weights.
out="$TEST_TMPDIR/hook"
CPPTRAIN_TEST_SAVE_DIVERGED=1 "$train" "${common[@]}" --set=args.max_grad_norm=0 \
  --set="args.output_dir=$out" >/dev/null 2>"$TEST_TMPDIR/hook.log" ||
  fail "CPPTRAIN_TEST_SAVE_DIVERGED=1 did not let the run finish" "$TEST_TMPDIR/hook.log"
[[ -d "$out/checkpoint-6" ]] || fail "CPPTRAIN_TEST_SAVE_DIVERGED=1 saved no checkpoint-6" "$TEST_TMPDIR/hook.log"
echo PASS
