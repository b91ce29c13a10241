#!/usr/bin/env bash
# A rank stopped (SIGSTOP) in the middle of a collective: the process lives on, holding its
# sockets and sending nothing, so neither Gloo nor the launcher can tell. The others' peer
# watchdogs (sharding/peer_watchdog.h, default CPPTRAIN_PEER_TIMEOUT_S of 15 s) end them with
# exit code 75, naming the stopped rank; the launcher then stops the rest (SIGTERM, SIGKILL
# after its default --grace_period_s of 10 s). Real processes over Gloo on the CPU, ddp_timeout
# (the collectives' timeout) at its default of 1800 s, SIGTERM caught as tools/train does.
# Cases:
#   - 3 and 4 processes, the last rank stopped; 3 processes, rank 0 (which hosts the store)
#     stopped. Each must end in under 30 s from the stop: the launcher exits 75, a rank that
#     watches the stopped one (its two predecessors around the ring; every rank for rank 0,
#     the store's host) names it, no other rank's watchdog speaks, and no process of the run
#     is left. (The first watcher to speak ends the job, so the others may never get to.)
#   - tools/train (DDP on the demo job, 3 processes), rank 2 stopped from outside (kill -STOP)
#     after step 3: the same checks; the watchdog comes with ConnectStore to every program.
#   - 3 processes, the last rank stopped, with CPPTRAIN_PEER_TIMEOUT_S=0 (the watchdog off):
#     still running after 40 s, ended by `timeout` (exit 124 or 137), as every such job was
#     before the watchdog.
#
#   stopped_rank_test.sh LAUNCH DEAD_RANK TRAIN CONFIG
set -uo pipefail
launch="$1"
program="$2"
train="$3"
config="$4"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
failed=0
fail() {
  echo "FAIL: $*"
  failed=1
}

now_ms() { date +%s%3N; }

source "$(dirname "$0")/processes.sh"

# Checks the end of a run of `n` ranks where `stopped` was stopped (out, code, from_stop_ms).
check_ended() {
  local n="$1" stopped="$2" what="$3" r want
  [[ $code == 75 ]] || fail "$what: exit $code, expected 75"
  ((from_stop_ms < 30000)) || fail "$what: took ${from_stop_ms} ms after the stop"
  # The ranks that watch the stopped one: its two predecessors around the ring (all others in
  # a world of three); the stopped store's host (rank 0) is noticed by every rank. The first
  # watcher to speak ends the job, and its peers may be stopped (or lose the store rank 0
  # hosts) before their own clocks run out, so one watcher naming the stopped rank is enough;
  # a rank that is not a watcher, or a watcher naming another rank, fails.
  local named=0 line
  for ((r = 0; r < n; ++r)); do
    ((r == stopped)) && continue
    local watches=1
    if ((stopped != 0)); then
      local distance=$(((stopped - r + n) % n))
      ((distance <= 2)) || watches=0
    fi
    want="\[rank $r\] .*peer watchdog on rank $r of $n: "
    if ((stopped == 0)); then
      want+="the store at [0-9.:]*, hosted by rank 0, has not answered for [0-9.]* s "
      want+=".*rank 0 is probably stopped"
    else
      want+="rank $stopped has sent no heartbeat for [0-9.]* s .*probably stopped"
    fi
    line=$(grep "\[rank $r\] .*peer watchdog on rank" <<<"$out")
    [[ -z "$line" ]] && continue
    if ((watches)) && grep -q "$want" <<<"$line"; then
      ((++named))
    else
      fail "$what: rank $r's watchdog spoke but does not watch rank $stopped or named another: $line"
    fi
  done
  ((named > 0)) || fail "$what: no rank named the stopped rank $stopped"
}

seconds() { echo "$(($1 / 1000)).$(($1 % 1000 / 100)) s"; }

# Runs `n` processes with `stopped` stopped; sets out, code, from_stop_ms, total_ms.
run() {
  local n="$1" stopped="$2" limit="$3" mark="stopped-rank-test-$$-$n-$stopped-$4"
  local start stop_ms
  start=$(now_ms)
  out=$(CPPTRAIN_TEST_RUN_MARK="$mark" timeout -k 5 "$limit" "$launch" --nproc_per_node="$n" \
        --master_port=0 "$program" --fault=stop --fault_rank="$stopped" --catch_sigterm 2>&1)
  code=$?
  local end
  end=$(now_ms)
  total_ms=$((end - start))
  stop_ms=$(grep -o 'stop_epoch_ms=[0-9]*' <<<"$out" | head -1 | cut -d= -f2)
  from_stop_ms=$((end - ${stop_ms:-$end}))
  [[ -n "$stop_ms" ]] || fail "$n processes: rank $stopped never reached its SIGSTOP"
  expect_none_left "$mark" "$n processes"
}

for c in "3 2" "4 3" "3 0"; do
  read -r n stopped <<<"$c"
  run "$n" "$stopped" 60 on
  echo "$out" | grep -E "stop_epoch_ms|peer watchdog|launch:" | cut -c1-240
  echo "$n processes, rank $stopped stopped: exit $code, $(seconds $from_stop_ms) after the" \
       "stop ($(seconds $total_ms) in all)"
  check_ended "$n" "$stopped" "$n processes, rank $stopped stopped"
done

# tools/train, 3 processes: rank 2 stopped from outside once training runs.
train_case() {
  local mark="stopped-rank-test-$$-train" log="$tmp/train.log" start end job victim
  start=$(now_ms)
  CPPTRAIN_TEST_RUN_MARK="$mark" timeout -k 5 90 "$launch" --nproc_per_node=3 --master_port=0 \
    "$train" --config="$config" --set=args.output_dir="$tmp/train" \
    --set=args.max_steps=1000000 --set=args.eval_strategy=NO --set=args.save_strategy=NO \
    --set=args.logging_steps=1 '--set=args.ddp={}' --set=args.use_cpu=true >"$log" 2>&1 &
  job=$!
  if ! victim=$(stop_rank_after_step "$mark" "$log" 2 3); then
    fail "tools/train: no rank 2 process after waiting for step 3; the job's output ends:"
    tail -n 20 "$log"
    kill -KILL "$job"
    return
  fi
  local stop_ms
  stop_ms=$(now_ms)
  wait "$job"
  code=$?
  end=$(now_ms)
  from_stop_ms=$((end - stop_ms))
  out=$(cat "$log")
  echo "$out" | grep -E "peer watchdog|launch:" | cut -c1-240
  echo "tools/train, 3 processes, rank 2 stopped after step 3: exit $code," \
       "$(seconds $from_stop_ms) after the stop ($(seconds $((end - start))) in all)"
  check_ended 3 2 "tools/train"
  expect_none_left "$mark" "tools/train"
}
train_case

# The watchdog off: nothing ends the job; `timeout` does (124: the launcher exited after its
# SIGTERM; 137: it was still waiting for the ranks, which catch SIGTERM, 5 s later).
export CPPTRAIN_PEER_TIMEOUT_S=0
run 3 2 40 off
echo "3 processes, rank 2 stopped, CPPTRAIN_PEER_TIMEOUT_S=0: exit $code after" \
     "$(seconds $total_ms)"
[[ $code == 124 || $code == 137 ]] ||
  fail "with the watchdog off: exit $code, expected timeout's 124 or 137 (still running at 40 s)"
((total_ms >= 40000)) || fail "with the watchdog off: ended after ${total_ms} ms, before 40 s"
! grep -q "peer watchdog" <<<"$out" || fail "with the watchdog off, a watchdog spoke"

((failed)) && exit 1
echo PASS
