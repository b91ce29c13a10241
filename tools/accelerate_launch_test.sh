#!/usr/bin/env bash
# Accelerate's configuration end to end, 2 processes on the CPU over Gloo, the demo job (a
# llama decoder of 2 layers) for 3 steps, with YAML samples Accelerate's own config class
# wrote (config/testdata/accelerate/, tools/accelerate_samples.py):
#   - tools/launch --config_file fsdp2.yaml: the process count comes from the file (no
#     --nproc_per_node), the ranks train FSDP2 with LlamaDecoderLayer wrapped;
#   - tools/launch --config_file deepspeed_config_file.yaml: ZeRO-2 from the DeepSpeed JSON
#     (HF's ZeRO-2 sample with "auto" values) the YAML names;
#   - tools/train --accelerate_config=fsdp1_full_shard.yaml under tools/launch: FSDP1;
#   - the real `accelerate launch --config_file fsdp2.yaml` of the current PyPI accelerate
#     (installed by tools/install_torchrun.sh into $CPPTRAIN_VENV or a virtualenv here): the
#     ranks read ACCELERATE_USE_FSDP and the FSDP_* variables it sets (before: each rank
#     trained its own single-process copy).
# Each must finish 3 steps as one job of world 2 with the engine the file asks for.
set -euo pipefail
train="$(realpath "$1")"
config="$(realpath "$2")"
launch="$(realpath "$3")"
installer="$4"
samples="$(dirname "$(realpath "$5")")"
fail() { echo "FAIL: $1"; [[ -n "${2:-}" ]] && tail -40 "$2"; exit 1; }
common=(--config="$config" --set=args.max_steps=3 --set=args.logging_steps=1
        --set=args.eval_strategy=NO --set=args.save_strategy=NO --set=args.use_cpu=true
        --set=args.save_only_model=false --set=args.ddp_timeout=120)

# check NAME LOG OUT PATTERN...: 3 steps logged once, world 2, and each pattern in the log.
check() {
  local name=$1 log=$2 out=$3; shift 3
  [[ "$(grep -c '"loss":' "$out/metrics.jsonl" 2>/dev/null || true)" -eq 3 ]] ||
    fail "$name: metrics.jsonl does not hold 3 steps" "$log"
  grep -q "on cpu, world 2, run $out" "$log" || fail "$name: not one job of world 2" "$log"
  for pattern in "$@"; do grep -q -- "$pattern" "$log" || fail "$name: no \"$pattern\"" "$log"; done
  echo "ok   $name: $(grep -o 'engine [a-z0-9]* on cpu, world 2' "$log" | head -1)"
}

out="$TEST_TMPDIR/fsdp2"
timeout 300 "$launch" --config_file "$samples/fsdp2.yaml" --master_port=0 "$train" \
  "${common[@]}" --set="args.output_dir=$out" >"$out.log" 2>&1 ||
  fail "tools/launch --config_file fsdp2.yaml failed" "$out.log"
check launch_fsdp2 "$out.log" "$out" "Accelerate configuration from $samples/fsdp2.yaml" \
  "FullyShard: 3 groups (2 units + root) over 2 shard ranks"

out="$TEST_TMPDIR/deepspeed"
timeout 300 "$launch" --config_file "$samples/deepspeed_config_file.yaml" --master_port=0 \
  "$train" "${common[@]}" --set="args.output_dir=$out" >"$out.log" 2>&1 ||
  fail "tools/launch --config_file deepspeed_config_file.yaml failed" "$out.log"
check launch_deepspeed_json "$out.log" "$out" "ZeRO stage 2:" "engine zero2 on cpu"

out="$TEST_TMPDIR/fsdp1"
timeout 300 "$launch" --nproc_per_node=2 --master_port=0 "$train" "${common[@]}" \
  --accelerate_config="$samples/fsdp1_full_shard.yaml" --set="args.output_dir=$out" \
  >"$out.log" 2>&1 || fail "tools/train --accelerate_config=fsdp1_full_shard.yaml failed" "$out.log"
check train_fsdp1 "$out.log" "$out" "FSDP1: FULL_SHARD over 1 x 2 ranks" \
  "FlatShard: 3 flat parameters (2 units + root)"

venv="${CPPTRAIN_VENV:-$TEST_TMPDIR/venv}"
source "$(dirname "${BASH_SOURCE[0]}")/pypi_python.sh"
"$installer" "$venv" accelerate || pypi_skip_or_fail accelerate_launch_test "accelerate"
out="$TEST_TMPDIR/accelerate_launch"
(cd "$TEST_TMPDIR" && timeout 300 "$venv/bin/accelerate" launch \
  --config_file "$samples/fsdp2.yaml" --main_process_port 0 --no_python "$train" "${common[@]}" \
  --set="args.output_dir=$out") \
  >"$out.log" 2>&1 || fail "accelerate launch --config_file fsdp2.yaml failed" "$out.log"
check accelerate_launch_fsdp2 "$out.log" "$out" \
  "Accelerate configuration from the environment of accelerate launch: args.fsdp={} \
args.fsdp.version=2" \
  "FullyShard: 3 groups (2 units + root) over 2 shard ranks"
echo "accelerate: 4 runs passed"
