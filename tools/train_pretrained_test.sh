#!/usr/bin/env bash
# Fine-tuning a Hugging Face directory from the command line: //tools:train with
# model { pretrained: DIR } on checkpoint/testdata/hf_rope_llama3_tiny (saved by transformers,
# llama3 RoPE scaling; tests/golden/gen_hf_golden.py) must
#  1. evaluate at step 0 to transformers' loss on the same samples (expected.json, fp32) within
#     1e-5, before any training;
#  2. fine-tune: the loss falls and checkpoint-N is saved;
#  3. refuse a model.decoder field that disagrees with config.json, naming it and both values;
#     refuse a directory holding a tensor the model lacks, naming it and load_strict, and load
#     it with a warning under load_strict: false;
#  4. under FSDP2, FSDP1 with cpu_ram_efficient_loading and ZeRO-3 with zero3_init_flag on two
#     processes (sharded at load: each rank reads only its own rows), evaluate at step 0 to the
#     same loss;
#  5. `ckpt to-full` of the checkpoint writes config.json and generation_config.json, and
#     transformers' from_pretrained loads the result as it is, with the final eval_loss
#     (tools/hf_eval_loss.py; needs torch and transformers in $CPPTRAIN_VENV, else SKIPPED).
set -euo pipefail
train="$1"
ckpt="$2"
model_dir="$3"
golden_dir="$4"
checker="$5"
launch="$6"
out="${TEST_TMPDIR}/finetune"
eval_file="$golden_dir/eval.bin"
expected=$(sed -nE 's/.*"eval_loss": ([0-9.eE+-]+).*/\1/p' "$golden_dir/expected.json")
seq_len=$(sed -nE 's/.*"seq_len": ([0-9]+).*/\1/p' "$golden_dir/expected.json")
job="${TEST_TMPDIR}/job.textproto"
cat >"$job" <<JOB
args {
  output_dir: "$out"
  per_device_train_batch_size: 4
  per_device_eval_batch_size: 8
  max_steps: 20
  learning_rate: 1e-2
  logging_steps: 1
  eval_strategy: STEPS
  eval_steps: 20
  eval_on_start: true
  save_strategy: STEPS
  save_steps: 20
  seed: 7
  local { device: "cpu" }
}
model { pretrained: "$model_dir" }
data { train_file: "$eval_file" eval_file: "$eval_file" seq_len: $seq_len }
JOB

summary=$("$train" --config="$job" 2>"${TEST_TMPDIR}/train.log") || {
  cat "${TEST_TMPDIR}/train.log"; exit 1; }
metrics="$out/metrics.jsonl"
first_eval=$(grep -m1 '"eval_loss":' "$metrics")
[[ "$first_eval" == *'"step":0'* ]] || { echo "FAIL: the first evaluation is not at step 0: $first_eval"; exit 1; }
eval0=$(sed -E 's/.*"eval_loss":([^,}]*).*/\1/' <<<"$first_eval")
echo "eval_loss at step 0: $eval0; transformers: $expected"
# Fails unless eval_loss $2 (of the run named $1) is within 1e-5 of transformers'.
expect_transformers_loss() {
  awk -v a="$2" -v b="$expected" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d < 1e-5) }' ||
    { echo "FAIL: $1's eval_loss at step 0 differs from transformers' by 1e-5 or more"; exit 1; }
}
expect_transformers_loss "the single process" "$eval0"

first=$(grep -m1 '"loss":' "$metrics" | sed -E 's/.*"loss":([^,}]*).*/\1/')
last=$(grep '"loss":' "$metrics" | tail -1 | sed -E 's/.*"loss":([^,}]*).*/\1/')
echo "training loss: first $first, last $last"
awk -v f="$first" -v l="$last" 'BEGIN { exit !(l < 0.9 * f) }' ||
  { echo "FAIL: fine-tuning did not lower the loss"; exit 1; }
[[ -d "$out/checkpoint-20" ]] || { echo "FAIL: no $out/checkpoint-20"; exit 1; }

if "$train" --config="$job" --set=model.decoder.hidden_size=48 --set="args.output_dir=$out-bad" \
  >/dev/null 2>"${TEST_TMPDIR}/bad.log"; then
  echo "FAIL: a model.decoder.hidden_size that disagrees with config.json was accepted"; exit 1
fi
grep -q "model.decoder.hidden_size is 48 but model.pretrained '$model_dir' has hidden_size 32" \
  "${TEST_TMPDIR}/bad.log" || { echo "FAIL: unclear error:"; cat "${TEST_TMPDIR}/bad.log"; exit 1; }

