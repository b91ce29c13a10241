#!/usr/bin/env bash
# auto_find_batch_size when one rank runs out of memory (CPPTRAIN_TEST_OOM_AT_STEP=<rank>:<step>
# fails that rank's step as a CUDA allocation would), with real processes over Gloo on the CPU:
#   - alone, the process retries at a smaller batch from the initial weights and finishes;
#   - with 2 and 3 processes, where rank 1 runs out, the others are inside the step's collectives
#     and cannot join a retry: rank 1 ends the job with an error naming itself and the batch
#     size, and every rank is gone in under 30 s with ddp_timeout at its default of 1800 s (the
#     launcher stops the others; --grace_period_s=10, its default). `timeout 60` turns a hang
#     (rank 1 retrying alone while the others wait) into a failure.
#
#   oom_rank_test.sh LAUNCH TRAIN CONFIG
set -uo pipefail
launch="$1"
train="$2"
config="$3"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
failed=0
fail() {
  echo "FAIL: $*"
  failed=1
}

run() {  # processes, rank:step, output directory
  CPPTRAIN_TEST_OOM_AT_STEP="$2" timeout 60 "$launch" --nproc_per_node="$1" --master_port=0 \
    "$train" --config="$config" --set=args.output_dir="$3" --set=args.max_steps=4 \
    --set=args.per_device_train_batch_size=8 --set=args.auto_find_batch_size=true \
    --set=args.eval_strategy=NO --set=args.save_strategy=NO --set=args.logging_steps=1 \
    '--set=args.ddp={}' --set=args.use_cpu=true 2>&1
}

out=$(run 1 0:2 "$tmp/one")
code=$?
echo "$out" | grep -E "out of memory|auto_find" | head -3
[[ $code == 0 ]] || fail "one process: exit $code, expected the retry to finish"
grep -q "auto_find_batch_size starts again from the initial weights with 7" <<<"$out" ||
  fail "one process: no retry at batch size 7"

for n in 2 3; do
  start=$SECONDS
  out=$(run "$n" 1:2 "$tmp/ranks$n")
  code=$?
  elapsed=$((SECONDS - start))
  echo "$out" | grep -E "ran out of memory|launch:" | head -4
  echo "$n processes: exit $code after ${elapsed} s"
  [[ $code != 0 && $code != 124 ]] || fail "$n processes: exit $code"
  ((elapsed < 30)) || fail "$n processes: took ${elapsed} s"
  grep -q "rank 1 of $n ran out of memory at per_device_train_batch_size 8" <<<"$out" ||
    fail "$n processes: rank 1 did not name itself and the batch size"
  grep -q "start again with per_device_train_batch_size 7 or less" <<<"$out" ||
    fail "$n processes: the error does not say what to do"
done
((failed)) && exit 1
echo PASS
