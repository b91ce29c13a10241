#!/usr/bin/env bash
# Runs every bad-input case of docs/RELIABILITY.md against the real binaries and prints, per
# case, the exit code and the lines that say what happened (the error, or the warnings of a run
# that continues). Needs python3 (standard library only) for the byte edits.
#
#   bazel build //tools:train //tools:ckpt && tools/reliability_check.sh [WORK_DIR]
#
# Each case starts from a copy of one trained run (a tiny Qwen3-like decoder with qk_norm, 20
# steps, checkpoints at 10 and 20) and damages or mismatches one thing.
set -uo pipefail
train="${TRAIN:-bazel-bin/tools/train}"
ckpt="${CKPT:-bazel-bin/tools/ckpt}"
work="${1:-/tmp/cpptrain_reliability}"
rm -rf "$work" && mkdir -p "$work"

job() {  # out_dir, extra decoder fields
  cat <<EOF
args {
  output_dir: "$1" per_device_train_batch_size: 8 max_steps: 20 learning_rate: 3e-3
  logging_steps: 10 eval_strategy: STEPS eval_steps: 10 save_strategy: STEPS save_steps: 10
  disable_tqdm: true local { device: "cpu" }
}
model { decoder { vocab_size: 64 hidden_size: 32 intermediate_size: 64 num_hidden_layers: 2
  num_attention_heads: 4 num_key_value_heads: 2 head_dim: 8 tie_word_embeddings: true $2 } }
data { builtin: "arithmetic" seq_len: 32 builtin_train_samples: 256 builtin_eval_samples: 32 }
EOF
}