# A directory with a tensor the model lacks: refused, naming it and load_strict; with
# load_strict false it loads with a warning naming it.
extra_dir="${TEST_TMPDIR}/extra_tensor"
mkdir -p "$extra_dir"
cp "$model_dir/config.json" "$extra_dir/"
python3 - "$model_dir/model.safetensors" "$extra_dir/model.safetensors" <<'PY'
import json, struct, sys
data = open(sys.argv[1], "rb").read()
size = struct.unpack("<Q", data[:8])[0]
header, body = json.loads(data[8:8 + size]), data[8 + size:]
header["model.unexpected.weight"] = {"dtype": "F32", "shape": [1],
                                     "data_offsets": [len(body), len(body) + 4]}
text = json.dumps(header).encode()
open(sys.argv[2], "wb").write(struct.pack("<Q", len(text)) + text + body + bytes(4))
PY
extra=(--config="$job" --set="model.pretrained=$extra_dir" --set=args.max_steps=1
  --set=args.save_strategy=NO --set=args.eval_on_start=false)
if "$train" "${extra[@]}" --set="args.output_dir=$out-strict" >/dev/null 2>"${TEST_TMPDIR}/strict.log"; then
  echo "FAIL: a model directory with a tensor the model lacks loaded under load_strict"; exit 1
fi
grep -q "model.unexpected.weight" "${TEST_TMPDIR}/strict.log" &&
  grep -q "set load_strict: false in the training arguments" "${TEST_TMPDIR}/strict.log" ||
  { echo "FAIL: unclear error:"; cat "${TEST_TMPDIR}/strict.log"; exit 1; }
"$train" "${extra[@]}" --set=args.load_strict=false --set="args.output_dir=$out-lenient" \
  >/dev/null 2>"${TEST_TMPDIR}/lenient.log" || {
  echo "FAIL: load_strict=false did not load"; cat "${TEST_TMPDIR}/lenient.log"; exit 1; }
grep -q "model.unexpected.weight" "${TEST_TMPDIR}/lenient.log" ||
  { echo "FAIL: load_strict=false loaded without naming the extra tensor"; exit 1; }

# Sharded at load on two processes, each engine evaluates at step 0 to the same loss: FSDP2
# reads each rank's rows; FSDP1 with cpu_ram_efficient_loading and ZeRO-3 with zero3_init_flag
# read the rows covering each rank's flat pieces.
for engine in fsdp2 fsdp1 zero3; do
  case $engine in
    fsdp2) option='--set=args.fsdp={version: 2}'; said="this rank's rows only" ;;
    fsdp1) option='--set=args.fsdp={version: 1 cpu_ram_efficient_loading: true}'
      said="this rank's flat pieces only" ;;
    zero3) option='--set=args.zero={stage: 3 zero3_init_flag: true}'
      said="this rank's flat pieces only" ;;
  esac
  "$launch" --nproc_per_node=2 --master_port=0 "$train" --config="$job" "$option" \
    --set=args.use_cpu=true --set=args.max_steps=2 --set=args.save_strategy=NO \
    --set="args.output_dir=$out-$engine" >/dev/null 2>"${TEST_TMPDIR}/$engine.log" || {
    cat "${TEST_TMPDIR}/$engine.log"; exit 1; }
  grep -q "$said" "${TEST_TMPDIR}/$engine.log" ||
    { echo "FAIL: the $engine ranks did not load $said"; exit 1; }
  eval0=$(grep -m1 '"eval_loss":' "$out-$engine/metrics.jsonl" | sed -E 's/.*"eval_loss":([^,}]*).*/\1/')
  echo "$engine, 2 ranks: eval_loss at step 0: $eval0"
  expect_transformers_loss "$engine" "$eval0"
done

full="${TEST_TMPDIR}/full"
"$ckpt" to-full "$out/checkpoint-20" "$full" >/dev/null
for f in model.safetensors config.json generation_config.json; do
  [[ -s "$full/$f" ]] || { echo "FAIL: ckpt to-full wrote no $f"; exit 1; }
done
grep -q '"rope_type": "llama3"' "$full/config.json" || { echo "FAIL: config.json lost the RoPE scaling"; exit 1; }
grep -q '"eos_token_id": 2' "$full/generation_config.json" || { echo "FAIL: generation_config.json lacks eos_token_id"; exit 1; }
final=$(sed -E 's/.*"eval_loss":([^,}]*).*/\1/' <<<"$summary")
python="${CPPTRAIN_VENV:-/nonexistent}/bin/python"
if "$python" -c "import torch, transformers" 2>/dev/null; then
  "$python" "$checker" "$full" "$eval_file" "$seq_len" "$final"
else
  echo "SKIPPED: from_pretrained check of ckpt to-full's output (no torch and transformers in CPPTRAIN_VENV='${CPPTRAIN_VENV:-}')"
fi
echo PASS
