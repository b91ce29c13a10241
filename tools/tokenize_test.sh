#!/usr/bin/env bash
# tools/tokenize_text.py end to end: a word-level tokenizer built here (Hugging Face's
# `tokenizers`, offline) turns a small text into a token file and its .meta.json; //tools:train
# trains 2 steps on it; then the loader refuses, before any step, a dtype that disagrees with
# the metadata, a metadata vocab_size above the model's, and (without metadata) a token id at
# or above the model's vocab_size, naming the file, the offset and the value. The package
# comes from $CPPTRAIN_VENV or is installed into a virtualenv here.
set -euo pipefail
train="$1"
tokenize="$2"
dir="${TEST_TMPDIR}/tokenize"
mkdir -p "$dir"
source "$(dirname "${BASH_SOURCE[0]}")/pypi_python.sh"
pypi_python tokenizers tokenize_test

# Two tokenizers: "small" (vocab 24, fits the tiny model's 64) and "big" (vocab 100, where
# "rare" is id 99).
"$python" - "$dir" <<'PY'
import sys
from tokenizers import Tokenizer, models, pre_tokenizers
out = sys.argv[1]
words = "the a cat dog sat ran on under mat rug and then slept ate fish".split()
with open(f"{out}/corpus.txt", "w") as f:
    for i in range(200):
        f.write(" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(6)) + "\n")
with open(f"{out}/rare.txt", "w") as f:
    f.write("the cat sat on the mat\n" * 20 + "the rare cat\n")
def build(size, name):
    vocab = {"[UNK]": 0, "[EOS]": 1}
    for w in words:
        vocab[w] = len(vocab)
    while len(vocab) < size - 1:
        vocab[f"pad{len(vocab)}"] = len(vocab)
    vocab["rare"] = len(vocab)
    t = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.save(f"{out}/{name}.json")
build(24, "small")
build(100, "big")
PY

"$python" "$tokenize" --tokenizer "$dir/small.json" --input "$dir/corpus.txt" \
  --output "$dir/train.bin"
"$python" - "$dir/train.bin" <<'PY'
import json, os, sys
path = sys.argv[1]
meta = json.load(open(path + ".meta.json"))
assert meta["dtype"] == "uint16" and meta["vocab_size"] == 24 and meta["eos_id"] == 1, meta
# 200 lines of 6 words, each followed by [EOS].
assert meta["num_tokens"] == 200 * 7 == os.path.getsize(path) // 2, meta
data = open(path, "rb").read()
ids = [int.from_bytes(data[i:i + 2], "little") for i in range(0, len(data), 2)]
assert ids[6] == 1 and ids[13] == 1 and max(ids) < 24 and 0 not in ids, ids[:14]
print("meta ok:", meta)
PY

cat >"$dir/job.textproto" <<JOB
args {
  max_steps: 2
  save_strategy: NO
  logging_steps: 1
  per_device_train_batch_size: 4
  disable_tqdm: true
  local { device: "cpu" }
}
model { name: "tiny" }
data { seq_len: 16 }
JOB
run() {  # run NAME SETTINGS...: tools/train on the tiny model (vocab_size 64), 2 steps
  local name="$1"
  shift
  "$train" --config="$dir/job.textproto" --set="args.output_dir=$dir/$name" "$@" \
    >"$dir/$name.log" 2>&1
}
expect_refused() {  # expect_refused NAME PATTERN... -- SETTINGS...
  local name="$1"
  shift
  local patterns=()
  while [[ "$1" != "--" ]]; do patterns+=("$1"); shift; done
  shift
  if run "$name" "$@"; then
    echo "FAIL: $name trained"; cat "$dir/$name.log"; exit 1
  fi
  for p in "${patterns[@]}"; do
    grep -qF -- "$p" "$dir/$name.log" || { echo "FAIL: $name: no '$p' in:"; cat "$dir/$name.log"; exit 1; }
  done
  if grep -q '"loss"' "$dir/$name.log"; then
    echo "FAIL: $name logged a step before refusing"; exit 1
  fi
  echo "$name refused: $(grep -oF -- "${patterns[0]}" "$dir/$name.log" | head -1)"
}

run trained --set="data.train_file=$dir/train.bin" ||
  { echo "FAIL: training on the token file"; cat "$dir/trained.log"; exit 1; }
steps=$(grep -c '"loss"' "$dir/trained/metrics.jsonl")
[[ "$steps" == 2 ]] || { echo "FAIL: $steps loss records, want 2"; exit 1; }
echo "trained 2 steps on $dir/train.bin"

expect_refused dtype "train.bin.meta.json" 'dtype "uint16"' "token_dtype UINT32" -- \
  --set="data.train_file=$dir/train.bin" --set=data.token_dtype=UINT32

"$python" "$tokenize" --tokenizer "$dir/big.json" --input "$dir/rare.txt" \
  --output "$dir/big.bin" >/dev/null
expect_refused vocab "big.bin.meta.json" "vocab_size 100" "the model's vocab_size is 64" -- \
  --set="data.train_file=$dir/big.bin"

# Without the metadata the one "rare" (id 99) is found in the pass over the tokens: 20 lines
# of 7 tokens, then "the" and "rare", so it is token 141 at byte offset 282.
rm "$dir/big.bin.meta.json"
expect_refused range "token file $dir/big.bin" "token 99 at byte offset 282" "vocab_size 64" -- \
  --set="data.train_file=$dir/big.bin"
echo PASS
