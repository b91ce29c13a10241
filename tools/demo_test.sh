#!/usr/bin/env bash
# End to end: //tools:train on the demo config (fewer steps) must leave a metrics.jsonl whose
# last training loss is at most 70% of the first, followed by an evaluation line, and print a
# summary line with eval_loss.
set -euo pipefail
train="$1"
config="$2"
out="${TEST_TMPDIR}/demo"
summary=$("$train" --config="$config" --set="args.output_dir=$out" --set=args.max_steps=150 \
  --set=args.eval_steps=75 2>"${TEST_TMPDIR}/train.log") || {
  cat "${TEST_TMPDIR}/train.log"; exit 1; }
metrics="$out/metrics.jsonl"
[[ -s "$metrics" ]] || { echo "no $metrics"; exit 1; }
first=$(grep -m1 '"loss":' "$metrics" | sed -E 's/.*"loss":([^,}]*).*/\1/')
last=$(grep '"loss":' "$metrics" | tail -1 | sed -E 's/.*"loss":([^,}]*).*/\1/')
last_loss_line=$(grep -n '"loss":' "$metrics" | tail -1 | cut -d: -f1)
eval_line=$(grep -n '"eval_loss":' "$metrics" | tail -1 | cut -d: -f1)
echo "first loss $first, last loss $last, last loss on line $last_loss_line, eval on line $eval_line"
awk -v f="$first" -v l="$last" 'BEGIN { exit !(l <= 0.7 * f) }' ||
  { echo "FAIL: last loss $last is above 70% of the first ($first)"; exit 1; }
[[ -n "$eval_line" && "$eval_line" -gt "$last_loss_line" ]] ||
  { echo "FAIL: no evaluation line after the last training loss"; exit 1; }
[[ "$summary" == *'"eval_loss":'* ]] || { echo "FAIL: summary lacks eval_loss: $summary"; exit 1; }
echo PASS