# Python helpers on files: change a tensor's byte, write NaN into it, cut a file short.
edit() {
  python3 - "$@" <<'EOF'
import json, struct, sys
op, path = sys.argv[1], sys.argv[2]
data = bytearray(open(path, "rb").read())
if op in ("flip", "nan"):
    n = struct.unpack("<Q", data[:8])[0]
    begin = json.loads(data[8:8 + n])[sys.argv[3]]["data_offsets"][0] + 8 + n
    if op == "flip":
        data[begin + 1] ^= 0x10
    else:
        data[begin:begin + 4] = struct.pack("<f", float("nan"))
elif op == "cut":
    data = data[:len(data) - int(sys.argv[3])]
elif op == "byte":  # the byte at an offset from the middle
    data[len(data) // 2] ^= 0xFF
open(path, "wb").write(data)
EOF
}

show() {  # name, command...: runs it, prints the exit code and the telling lines
  local name=$1
  shift
  "$@" > "$work/$name.log" 2>&1
  local code=$?
  echo "== $name: exit $code"
  grep -E "skips|falls back|starts from step 0|not strict|resuming without|corrupted|checksum|\
non-finite|does not match|missing|damaged|training failed|resumed from|\"train_loss\"|problem|\
verification|verify" "$work/$name.log" | grep -v "^I.*loaded" | sed -e "s|$work|\$W|g" \
    -E -e 's/^\[rank 0\] ([IWE])[0-9]{4} [0-9:.]+ +[0-9]* *[a-z_]+\.cc:[0-9]+\] /\1 /' | head -8
}

fresh() {  # a copy of the trained run, named $1
  rm -rf "$work/$1" && cp -r "$work/base" "$work/$1"
  job "$work/$1" "${2:-qk_norm: true}" > "$work/$1.textproto"
}

resume() {  # name, from, extra --set flags...
  local name=$1 from=$2
  shift 2
  "$train" --config="$work/$name.textproto" --set=args.max_steps=30 \
    --set=args.resume_from_checkpoint="$from" "$@"
}

job "$work/base" "qk_norm: true" > "$work/base.textproto"
"$train" --config="$work/base.textproto" > "$work/base.log" 2>&1 || { cat "$work/base.log"; exit 1; }
echo "trained $work/base: $(ls "$work/base" | tr '\n' ' ')"

fresh model_bytes && edit flip "$work/model_bytes/checkpoint-20/model.safetensors" \
  model.layers.0.mlp.up_proj.weight
show model_bytes resume model_bytes "$work/model_bytes/checkpoint-20"
show model_bytes_verify "$ckpt" verify "$work/model_bytes/checkpoint-20"
show model_bytes_latest resume model_bytes latest

fresh shard_bytes && edit flip "$work/shard_bytes/checkpoint-20/shard-00000-of-00001.safetensors" \
  optimizer.model.layers.1.self_attn.q_proj.weight.exp_avg
show shard_bytes resume shard_bytes "$work/shard_bytes/checkpoint-20"

fresh manifest_bytes && edit byte "$work/manifest_bytes/checkpoint-20/manifest.pb"
show manifest_bytes resume manifest_bytes "$work/manifest_bytes/checkpoint-20"
fresh manifest_garbage && head -c 64 /dev/urandom > "$work/manifest_garbage/checkpoint-20/manifest.pb"
show manifest_garbage resume manifest_garbage "$work/manifest_garbage/checkpoint-20"

fresh truncated && edit cut "$work/truncated/checkpoint-20/model.safetensors" 1000
show truncated resume truncated "$work/truncated/checkpoint-20"

fresh nan_bytes && edit nan "$work/nan_bytes/checkpoint-20/model.safetensors" model.norm.weight
show nan_bytes resume nan_bytes "$work/nan_bytes/checkpoint-20"

# NaN with matching checksums: a run that diverged (no clipping, lr 1e30; its logged loss stays
# finite while the weights and the optimizer state are NaN). Training now stops before saving
# such a checkpoint; CPPTRAIN_TEST_SAVE_DIVERGED=1 turns that off to make one.
job "$work/diverged" "qk_norm: true" > "$work/diverged.textproto"
CPPTRAIN_TEST_SAVE_DIVERGED=1 "$train" --config="$work/diverged.textproto" --set=args.learning_rate=1e30 \
  --set=args.max_grad_norm=0 --set=args.eval_strategy=NO --set=args.max_steps=4 \
  --set=args.save_steps=2 > "$work/diverged_train.log" 2>&1
show diverged resume diverged "$work/diverged/checkpoint-4"
show diverged_verify "$ckpt" verify "$work/diverged/checkpoint-4"
show diverged_latest resume diverged latest

fresh trainer_state && sed -i 's/global_step: 20/global_step: 29/' \
  "$work/trainer_state/checkpoint-20/trainer_state.textproto"
show trainer_state resume trainer_state "$work/trainer_state/checkpoint-20"

fresh rng && rm "$work/rng/checkpoint-20/rng_state_0.safetensors"
show rng_missing resume rng "$work/rng/checkpoint-20"
show rng_missing_not_strict resume rng "$work/rng/checkpoint-20" --set=args.load_strict=false

# A kill during the first save: only .tmp-checkpoint-10 is left.
job "$work/killed" "qk_norm: true" > "$work/killed.textproto"
CPPTRAIN_TEST_KILL_IN_SAVE_AT_STEP=10 "$train" --config="$work/killed.textproto" \
  > "$work/killed_train.log" 2>&1
echo "killed run exited $?: $(ls -a "$work/killed" | tr '\n' ' ')"
show unfinished_latest resume killed latest

fresh qk_norm "qk_norm: false"
show qk_norm resume qk_norm "$work/qk_norm/checkpoint-20"
show qk_norm_not_strict resume qk_norm "$work/qk_norm/checkpoint-20" --set=args.load_strict=false
fresh bias "qk_norm: true attention_bias: false"
job "$work/biased" "qk_norm: true attention_bias: true" > "$work/biased.textproto"
"$train" --config="$work/biased.textproto" > "$work/biased_train.log" 2>&1
show bias resume bias "$work/biased/checkpoint-20"
fresh rope "qk_norm: true rope_theta: 1000000"
show rope_theta resume rope "$work/rope/checkpoint-20"
show intact resume rope "$work/base/checkpoint-20" --set=model.decoder.rope_theta=10000
