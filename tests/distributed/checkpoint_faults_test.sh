#!/usr/bin/env bash
# A checkpoint write or read that fails on one rank only, with real processes over Gloo on the
# CPU: every rank must return the error itself and exit non-zero in under 30 s, with
# ddp_timeout at its default of 1800 s, each naming the failing rank and the cause
# (docs/RELIABILITY.md, "One rank's write or read fails"). Faults are injected by
# CPPTRAIN_TEST_FAIL_WRITE_ON_RANK and CPPTRAIN_TEST_FAIL_READ_ON_RANK (checkpoint/checkpoint.cc).
# Each case with 2 and 3 processes (alloc: 2, FSDP1 also 3), training the tiny decoder with
# checkpoints every 2 steps:
#   sharded  FSDP2, sharded checkpoint: rank 1's shard file fails (disk full) at step 2
#   full     FSDP2 with FULL_STATE_DICT: rank 0's model.safetensors fails (disk full) at step 2,
#            between the gathers of the parameters
#   alloc    rank 1 (ZeRO's masters: 0) cannot allocate the device buffer of the save's gathers
#            (CPPTRAIN_TEST_FAIL_ALLOC_ON_RANK, sharding/agreed_buffer.h): FSDP2 full, FSDP1
#            sharded, ZeRO-2 bf16's fp32 masters, ZeRO-2's optimizer state
#   read     resuming FSDP2 (and ZeRO-2, 2 processes) from a checkpoint that verifies: rank 1's
#            read of the rows it loads fails (EIO)
#   split    resume_from_checkpoint: latest where output_dir is a disk of each rank's own (a
#            mount namespace per rank; needs root and unshare, else SKIPPED): only rank 0's
#            holds checkpoint-2, so the ranks would try different checkpoints
# The launcher stops the other ranks once one fails; --grace_period_s=60 keeps that from being
# what ends them (a rank waiting in a collective ignores SIGTERM: the Trainer takes it as "save
# and stop"), and `timeout 90` turns a hang into a failure (the launcher forwards its SIGTERM
# and, --stop_timeout_s=5, SIGKILLs the ranks 5 s later).
#
#   checkpoint_faults_test.sh LAUNCH CHECKPOINT_RESUME
set -uo pipefail
launch="$1"
program="$2"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
limit_s=30
ran=0
skipped=0
failed=0
wrap=""  # a program run_case puts before the program, when set

fail() {
  echo "FAIL: $*"
  failed=$((failed + 1))
}

# run_case NAME PROCESSES FAILING_RANK ENV_ASSIGNMENT CAUSE FLAGS...: runs the program under the
# launcher with the fault injected, and checks every rank's own "training failed" line: it
# holds CAUSE and, on the other ranks, "rank FAILING_RANK failed" (FAILING_RANK -: no one rank).
run_case() {
  local name=$1 n=$2 bad=$3 inject=$4 cause=$5
  shift 5
  local log="$tmp/$name.log" start end elapsed code r line
  local -a before_program=()
  [[ -n "$wrap" ]] && before_program=("$wrap")
  start=$(date +%s.%N)
  env "$inject" timeout -k 10 90 "$launch" --nproc_per_node="$n" --master_port=0 \
    --grace_period_s=60 --stop_timeout_s=5 "${before_program[@]}" "$program" --use_cpu \
    --output_dir="$tmp/$name" "$@" >"$log" 2>&1
  code=$?
  end=$(date +%s.%N)
  elapsed=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
  ran=$((ran + 1))
  echo "== $name: $n processes, $inject: exit $code after $elapsed s"
  local before=$failed
  [[ $code -ne 0 && $code -ne 124 ]] || fail "$name: exit $code (124: still running after 90 s)"
  awk -v e="$elapsed" -v l="$limit_s" 'BEGIN { exit !(e < l) }' ||
    fail "$name: took $elapsed s, the limit is $limit_s s"
  for ((r = 0; r < n; ++r)); do
    line=$(grep -m1 "^\[rank $r\] .*training failed: " "$log")
    echo "  ${line:0:400}"
    if [[ -z "$line" ]]; then
      fail "$name: rank $r did not return an error of its own"
      continue
    fi
    [[ "$line" == *"$cause"* ]] || fail "$name: rank $r's error lacks the cause '$cause'"
    if [[ "$bad" != - && "$r" != "$bad" && "$line" != *"rank $bad failed"* ]]; then
      fail "$name: rank $r's error does not name rank $bad"
    fi
  done
  if ((failed > before)); then
    echo "--- $log (last 40 lines)"
    tail -40 "$log"
  fi
}

