#!/usr/bin/env bash
# The architectures beyond Llama and Qwen3 through the whole job: for each Hugging Face
# directory saved by transformers (tests/golden/gen_hf_arch_golden.py: Qwen2 untied and tied,
# Qwen2 and Qwen3 with a sliding window, Llama with mlp_bias, Mistral with a window of 4 on
# 24-token samples, Qwen2 with Qwen2.5-style yarn RoPE, Phi-3 with longrope and a window,
# Gemma 2 and Gemma 3 with a window of 4 in layer 0),
#  0. //tools:generate completes a 4-token prompt greedily with transformers' 20 tokens;
# and //tools:train with model { pretrained: DIR } must
#  1. evaluate at step 0 to transformers' loss on the same samples (expected.json, fp32) within
#     1e-6 relative;
#  2. fine-tune 5 steps and save checkpoint-5;
#  3. `ckpt to-full` of it writes a directory that transformers' from_pretrained loads as it is,
#     with the final eval_loss within 1e-5 (tools/hf_eval_loss.py; needs torch and transformers
#     in $CPPTRAIN_VENV, else SKIPPED);
#  4. for the directories in TWO_PROCESS (one per new architecture: Qwen2, Mistral, Phi-3,
#     Gemma 2, Gemma 3), the same job on 2 processes (tools/launch, Gloo) with 2 samples per
#     rank gives the single process's loss at each of the 5 steps within 1e-5, under each of
#     DDP, FSDP2 (each layer a unit, by transformers' class name) and ZeRO-3.
set -euo pipefail
train="$1"
ckpt="$2"
testdata="$3"    # checkpoint/testdata
golden_dir="$4"  # tools/testdata/hf_arch_eval
checker="$5"     # tools/hf_eval_loss.py
generate="$6"
launch="$7"
# The "loss" values of a run's metrics.jsonl, space-separated.
losses_of() {
  grep '"loss":' "$1/metrics.jsonl" | sed -E 's/.*"loss":([^,}]*).*/\1/' | tr '\n' ' '
}
# Whether two such lists both hold 5 losses, each pair within 1e-5.
same_losses() {
  awk -v a="$1" -v b="$2" 'BEGIN { n = split(a, x, " "); m = split(b, y, " ");
      if (n != 5 || m != 5) exit 1;
      for (i = 1; i <= n; i++) { d = x[i] - y[i]; if (d < 0) d = -d; if (d >= 1e-5) exit 1 } }'
}
# The directory of each new architecture, with its decoder layer's class name in transformers.
declare -A TWO_PROCESS=(
  [hf_qwen2_tiny]=Qwen2DecoderLayer
  [hf_mistral_tiny]=MistralDecoderLayer
  [hf_phi3_tiny]=Phi3DecoderLayer
  [hf_gemma2_tiny]=Gemma2DecoderLayer
  [hf_gemma3_tiny]=Gemma3DecoderLayer
)
prompt=$(sed -nE 's/.*"prompt": "([0-9 ]+)".*/\1/p' "$golden_dir/expected.json")
eval_file="$golden_dir/eval.bin"
seq_len=$(sed -nE 's/.*"seq_len": ([0-9]+).*/\1/p' "$golden_dir/expected.json")
python="${CPPTRAIN_VENV:-/nonexistent}/bin/python"
have_transformers=false
"$python" -c "import torch, transformers" 2>/dev/null && have_transformers=true

for name in hf_qwen2_tiny hf_qwen2_tied_tiny hf_qwen2_sliding_tiny hf_qwen3_sliding_tiny \
            hf_llama_mlp_bias_tiny hf_mistral_tiny hf_rope_yarn_tiny \
            hf_phi3_tiny hf_phi3_partial_tiny hf_gemma2_tiny hf_gemma3_tiny; do
  model_dir="$testdata/$name"
  expected=$(sed -nE "s/.*\"$name\": ([0-9.eE+-]+).*/\1/p" "$golden_dir/expected.json")
  [[ -n "$expected" ]] || { echo "FAIL: no eval_loss for $name in expected.json"; exit 1; }
  want=$(sed -nE "s/.*\"$name\": \"([0-9 ]+)\".*/\1/p" "$golden_dir/expected.json" | tr ' ' ',')
  [[ -n "$want" ]] || { echo "FAIL: no completion for $name in expected.json"; exit 1; }
  got=$("$generate" --model="$model_dir" --prompt="$prompt" --max_new_tokens=20 2>/dev/null |
        sed -nE 's/.*"completion_ids":\[([0-9,]*)\].*/\1/p')
  echo "$name: greedy completion $got, transformers $want"
  [[ "$got" == "$want" ]] || { echo "FAIL: $name: the greedy completion differs from transformers'"; exit 1; }

  out="${TEST_TMPDIR}/$name"
  job="${TEST_TMPDIR}/$name.textproto"
  cat >"$job" <<JOB
