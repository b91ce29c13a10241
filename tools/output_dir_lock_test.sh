#!/usr/bin/env bash
# One job per output_dir, with real tools/train processes on the demo job: while one trains, a
# second on the same output_dir is refused at its start naming the holder's pid and host and
# the way out, and writes nothing; the first, stopped with SIGTERM, saves, exits and leaves the
# lock released (the file emptied); a job killed with SIGKILL leaves its name in the file, and
# the next job takes the lock over with a warning naming it; a job after a clean end says
# nothing about the lock. Waits are on conditions (the lock file naming a pid), each bounded.
set -euo pipefail
train="$1"
config="$2"
out="${TEST_TMPDIR}/run"
lock="$out/.cpptrain.lock"
logs="${TEST_TMPDIR}/logs"
mkdir -p "$logs"
short=(--config="$config" --set="args.output_dir=$out" --set=args.max_steps=2
       --set=args.eval_strategy=NO --set=args.save_strategy=NO --set=args.local.device=cpu)
long=(--config="$config" --set="args.output_dir=$out" --set=args.max_steps=1000000
      --set=args.eval_strategy=NO --set=args.save_strategy=NO --set=args.local.device=cpu)
fail() { echo "FAIL: $*"; for f in "$logs"/*.log; do echo "--- $f"; tail -20 "$f"; done; exit 1; }

# Waits (at most 120 s) until the lock file names pid $1 (the job got past the lock).
wait_for_holder() {
  for _ in $(seq 1200); do
    grep -qx "pid $1" "$lock" 2>/dev/null && return 0
    kill -0 "$1" 2>/dev/null || fail "pid $1 ended before it held the lock"
    sleep 0.1
  done
  fail "pid $1 did not take the lock within 120 s"
}

# 1. A running job; a second one on the same output_dir is refused.
"$train" "${long[@]}" >"$logs/first.out" 2>"$logs/first.log" &
first=$!
wait_for_holder "$first"
host=$(hostname)
set +e
"$train" "${short[@]}" >"$logs/second.out" 2>"$logs/second.log"
second_rc=$?
set -e
[[ $second_rc -ne 0 ]] || fail "the second job on the same output_dir ran (exit 0)"
grep -q "output_dir '$out' is in use by another training job (pid $first on host $host" \
  "$logs/second.log" || fail "the refusal does not name pid $first on host $host"
grep -q "Choose another output_dir, or stop the other job first" "$logs/second.log" ||
  fail "the refusal does not say what to do"
[[ ! -e "$out/metrics.jsonl" ]] || grep -q . "$out/metrics.jsonl" ||
  fail "metrics.jsonl emptied by the refused job"
echo "second job refused (exit $second_rc): $(grep -o "output_dir '.*in use by[^)]*)" "$logs/second.log")"
kill -0 "$first" || fail "the first job died when the second was refused"

# 2. SIGTERM: the first saves, exits, and releases the lock.
kill -TERM "$first"
set +e
wait "$first"
first_rc=$?
set -e
echo "first job after SIGTERM: exit $first_rc"
[[ ! -s "$lock" ]] || fail "the lock file still names a holder after a clean end: $(cat "$lock")"
ls -d "$out"/checkpoint-* >/dev/null 2>&1 || fail "the SIGTERM save left no checkpoint"

# 3. A clean end leaves nothing to take over: the next job says nothing about the lock.
"$train" "${short[@]}" >"$logs/third.out" 2>"$logs/third.log" || fail "third job failed"
! grep -q "taking over the lock" "$logs/third.log" || fail "warned after a clean end"

# 4. SIGKILL leaves the name; the next job takes the lock over, naming it.
"$train" "${long[@]}" >"$logs/killed.out" 2>"$logs/killed.log" &
killed=$!
wait_for_holder "$killed"
kill -KILL "$killed"
wait "$killed" 2>/dev/null || true
grep -qx "pid $killed" "$lock" || fail "the killed job's name is not in the lock file"
"$train" "${short[@]}" >"$logs/after.out" 2>"$logs/after.log" || fail "the job after a SIGKILL failed"
grep -q "taking over the lock '$lock' left by pid $killed on host $host, which ended without" \
  "$logs/after.log" || fail "no warning naming the killed job's pid $killed"
echo "after SIGKILL: $(grep -o "taking over the lock.*" "$logs/after.log")"
echo PASS
