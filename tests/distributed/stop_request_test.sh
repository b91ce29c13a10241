#!/usr/bin/env bash
# A stop request (SIGTERM to the launcher) while one rank is stopped (SIGSTOP) in the middle of
# training, so the other ranks' step never ends: before, the launcher forwarded SIGTERM and
# waited for ranks that could not finish their step ("did not exit within inf"), forever.
# Now each rank still running CPPTRAIN_STOP_GRACE_S after its signal says so and ends itself,
# and the launcher SIGKILLs the stopped rank --grace_period_s after the first rank exited.
# Real processes over Gloo on the CPU: tools/train (DDP, the demo job, 3 processes), the peer
# watchdog off (CPPTRAIN_PEER_TIMEOUT_S=0, so only the stop path can end the job),
# --stop_timeout_s=0 (the launcher sets no limit of its own), ddp_timeout at its 1800 s.
#
#   stop_request_test.sh LAUNCH TRAIN CONFIG
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
source "$(dirname "$0")/processes.sh"

now_ms() { date +%s%3N; }
mark="stop-request-test-$$"
log="$tmp/train.log"
CPPTRAIN_TEST_RUN_MARK="$mark" CPPTRAIN_PEER_TIMEOUT_S=0 CPPTRAIN_STOP_GRACE_S=3 \
  timeout --preserve-status -k 30 60 "$launch" --nproc_per_node=3 --master_port=0 --stop_timeout_s=0 \
  --grace_period_s=2 "$train" --config="$config" --set=args.output_dir="$tmp/train" \
  --set=args.max_steps=1000000 --set=args.eval_strategy=NO --set=args.save_strategy=NO \
  --set=args.logging_steps=1 '--set=args.ddp={}' --set=args.use_cpu=true >"$log" 2>&1 &
job=$!
if ! victim=$(stop_rank_after_step "$mark" "$log" 2 3); then
  kill -KILL "$job"
  echo "FAIL: no rank 2 process after waiting for step 3; the job's output ends:"
  tail -n 20 "$log"
  exit 1
fi
sleep 1  # the others are now waiting for rank 2 in the step's all-reduce
kill -TERM "$job"  # `timeout`, which passes it to the launcher and exits with its status
start=$(now_ms)
wait "$job"
code=$?
took_ms=$(($(now_ms) - start))
out=$(cat "$log")
grep -E "stop signals|launch:" <<<"$out" | cut -c1-240
echo "SIGTERM with rank 2 stopped: exit $code, $((took_ms / 1000)).$((took_ms % 1000 / 100)) s" \
     "after the signal"

[[ $code == 143 ]] || fail "exit $code, expected 143 (the launcher stopped by SIGTERM)"
((took_ms < 15000)) || fail "took ${took_ms} ms after SIGTERM (grace 3 s, then 2 s)"
for r in 0 1; do
  grep -q "\[rank $r\] stop signals: still running 3 s after the stop signal" <<<"$out" ||
    fail "rank $r did not say that its step is stuck"
done
grep -q "launch: rank 2 (pid $victim) did not exit within 2s of another rank's exit after" \
  <<<"$out" || fail "the launcher did not name rank 2 as the one it SIGKILLed"
expect_none_left "$mark" "after the stop"
((failed)) && exit 1
echo PASS
