#!/usr/bin/env bash
# Run modes end to end (docs/PREDICTIONS.md): //tools:train trains the demo job briefly with the
# arithmetic compute_metrics and saves checkpoint-N; then, from that checkpoint as
# model.pretrained, do_train: false with do_eval gives the same eval_loss, do_predict writes
# predictions.jsonl (one line per eval sample, with top-k logits); //tools:generate completes
# token ids and arithmetic prompts from the checkpoint (greedy, and sampled: the same tokens for
# the same --seed) and reports an exact-match accuracy.
set -euo pipefail
train="$1"
generate="$2"
config="$3"
out="${TEST_TMPDIR}/modes"
common=(--config="$config" --set=data.builtin_train_samples=256 --set=data.builtin_eval_samples=24
  --set=args.eval_steps=20 --set=args.logging_steps=5)
summary=$("$train" "${common[@]}" --set="args.output_dir=$out" --set=args.max_steps=20 \
  --set=args.save_strategy=STEPS --set=args.save_steps=20 2>"${TEST_TMPDIR}/train.log") || {
  cat "${TEST_TMPDIR}/train.log"; exit 1; }
echo "train: $summary"
[[ "$summary" == *'"eval_answer_exact_match":'* ]] ||
  { echo "FAIL: no eval_answer_exact_match from the arithmetic compute_metrics"; exit 1; }
value() { sed -E "s/.*\"$1\":([^,}]*).*/\1/" <<<"$2"; }
trained_eval=$(value eval_loss "$summary")
ckpt="$out/checkpoint-20"

eval_only=$("$train" "${common[@]}" --set="args.output_dir=$out-eval" \
  --set="model={pretrained: \"$ckpt\"}" --set=args.do_train=false --set=args.do_eval=true \
  2>"${TEST_TMPDIR}/eval.log") || { cat "${TEST_TMPDIR}/eval.log"; exit 1; }
echo "eval only: $eval_only"
[[ "$eval_only" != *'train_runtime'* ]] || { echo "FAIL: do_train: false trained"; exit 1; }
[[ "$(value eval_loss "$eval_only")" == "$trained_eval" ]] ||
  { echo "FAIL: eval-only eval_loss differs from the trained model's ($trained_eval)"; exit 1; }

predicted=$("$train" "${common[@]}" --set="args.output_dir=$out-predict" \
  --set="model={pretrained: \"$ckpt\"}" --set=args.do_train=false --set=args.do_predict=true \
  --set=args.predict_top_k=3 2>"${TEST_TMPDIR}/predict.log") || {
  cat "${TEST_TMPDIR}/predict.log"; exit 1; }
echo "predict: $predicted"
[[ "$predicted" == *'"test_loss":'* ]] || { echo "FAIL: no test_loss"; exit 1; }
lines="$out-predict/predictions.jsonl"
[[ $(wc -l <"$lines") -eq 24 ]] || { echo "FAIL: $lines has $(wc -l <"$lines") lines, not 24"; exit 1; }
head -c 300 "$lines"; echo
for key in '"index":0' '"label_ids":[' '"predicted_ids":[' '"top_k_ids":[[' '"top_k_logits":[['; do
  [[ "$(head -1 "$lines")" == *"$key"* ]] || { echo "FAIL: the first prediction lacks $key"; exit 1; }
done

ids=$("$generate" --model="$ckpt" --prompt="2 3 11 4 12" --max_new_tokens=4 2>/dev/null)
echo "generate ids: $ids"
[[ "$ids" =~ ^\{\"prompt_ids\":\[2,3,11,4,12\],\"completion_ids\":\[[0-9,]+\]\}$ ]] ||
  { echo "FAIL: unexpected ids output"; exit 1; }
# Sampling: one line per --prompt, the same tokens for the same --seed.
sample() {
  "$generate" --model="$ckpt" --prompt="2 3 11" --prompt="4 12" --max_new_tokens=6 --do_sample \
    --temperature=1.5 --top_k=8 --top_p=0.95 --seed="$1" 2>/dev/null
}
sampled=$(sample 5)
echo "generate sampled: $sampled"
[[ $(grep -c '"completion_ids":\[[0-9]' <<<"$sampled") -eq 2 ]] ||
  { echo "FAIL: sampling did not complete both prompts"; exit 1; }
[[ "$(sample 5)" == "$sampled" ]] || { echo "FAIL: one --seed sampled different tokens"; exit 1; }
text=$("$generate" --model="$ckpt" --tokenizer=arithmetic --prompt="12+30=" 2>/dev/null)
echo "generate text: $text"
[[ "$text" == *'"prompt":"12+30="'* && "$text" == *'"completion":'* ]] || { echo "FAIL: text output"; exit 1; }
sums=$("$generate" --model="$ckpt" --arithmetic_eval=5 2>/dev/null)
echo "$sums"
[[ $(grep -c '+' <<<"$sums") -eq 5 && "$sums" == *"exact match: "*"/5 = "* ]] ||
  { echo "FAIL: --arithmetic_eval output"; exit 1; }
if "$generate" --model="$ckpt" --prompt="1 999" 2>"${TEST_TMPDIR}/bad.log"; then
  echo "FAIL: a token id outside the vocabulary was accepted"; exit 1
fi
grep -q "prompt token id 999 is outside the model's vocabulary" "${TEST_TMPDIR}/bad.log" ||
  { cat "${TEST_TMPDIR}/bad.log"; exit 1; }
echo PASS