for n in 2 3; do
  run_case "sharded$n" "$n" 1 CPPTRAIN_TEST_FAIL_WRITE_ON_RANK=1 \
    "shard-00001-of-0000$n.safetensors': the disk is full" --engine=fsdp
  [[ ! -e "$tmp/sharded$n/checkpoint-2" && ! -e "$tmp/sharded$n/.tmp-checkpoint-2" ]] ||
    fail "sharded$n: the failed save left $(ls -A "$tmp/sharded$n" | tr '\n' ' ')"
  run_case "full$n" "$n" 0 CPPTRAIN_TEST_FAIL_WRITE_ON_RANK=0 \
    "model.safetensors': the disk is full" --engine=fsdp_full
done

# One rank out of memory for the device buffer a save's collectives use: it is allocated once,
# before the first of them, and every rank agrees on it (sharding/agreed_buffer.h). Before,
# the rank returned while the others waited in the next gather or all-reduce (on NCCL until
# ddp_timeout). FSDP2's full-model gathers, FSDP1's rebuilt rows, ZeRO's fp32 masters.
oom="cannot allocate .* out of memory (CPPTRAIN_TEST_FAIL_ALLOC_ON_RANK injected it)"
run_case alloc_full2 2 1 CPPTRAIN_TEST_FAIL_ALLOC_ON_RANK=1 "for the checkpoint's gathers" \
  --engine=fsdp_full
for n in 2 3; do
  run_case "alloc_fsdp1_$n" "$n" 1 CPPTRAIN_TEST_FAIL_ALLOC_ON_RANK=1 \
    "for the checkpoint's gathers" --engine=fsdp1
done
run_case alloc_zero2 2 0 CPPTRAIN_TEST_FAIL_ALLOC_ON_RANK=0 "for gathering the fp32 masters" \
  --engine=zero2 --bf16
# ZeRO's optimizer state, gathered one tensor at a time through one agreed buffer: before, each
# gather allocated its own full-size tensor between the all-reduces, unchecked by the others.
run_case alloc_zero2_state 2 1 CPPTRAIN_TEST_FAIL_ALLOC_ON_RANK=1 \
  "for gathering the optimizer state" --engine=zero2
for name in alloc_full2 alloc_fsdp1_2 alloc_fsdp1_3 alloc_zero2 alloc_zero2_state; do
  grep -q "$oom" "$tmp/$name.log" || fail "$name: no rank's error says it ran out of memory"
  [[ ! -e "$tmp/$name/checkpoint-2" && ! -e "$tmp/$name/.tmp-checkpoint-2" ]] ||
    fail "$name: the failed save left $(ls -A "$tmp/$name" | tr '\n' ' ')"
done

# A checkpoint to resume from: FSDP2 on 2 processes, 2 steps.
timeout 120 "$launch" --nproc_per_node=2 --master_port=0 "$program" --use_cpu --engine=fsdp \
  --max_steps=2 --output_dir="$tmp/base" >"$tmp/base.log" 2>&1 ||
  fail "the run writing checkpoint-2 failed: $(tail -5 "$tmp/base.log")"
for n in 2 3; do
  run_case "read$n" "$n" 1 CPPTRAIN_TEST_FAIL_READ_ON_RANK=1 \
    "Input/output error" --engine=fsdp --resume="$tmp/base/checkpoint-2" --max_steps=4
done

