#!/usr/bin/env bash
# Under a launcher of several processes, a job that selects no engine trains with DDP, as
# Hugging Face's Trainer does (before: every rank trained its own single-process copy into the
# same output_dir), and says so in one line; selecting the local engine there is an error that
# names WORLD_SIZE and the fix. The demo job (no engine in its file) on 2 processes over Gloo.
set -euo pipefail
train="$1"
config="$2"
launch="$3"
fail() { echo "FAIL: $1"; [[ -n "${2:-}" ]] && cat "$2"; exit 1; }
common=(--config="$config" --set=args.max_steps=4 --set=args.logging_steps=1
        --set=args.eval_strategy=NO --set=args.save_strategy=NO --set=args.use_cpu=true)

# The losses metrics.jsonl of output_dir $1 holds, one a line.
losses() { grep '"loss":' "$1/metrics.jsonl" | sed -E 's/.*"loss":([^,}]*).*/\1/'; }

# No engine: DDP, announced once (rank 0).
out="$TEST_TMPDIR/default"
timeout 300 "$launch" --nproc_per_node=2 --master_port=0 "$train" "${common[@]}" \
  --set="args.output_dir=$out" >/dev/null 2>"$TEST_TMPDIR/default.log" ||
  fail "the default engine under 2 processes did not train" "$TEST_TMPDIR/default.log"
said=$(grep -c "No engine selected and WORLD_SIZE=2 (from torchrun): training with DDP" \
  "$TEST_TMPDIR/default.log" || true)
[[ "$said" -eq 1 ]] || fail "expected one line saying the default is DDP, saw $said" "$TEST_TMPDIR/default.log"
grep "No engine selected" "$TEST_TMPDIR/default.log"
grep -q "engine ddp on cpu, world 2" "$TEST_TMPDIR/default.log" ||
  fail "the run did not train with engine ddp over world 2" "$TEST_TMPDIR/default.log"

# The same job with `ddp {}` selected: the same losses at every step (one DDP run, both ranks'
# gradients averaged), and one writer of metrics.jsonl (4 steps, 4 lines; two single-process
# copies would write 8).
explicit="$TEST_TMPDIR/explicit"
timeout 300 "$launch" --nproc_per_node=2 --master_port=0 "$train" "${common[@]}" \
  '--set=args.ddp={}' --set="args.output_dir=$explicit" >/dev/null 2>"$TEST_TMPDIR/explicit.log" ||
  fail "the explicit ddp run failed" "$TEST_TMPDIR/explicit.log"
[[ "$(losses "$out" | wc -l)" -eq 4 ]] || fail "metrics.jsonl has $(losses "$out" | wc -l) losses, not 4" "$out/metrics.jsonl"
[[ "$(losses "$out")" == "$(losses "$explicit")" ]] ||
  fail "the default run's losses $(losses "$out" | tr '\n' ' ') differ from ddp's $(losses "$explicit" | tr '\n' ' ')"
echo "default and ddp losses: $(losses "$out" | tr '\n' ' ')"

# The local engine chosen explicitly under WORLD_SIZE=2: an error, no training.
rc=0; timeout 300 "$launch" --nproc_per_node=2 --master_port=0 "$train" "${common[@]}" \
  '--set=args.local={}' --set="args.output_dir=$TEST_TMPDIR/local" >/dev/null \
  2>"$TEST_TMPDIR/local.log" || rc=$?
[[ "$rc" -ne 0 ]] || fail "the local engine under WORLD_SIZE=2 exited 0" "$TEST_TMPDIR/local.log"
# Every rank refuses, but the launcher stops the others once the first has exited, so the
# others may be gone before they print: one rank's line is what is certain.
grep -q "^\[rank [01]\].*the training arguments select the \`local\` engine but WORLD_SIZE=2 .*Remove \`local { ... }\`" \
  "$TEST_TMPDIR/local.log" || fail "no rank named WORLD_SIZE and the fix" "$TEST_TMPDIR/local.log"
[[ ! -e "$TEST_TMPDIR/local/metrics.jsonl" ]] || fail "the refused local run logged training steps"
echo "local: exit $rc, $(grep -o 'the training arguments select the `local` engine.*' "$TEST_TMPDIR/local.log" | sort -u | head -1)"

# Hugging Face's flat ddp_* names reach that default DDP: ddp_bucket_cap_mb=0.01 splits the
# demo model's gradients into many buckets; ddp_backend must name the device's communicator.
out="$TEST_TMPDIR/flat"
timeout 300 "$launch" --nproc_per_node=2 --master_port=0 "$train" "${common[@]}" \
  --set=args.max_steps=1 --set=args.ddp_bucket_cap_mb=0.01 --set=args.ddp_backend=gloo \
  --set="args.output_dir=$out" >/dev/null 2>"$TEST_TMPDIR/flat.log" ||
  fail "the run with ddp_bucket_cap_mb and ddp_backend=gloo failed" "$TEST_TMPDIR/flat.log"
# CPU tensors move over Gloo, or through the store where LibTorch ships no Gloo (pip's).
grep -Eq "buckets of up to 0.01 MiB over 2 ranks \((gloo|store)\)" "$TEST_TMPDIR/flat.log" ||
  fail "ddp_bucket_cap_mb=0.01 did not reach the DDP engine" "$TEST_TMPDIR/flat.log"
grep -o "DDP: .*" "$TEST_TMPDIR/flat.log"
rc=0; "$train" "${common[@]}" --set=args.ddp_backend=nccl --set="args.output_dir=$TEST_TMPDIR/nccl" \
  >/dev/null 2>"$TEST_TMPDIR/nccl.log" || rc=$?
[[ "$rc" -ne 0 ]] && grep -q 'ddp_backend="nccl" but use_cpu=true' "$TEST_TMPDIR/nccl.log" ||
  fail "ddp_backend=nccl with use_cpu=true was not refused (exit $rc)" "$TEST_TMPDIR/nccl.log"
echo "nccl on the CPU: exit $rc, $(grep -o 'ddp_backend="nccl" but use_cpu=true[^;]*' "$TEST_TMPDIR/nccl.log" | head -1)"
# On a host without GPUs DDP runs on the CPU over Gloo even without use_cpu, so
# ddp_backend=nccl is refused when the engine is made, naming the device.
if ! command -v nvidia-smi >/dev/null 2>&1; then
  rc=0; timeout 300 "$launch" --nproc_per_node=2 --master_port=0 "$train" --config="$config" \
    --set=args.max_steps=1 --set=args.eval_strategy=NO --set=args.save_strategy=NO \
    --set=args.ddp_backend=nccl --set="args.output_dir=$TEST_TMPDIR/nccl_cpu" >/dev/null \
    2>"$TEST_TMPDIR/nccl_cpu.log" || rc=$?
  [[ "$rc" -ne 0 ]] && grep -q 'ddp_backend="nccl" but this rank trains on cpu, whose communicator is gloo' \
    "$TEST_TMPDIR/nccl_cpu.log" || fail "ddp_backend=nccl on a CPU host was not refused (exit $rc)" "$TEST_TMPDIR/nccl_cpu.log"
  echo "nccl on a CPU host: exit $rc"
fi
echo PASS
