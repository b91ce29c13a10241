# Shell functions the multi-process tests source: finding a run's processes by a mark in their
# environment, which every rank inherits from its launcher.
#
#   source "$(dirname "$0")/processes.sh"
#   CPPTRAIN_TEST_RUN_MARK=my-run launch ... &
#   for pid in $(left_over my-run); do env_has "$pid" RANK=2 && victim=$pid; done
#   expect_none_left my-run "the first case"    # calls the test's fail() if any is left

# Whether process `pid`'s environment holds the line `entry`. The environment is read whole
# first: under pipefail, `tr ... | grep -q` fails when grep stops reading before tr is done
# writing (SIGPIPE), which made a match look like a miss on a loaded machine.
env_has() {
  local environment
  environment=$(tr '\0' '\n' 2>/dev/null <"/proc/$1/environ") || return 1
  grep -qx -- "$2" <<<"$environment"
}

# Lists the processes whose environment holds CPPTRAIN_TEST_RUN_MARK=`mark`.
left_over() {
  local mark="$1" pid
  for pid in /proc/[0-9]*; do
    pid=${pid#/proc/}
    env_has "$pid" "CPPTRAIN_TEST_RUN_MARK=$mark" && echo "$pid"
  done
}

# Waits (5 s at most) until no process of the run `mark` is left; calls fail naming them.
expect_none_left() {
  local mark="$1" what="$2" left tries=0
  # The launcher reaps its ranks before it exits; after `timeout` killed it, they die of its
  # death (PR_SET_PDEATHSIG) a moment later.
  while left=$(left_over "$mark") && [[ -n "$left" ]] && ((tries++ < 50)); do sleep 0.1; done
  [[ -z "$left" ]] || fail "$what: processes of the run are left: $left"
}

# Waits (60 s at most) until the job log `log` shows step `step`, then stops (SIGSTOP) rank
# `rank` of the run `mark` and prints its pid; returns 1 when there is no such process.
stop_rank_after_step() {
  local mark="$1" log="$2" rank="$3" step="$4" i pid
  for ((i = 0; i < 600; ++i)); do
    grep -q "\"step\":$step[,}]" "$log" && break
    sleep 0.1
  done
  for pid in $(left_over "$mark"); do
    if env_has "$pid" "RANK=$rank"; then
      kill -STOP "$pid"
      echo "$pid"
      return 0
    fi
  done
  return 1
}