args {
  output_dir: "$out"
  per_device_train_batch_size: 4
  per_device_eval_batch_size: 8
  max_steps: 5
  learning_rate: 1e-2
  logging_steps: 1
  eval_strategy: STEPS
  eval_steps: 5
  eval_on_start: true
  save_strategy: STEPS
  save_steps: 5
  seed: 7
  local { device: "cpu" }
}
model { pretrained: "$model_dir" }
data { train_file: "$eval_file" eval_file: "$eval_file" seq_len: $seq_len }
JOB
  summary=$("$train" --config="$job" 2>"${TEST_TMPDIR}/$name.log") || {
    cat "${TEST_TMPDIR}/$name.log"; echo "FAIL: $name"; exit 1; }
  first_eval=$(grep -m1 '"eval_loss":' "$out/metrics.jsonl")
  [[ "$first_eval" == *'"step":0'* ]] || { echo "FAIL: $name: the first evaluation is not at step 0"; exit 1; }
  eval0=$(sed -E 's/.*"eval_loss":([^,}]*).*/\1/' <<<"$first_eval")
  echo "$name: eval_loss at step 0 $eval0, transformers $expected"
  awk -v a="$eval0" -v b="$expected" 'BEGIN { d = (a - b) / b; if (d < 0) d = -d; exit !(d < 1e-6) }' ||
    { echo "FAIL: $name: eval_loss at step 0 differs from transformers' by 1e-6 relative or more"; exit 1; }
  [[ -d "$out/checkpoint-5" ]] || { echo "FAIL: $name: no checkpoint-5"; exit 1; }
  if [[ -n "${TWO_PROCESS[$name]:-}" ]]; then
    one=$(losses_of "$out")
    for engine in 'ddp { }' \
        "fsdp { version: 2 transformer_layer_cls_to_wrap: \"${TWO_PROCESS[$name]}\" }" \
        'zero { stage: 3 }'; do
      two="${TEST_TMPDIR}/$name-2proc-${engine%% *}"
      sed -e "s|output_dir: \"$out\"|output_dir: \"$two\"|" \
          -e 's|per_device_train_batch_size: 4|per_device_train_batch_size: 2|' \
          -e "s|local { device: \"cpu\" }|use_cpu: true $engine|" \
          -e 's|save_strategy: STEPS|save_strategy: NO|' "$job" >"$two.textproto"
      timeout 300 "$launch" --nproc_per_node=2 --master_port=0 "$train" \
        --config="$two.textproto" >/dev/null 2>"$two.log" ||
        { cat "$two.log"; echo "FAIL: $name: the 2-process run ($engine) failed"; exit 1; }
      echo "$name: losses 1 process $one, 2 processes ($engine) $(losses_of "$two")"
      same_losses "$one" "$(losses_of "$two")" ||
        { echo "FAIL: $name: 2-process losses ($engine) differ from 1 process's by 1e-5 or more"
          exit 1; }
    done
  fi

  full="${TEST_TMPDIR}/$name-full"
  "$ckpt" to-full "$out/checkpoint-5" "$full" >/dev/null
  final=$(sed -E 's/.*"eval_loss":([^,}]*).*/\1/' <<<"$summary")
  if $have_transformers; then
    "$python" "$checker" "$full" "$eval_file" "$seq_len" "$final"
  else
    echo "SKIPPED: $name: from_pretrained check of ckpt to-full's output (no torch and transformers in CPPTRAIN_VENV='${CPPTRAIN_VENV:-}')"
  fi
done
echo PASS
