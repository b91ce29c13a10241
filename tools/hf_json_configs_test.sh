#!/usr/bin/env bash
# Hugging Face's documented sample configs (config/testdata/hf/README.md), unchanged, given to
# //tools:train as TrainingArguments takes them: deepspeed=ds_config_zero2.json,
# deepspeed=ds_config_zero3.json, fsdp=true with fsdp_config=fsdp_config.json, and
# accelerator_config=accelerator_config.json. The demo job (a llama decoder of 2 layers) trains 4
# steps on 2 processes over Gloo (tools/launch, CPU), 32 samples per rank; each run must
#   - say the engine the sample asks for (zero2, zero3, fsdp2 with the 2 LlamaDecoderLayers
#     wrapped, and the default ddp with 2 accumulation steps), over world 2;
#   - log the translation of what it does differently ("auto" keys, CPU offload on a CPU run);
#   - give the loss of 1 process on the whole batch (64 samples, the local engine, the same
#     settings spelled as our fields) at each of the 4 steps within 1e-5, as
#     tools/train_arch_test.sh asks of 2-process runs.
# Every sample runs here: none is refused or skipped (docs/ACCELERATE.md says what each
# becomes). One sample is given by a path relative to the working directory, as Python would
# open it.
set -euo pipefail
train="$(realpath "$1")"
config="$(realpath "$2")"
launch="$(realpath "$3")"
samples="$(dirname "$(realpath "$4")")"
fail() { echo "FAIL: $1"; [[ -n "${2:-}" ]] && tail -40 "$2"; exit 1; }
common=(--config="$config" --set=args.max_steps=4 --set=args.logging_steps=1
        --set=args.eval_strategy=NO --set=args.save_strategy=NO --set=args.use_cpu=true
        --set=args.ddp_timeout=120)

# The losses metrics.jsonl of output_dir $1 holds, one a line.
losses() { grep '"loss":' "$1/metrics.jsonl" | sed -E 's/.*"loss":([^,}]*).*/\1/'; }

# one NAME FLAGS...: the 1-process reference, 64 samples a step, into $TEST_TMPDIR/NAME.
one() {
  local name=$1; shift
  "$train" "${common[@]}" --set=args.per_device_train_batch_size=64 "$@" \
    --set="args.output_dir=$TEST_TMPDIR/$name" >/dev/null 2>"$TEST_TMPDIR/$name.log" ||
    fail "the 1-process reference $name failed" "$TEST_TMPDIR/$name.log"
}

# two NAME FLAGS...: 2 processes, 32 samples each, into $TEST_TMPDIR/NAME.
two() {
  local name=$1; shift
  timeout 300 "$launch" --nproc_per_node=2 --master_port=0 "$train" "${common[@]}" "$@" \
    --set="args.output_dir=$TEST_TMPDIR/$name" >/dev/null 2>"$TEST_TMPDIR/$name.log" ||
    fail "$name: the 2-process run with $* failed" "$TEST_TMPDIR/$name.log"
}

# check NAME REFERENCE PATTERN...: each pattern in NAME's log, and its 4 losses within 1e-5 of
# REFERENCE's.
check() {
  local name=$1 ref=$2; shift 2
  for pattern in "$@"; do
    grep -q -- "$pattern" "$TEST_TMPDIR/$name.log" || fail "$name: no \"$pattern\" in the log" \
      "$TEST_TMPDIR/$name.log"
  done
  local a b
  a=$(losses "$TEST_TMPDIR/$ref" | tr '\n' ' ')
  b=$(losses "$TEST_TMPDIR/$name" | tr '\n' ' ')
  awk -v a="$a" -v b="$b" 'BEGIN { n = split(a, x, " "); m = split(b, y, " ");
      if (n != 4 || m != 4) exit 1; worst = 0;
      for (i = 1; i <= n; i++) { d = x[i] - y[i]; if (d < 0) d = -d; if (d > worst) worst = d }
      printf "largest difference %.3g\n", worst; exit !(worst < 1e-5) }' >"$TEST_TMPDIR/$name.diff" ||
    fail "$name: losses $b differ from 1 process's $a by 1e-5 or more ($(cat "$TEST_TMPDIR/$name.diff"))"
  echo "ok   $name: $(grep -o 'engine [a-z0-9]* on cpu, world 2' "$TEST_TMPDIR/$name.log" | head -1);" \
    "losses $b; 1 process $a; $(cat "$TEST_TMPDIR/$name.diff")"
}

# DeepSpeed's WarmupLR is Hugging Face's constant_with_warmup; every other key of both samples
# is "auto" (the demo job's values) or ZeRO's own.
one ref_warmup_lr --set=args.lr_scheduler_type=CONSTANT_WITH_WARMUP
two zero2 --set=args.deepspeed="$samples/ds_config_zero2.json"
check zero2 ref_warmup_lr "engine zero2 on cpu, world 2" "ZeRO stage 2:" \
  'optimizer.params.lr = "auto": left unset' 'train_micro_batch_size_per_gpu = "auto"' \
  'device = "cpu": kept; on a CPU-only run' 'warmup_type is unset: DeepSpeed.s default is "log"'
# The ZeRO-3 sample by a path relative to the working directory.
(cd "$samples" && two zero3 --set=args.deepspeed=ds_config_zero3.json)
check zero3 ref_warmup_lr "engine zero3 on cpu, world 2" "ZeRO stage 3:" \
  'zero_optimization.reduce_bucket_size = "auto": left unset' \
  'device = "cpu": kept; on a CPU-only run'

# FSDP as the FSDP guide asks: fsdp=True and the config file.
one ref_plain
two fsdp --set=args.fsdp=true --set=args.fsdp_config="$samples/fsdp_config.json"
check fsdp ref_plain "engine fsdp2 on cpu, world 2" "FullyShard: 3 groups (2 units + root)"

# accelerator_config: gradient_accumulation_kwargs.num_steps 2 under the default DDP.
one ref_accumulate --set=args.gradient_accumulation_steps=2
two accelerator --set=args.accelerator_config="$samples/accelerator_config.json"
check accelerator ref_accumulate "engine ddp on cpu, world 2"
echo "hf_json_configs: 4 samples ran unchanged on 2 processes, 0 refused, 0 skipped"
echo PASS
