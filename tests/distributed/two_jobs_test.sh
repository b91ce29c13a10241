#!/usr/bin/env bash
# Ranks of two jobs in one group: two launchers started at the same instant on one port both
# pass the port check, and a rank of one job can join the other's group, where it trained on
# its own data beside the other job's rank 0. Every rank now shares, before the first step, a
# hash of its training arguments, of its model and data configuration and of its launcher's
# run id (TORCHELASTIC_RUN_ID), and every rank refuses a group where any differs, naming the
# rank. Real processes (tools/launch, tools/train on the demo job, DDP over Gloo, 2 ranks);
# rank 1 is made another job's by a wrapper that changes its environment or its --set flags.
#
#   two_jobs_test.sh LAUNCH TRAIN CONFIG
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

# Runs 2 ranks of the demo job; rank 1 first runs the shell words in `rank1` (which may change
# its environment or append to its arguments). Sets out and code.
run() {
  local name="$1" rank1="$2"
  out=$(timeout -k 5 120 "$launch" --nproc_per_node=2 --master_port=0 /bin/sh -c \
        "if [ \"\$RANK\" = 1 ]; then $rank1; fi; exec \"\$@\"" sh "$train" --config="$config" \
        --set=args.output_dir="$tmp/$name" --set=args.max_steps=2 --set=args.eval_strategy=NO \
        --set=args.save_strategy=NO '--set=args.ddp={}' --set=args.use_cpu=true 2>&1)
  code=$?
}

expect_refused() {
  local what="$1" want="$2" r
  [[ $code == 1 ]] || fail "$what: exit $code, expected 1"
  for r in 0 1; do
    grep -q "\[rank $r\] .*$want" <<<"$out" || fail "$what: rank $r did not say: $want"
  done
  ! grep -q '"step":1[,}]' <<<"$out" || fail "$what: a step ran"
}

run same ":"
echo "the same job on both ranks: exit $code"
[[ $code == 0 ]] || { fail "the same job on both ranks: exit $code"; echo "$out" | tail -n 20; }

run other_launcher "TORCHELASTIC_RUN_ID=another-job; export TORCHELASTIC_RUN_ID"
grep -E "another launcher|launch:" <<<"$out" | cut -c1-240
expect_refused "rank 1 from another launcher" \
  "rank(s) 1 were started by another launcher than the ranks before them on their node"

run other_data "set -- \"\$@\" --set=data.seq_len=32"
grep -E "model or data|launch:" <<<"$out" | cut -c1-240
expect_refused "rank 1 with another seq_len" \
  "rank(s) 1 were started with another model or data configuration than rank 0"

((failed)) && exit 1
echo PASS
