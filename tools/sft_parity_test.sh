#!/usr/bin/env bash
# Instruction tuning as TRL's SFTTrainer does it, through //tools:train: 20 steps on each of two
# small JSONL datasets of tools/testdata/sft (written by tests/golden/gen_sft_golden.py, with
# tools/sft_tokenize.py for the tokens) on its tiny random Qwen3, packed best-fit decreasing,
# padding-free, gradient accumulation 2, AdamW with weight decay and a linear schedule:
#   pc:   prompt/completion records, completion_only_loss (on by default for them);
#   chat: messages records, assistant_only_loss.
# Every step's loss must be within 1e-5 of SFTTrainer's (golden.txt), and the run must print
# the packed row count TRL's packing gave. Then a text record is refused with the
# tools/sft_tokenize.py command that tokenizes it. With torch and transformers in
# $CPPTRAIN_VENV, tools/sft_tokenize.py must write the committed .tok.jsonl files again from the
# text records (else SKIPPED).
set -euo pipefail
train="$1"
dir="$2"
tokenizer_tool="$3"

# golden.txt: "<run> <packed rows> <loss at step 1> ... <loss at step 20>" a line.
golden_line() { grep "^$1 " "$dir/golden.txt"; }

run() {  # name, extra data fields
  local name="$1" data="$2" out="${TEST_TMPDIR}/$1"
  rm -rf "$out"
  cat >"${TEST_TMPDIR}/$name.textproto" <<JOB
args {
  output_dir: "$out"
  per_device_train_batch_size: 2
  gradient_accumulation_steps: 2
  learning_rate: 2e-3
  lr_scheduler_type: LINEAR
  warmup_steps: 2
  weight_decay: 0.01
  max_steps: 20
  seed: 42
  logging_steps: 1
  save_strategy: NO
  disable_tqdm: true
  local { device: "cpu" }
}
model { pretrained: "$dir/model" }
data { format: JSONL train_file: "$dir/$name.tok.jsonl" max_length: 32 packing: true $data }
JOB
  "$train" --config="${TEST_TMPDIR}/$name.textproto" >"${TEST_TMPDIR}/$name.out" \
    2>"${TEST_TMPDIR}/$name.log" || { cat "${TEST_TMPDIR}/$name.log"; exit 1; }
  local rows
  rows=$(golden_line "$name" | cut -d' ' -f2)
  grep -q "$name.tok.jsonl: [0-9]* records, $rows packed rows" "${TEST_TMPDIR}/$name.log" ||
    { echo "FAIL: $name: TRL packed $rows rows; the log says:"; grep "packed rows" "${TEST_TMPDIR}/$name.log"; exit 1; }
  golden_line "$name" | cut -d' ' -f3- | tr ' ' '\n' >"${TEST_TMPDIR}/$name.expected"
  grep '"loss":' "$out/metrics.jsonl" | sed -E 's/.*"loss":([^,}]*).*/\1/' >"${TEST_TMPDIR}/$name.actual"
  paste "${TEST_TMPDIR}/$name.expected" "${TEST_TMPDIR}/$name.actual" | awk -v name="$name" '
    NF == 2 { n++; d = $1 - $2; if (d < 0) d = -d; if (d > max) max = d
              printf "%s step %2d: TRL %.8f cpptrain %.8f |diff| %.2e\n", name, n, $1, $2, d }
    NF != 2 { bad = 1 }
    END { printf "%s: %d steps, max |loss diff| %.3e\n", name, n, max
          if (bad || n != 20) { print "FAIL: " name ": not 20 losses on each side"; exit 1 }
          if (max >= 1e-5) { print "FAIL: " name ": a loss differs from TRL by 1e-5 or more"; exit 1 } }'
}

run pc ""
run chat "assistant_only_loss: true"

# A text record: refused with the command that tokenizes it.
if "$train" --config="${TEST_TMPDIR}/chat.textproto" --set="data.train_file=$dir/chat.jsonl" \
  --set="args.output_dir=${TEST_TMPDIR}/text" >/dev/null 2>"${TEST_TMPDIR}/text.log"; then
  echo "FAIL: a text record was accepted"; exit 1
fi
grep -q "python3 tools/sft_tokenize.py --model $dir/model --input $dir/chat.jsonl --output $dir/chat.tok.jsonl --assistant_only_loss" \
  "${TEST_TMPDIR}/text.log" || { echo "FAIL: unclear error:"; cat "${TEST_TMPDIR}/text.log"; exit 1; }
# Options refused before anything runs, naming the field, the value and the fix.
expect_refused() {  # expected message, --set overrides...
  local expected="$1"; shift
  if "$train" --config="${TEST_TMPDIR}/pc.textproto" --set="args.output_dir=${TEST_TMPDIR}/bad" \
    "$@" >/dev/null 2>"${TEST_TMPDIR}/bad.log"; then
    echo "FAIL: $* was accepted"; exit 1
  fi
  grep -qF "$expected" "${TEST_TMPDIR}/bad.log" ||
    { echo "FAIL: $* gave an unclear error:"; cat "${TEST_TMPDIR}/bad.log"; exit 1; }
}
expect_refused 'data.packing_strategy="wrapped" is not implemented; use "bfd"' \
  --set=data.packing_strategy=wrapped
expect_refused 'data.packing is set but data.format is TOKENS; it applies to data.format: JSONL only' \
  --set=data.format=TOKENS
expect_refused 'data.completion_only_loss is on but the record has no "completion_mask"' \
  --set="data.train_file=$dir/chat.tok.jsonl" --set=data.completion_only_loss=true
expect_refused 'args.do_predict with data.packing = true would write one prediction per packed row' \
  --set=args.do_predict=true --set="data.eval_file=$dir/pc.tok.jsonl"
python="${CPPTRAIN_VENV:-/nonexistent}/bin/python"
if "$python" -c "import torch, transformers" 2>/dev/null; then
  "$python" "$tokenizer_tool" --model "$dir/model" --input "$dir/pc.jsonl" \
    --output "${TEST_TMPDIR}/pc.tok.jsonl" >/dev/null
  "$python" "$tokenizer_tool" --model "$dir/model" --input "$dir/chat.jsonl" \
    --output "${TEST_TMPDIR}/chat.tok.jsonl" --assistant_only_loss >/dev/null
  for name in pc chat; do
    cmp "${TEST_TMPDIR}/$name.tok.jsonl" "$dir/$name.tok.jsonl" ||
      { echo "FAIL: tools/sft_tokenize.py no longer writes $dir/$name.tok.jsonl"; exit 1; }
  done
  echo "tools/sft_tokenize.py rewrote both .tok.jsonl files byte for byte"
else
  echo "SKIPPED: tools/sft_tokenize.py check (no torch and transformers in CPPTRAIN_VENV='${CPPTRAIN_VENV:-}')"
fi
echo PASS
