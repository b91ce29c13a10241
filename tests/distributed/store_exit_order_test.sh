#!/usr/bin/env bash
# The order in which a finished job's ranks let go of the rendezvous store. On LibTorch 1.13
# (the CPU builds) a TCPStore client keeps a thread that ends its process when the server
# closes under it, so each rank other than 0 must close its store connection before its peer
# watchdog marks it finished, and rank 0 (the server) must wait for those marks. The engine
# store lives in a static, so in a real job this happens at exit: the engine factory lets go of
# it in an exit handler that runs before the watchdog's. Real processes (tools/launch,
# tools/train on the demo job, DDP over Gloo, 3 ranks), the order read from their VLOG(1)
# lines.
#
#   store_exit_order_test.sh LAUNCH TRAIN CONFIG
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

out=$(GLOG_v=1 GLOG_logtostderr=1 OMP_NUM_THREADS=1 timeout -k 5 120 "$launch" \
      --nproc_per_node=3 --master_port=0 "$train" --config="$config" \
      --set=args.output_dir="$tmp/job" --set=args.max_steps=2 --set=args.eval_strategy=NO \
      --set=args.save_strategy=NO '--set=args.ddp={}' --set=args.use_cpu=true 2>&1)
code=$?
echo "3 ranks, 2 steps: exit $code"
grep -E "closed this rank's store connection|marked rank [0-9] finished" <<<"$out"
[[ $code == 0 ]] || { fail "the job ended with exit $code"; tail -n 20 <<<"$out"; }
! grep -q "terminate called" <<<"$out" || fail "a rank aborted (terminate called)"
! grep -q "have not finished within" <<<"$out" || fail "rank 0's wait for the others timed out"
# Line number of the first line of rank $1 matching $2, or nothing.
line_of() { grep -n "^\[rank $1\] .*$2" <<<"$out" | head -1 | cut -d: -f1 || true; }
for r in 1 2; do
  closed=$(line_of "$r" "closed this rank's store connection")
  marked=$(line_of "$r" "marked rank $r finished")
  [[ -n "$closed" && -n "$marked" ]] || { fail "rank $r: no close or no finished mark logged"; continue; }
  (( closed < marked )) || fail "rank $r marked itself finished before closing its store connection"
done
[[ -n "$(line_of 0 "marked rank 0 finished")" ]] || fail "rank 0 did not mark itself finished"
if [[ $failed == 0 ]]; then echo "PASS"; fi
exit $failed