# The same on ZeRO-2 (2 processes), whose optimizer holds each rank's piece of every state: the
# check of a parameter's state names after its import used to gather the state (one all-reduce a
# tensor) inside each rank's own read loop, so a rank whose read failed left for the agreement
# while the others were still reducing (Gloo paired the two; NCCL would wait until ddp_timeout).
timeout 120 "$launch" --nproc_per_node=2 --master_port=0 "$program" --use_cpu --engine=zero2 \
  --max_steps=2 --output_dir="$tmp/base_zero2" >"$tmp/base_zero2.log" 2>&1 ||
  fail "the ZeRO-2 run writing checkpoint-2 failed: $(tail -5 "$tmp/base_zero2.log")"
run_case read_zero2_2 2 1 CPPTRAIN_TEST_FAIL_READ_ON_RANK=1 "Input/output error" --engine=zero2 \
  --resume="$tmp/base_zero2/checkpoint-2" --max_steps=4

# latest where one rank's file is gone (rng_state_1.safetensors): rank 1 alone refuses the
# checkpoint; it says why in its own log, and rank 0's warning and every rank's error name it.
mkdir -p "$tmp/one_rank"
cp -r "$tmp/base/checkpoint-2" "$tmp/one_rank/"
rm "$tmp/one_rank/checkpoint-2/rng_state_1.safetensors"
timeout 90 "$launch" --nproc_per_node=2 --master_port=0 --grace_period_s=60 "$program" \
  --use_cpu --engine=fsdp --resume=latest --max_steps=4 --output_dir="$tmp/one_rank" \
  >"$tmp/one_rank.log" 2>&1
code=$?
ran=$((ran + 1))
echo "== one_rank: 2 processes, rng_state_1.safetensors removed, latest: exit $code"
own=$(grep -m1 "^\[rank 1\] .*this rank cannot resume from $tmp/one_rank/checkpoint-2: .*'rng_state_1.safetensors' is missing" "$tmp/one_rank.log")
echo "  ${own:0:400}"
[[ -n "$own" ]] || fail "one_rank: rank 1 does not log why it refused the checkpoint"
grep -q "^\[rank 0\] .*latest skips $tmp/one_rank/checkpoint-2, which fails verification: rank 1 failed: .*rng_state_1.safetensors' is missing" \
  "$tmp/one_rank.log" || fail "one_rank: rank 0's warning does not give rank 1's reason"
[[ $code -ne 0 ]] || fail "one_rank: exit 0 with the only checkpoint refused"

# split: each rank's output_dir is its own directory, mounted at the same path.
wrap="$tmp/own_output_dir.sh"
cat >"$wrap" <<'EOF'
#!/usr/bin/env bash
# PROGRAM ARGS...: PROGRAM in a mount namespace of its own, with $SPLIT_DIR/rank<RANK> mounted
# over $SPLIT_DIR/out, as if output_dir were on a disk of each rank's own node.
exec unshare --mount --propagation private bash -c \
  'mount --bind "$SPLIT_DIR/rank$RANK" "$SPLIT_DIR/out" && exec "$@"' bash "$@"
EOF
chmod +x "$wrap"
why=""
if [[ $(id -u) -ne 0 ]]; then
  why="needs root to mount (uid $(id -u))"
elif ! why=$(unshare --mount --propagation private true 2>&1); then
  why="unshare --mount: $why"
fi
for n in 2 3; do
  if [[ -n "$why" ]]; then
    echo "SKIPPED: split$n: $why"
    skipped=$((skipped + 1))
    continue
  fi
  mkdir -p "$tmp/split$n/out"
  for ((r = 0; r < n; ++r)); do mkdir -p "$tmp/split$n/rank$r"; done
  cp -r "$tmp/base/checkpoint-2" "$tmp/split$n/rank0/"
  views="(rank 0: 1, the newest checkpoint-2; rank 1: none"
  run_case "split$n/out" "$n" - "SPLIT_DIR=$tmp/split$n" \
    "different checkpoints in '$tmp/split$n/out' $views" \
    --engine=fsdp --resume=latest --max_steps=4
done
wrap=""

echo "checkpoint faults: $ran ran, $skipped skipped, $failed failed"
[[ $failed -eq 0 ]] && echo PASS
[[ $failed -eq 0 ]]
