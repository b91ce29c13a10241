#!/usr/bin/env bash
# End to end, our side of the bench verification (tools/bench_compare.py compares it with
# PyTorch's; that needs torch in Python and is run by hand: docs/BENCHMARKS.md): on the tiny
# model in fp32 on the CPU, tools/bench --init_dir writes the model and token ids once, later
# runs load them and get the same first and last loss (also with the fused loss in smaller
# chunks, --loss_chunk_rows, and with the MLP product recomputed, --recompute_mlp_product);
# DDP, FSDP2 and ZeRO 1/2/3 on 2 ranks get the same losses as each other; a model of another
# shape is refused. On the CPU also on a CUDA host (--use_cpu).
set -euo pipefail
launch="$1"
bench="$2"
init="${TEST_TMPDIR}/init"
log="${TEST_TMPDIR}/bench.log"

# Prints the JSON line of one run; the remaining arguments go to tools/bench.
bench_json() {
  local nproc=$1; shift
  "$launch" --nproc_per_node="$nproc" --master_port=0 "$bench" --model=tiny --bf16=false \
    --use_cpu --seq_len=16 --micro_batch=2 --warmup=1 --steps=3 --init_dir="$init" "$@" \
    >"$log" 2>&1 ||
    { cat "$log"; echo "FAIL: tools/bench $* exited non-zero" >&2; exit 1; }
  grep -o '{"model".*' "$log" | tail -1
}
field() { sed -E "s/.*\"$1\":([^,}]*).*/\1/" <<<"$2"; }
losses() { echo "$(field first_loss "$1") $(field last_loss "$1") $(field tokens_fingerprint "$1")"; }
# fp32 on the CPU: engines and chunkings agree to a few ulps, so compare to 6 significant digits.
round() { awk '{ printf "%.6g %.6g %s", $1, $2, $3 }' <<<"$1"; }
# expect_refused MESSAGE ARGS...: tools/bench on one rank with ARGS must fail, and its log must
# match MESSAGE (a grep pattern).
expect_refused() {
  local message="$1"
  shift
  if "$launch" --nproc_per_node=1 --master_port=0 "$bench" --bf16=false --seq_len=16 \
    --micro_batch=2 --init_dir="$init" "$@" >"$log" 2>&1; then
    echo "FAIL: tools/bench $* was accepted"; exit 1
  fi
  grep -q -- "$message" "$log" ||
    { cat "$log"; echo "FAIL: the refusal of $* does not say: $message"; exit 1; }
}

first=$(bench_json 1 --engine=local)
for f in config.json model.safetensors tokens-markov-w1-ga1-mb2-seq16-steps4-rank0.safetensors; do
  [[ -s "$init/$f" ]] || { echo "FAIL: the first run left no $init/$f"; exit 1; }
done
[[ "$(field first_loss "$first")" =~ ^[0-9.]+$ ]] ||
  { echo "FAIL: no finite first_loss in $first"; exit 1; }
[[ "$(field peak_memory_gib "$first")" == null && "$(field peak_by_phase_gib "$first")" == null ]] ||
  { echo "FAIL: peak memory (and by phase) on the CPU should be null: $first"; exit 1; }
# The process's own peak resident set: LibTorch alone is far more than 0.05 GiB.
awk -v gib="$(field host_peak_gib "$first")" 'BEGIN { exit !(gib > 0.05 && gib < 24) }' ||
  { echo "FAIL: host_peak_gib should be the process's peak resident set in GiB: $first"; exit 1; }
again=$(bench_json 1 --engine=local)
echo "written: $(losses "$first"); loaded: $(losses "$again")"
[[ "$(losses "$first")" == "$(losses "$again")" ]] ||
  { echo "FAIL: the run from the written directory differs from the one that wrote it"; exit 1; }

# The fused head + loss in chunks of 5 of the 32 rows trains as the default (one chunk) does.
chunked=$(bench_json 1 --engine=local --loss_chunk_rows=5)
[[ "$(field loss_chunk_rows "$chunked")" == 5 ]] ||
  { echo "FAIL: the JSON line should record loss_chunk_rows 5: $chunked"; exit 1; }
echo "loss chunks of 5 rows: $(losses "$chunked")"
[[ "$(round "$(losses "$chunked")")" == "$(round "$(losses "$first")")" ]] ||
  { echo "FAIL: --loss_chunk_rows=5 trained differently from the default"; exit 1; }
expect_refused "--loss_chunk_rows=.*is negative" --model=tiny --use_cpu --warmup=1 --steps=1 \
  --loss_chunk_rows=-1
expect_refused "--loss_chunk_rows=.*which --fused_kernels=false turns off" --model=tiny --use_cpu \
  --warmup=1 --steps=1 --loss_chunk_rows=5 --fused_kernels=false

# The MLP that writes its product again in the backward trains as the one that keeps it.
recomputed=$(bench_json 1 --engine=local --recompute_mlp_product)
[[ "$(field recompute_mlp_product "$recomputed")" == true ]] ||
  { echo "FAIL: the JSON line should record recompute_mlp_product true: $recomputed"; exit 1; }
echo "MLP product recomputed: $(losses "$recomputed")"
[[ "$(round "$(losses "$recomputed")")" == "$(round "$(losses "$first")")" ]] ||
  { echo "FAIL: --recompute_mlp_product trained differently from the default"; exit 1; }
expect_refused "--recompute_mlp_product changes the fused MLP" --model=tiny --use_cpu \
  --warmup=1 --steps=1 --recompute_mlp_product --fused_kernels=false

ddp=$(bench_json 2 --engine=ddp)
fsdp2=$(bench_json 2 --engine=fsdp2)
echo "2 ranks: ddp $(losses "$ddp"); fsdp2 $(losses "$fsdp2")"
[[ -s "$init/tokens-markov-w2-ga1-mb2-seq16-steps4-rank1.safetensors" ]] ||
  { echo "FAIL: rank 1 wrote no token ids"; exit 1; }
[[ "$(round "$(losses "$ddp")")" == "$(round "$(losses "$fsdp2")")" ]] ||
  { echo "FAIL: DDP and FSDP2 trained differently from the same directory"; exit 1; }
for stage in 1 2 3; do
  zero=$(bench_json 2 --engine=zero --zero_stage=$stage)
  echo "2 ranks: zero$stage $(losses "$zero") ($(field engine "$zero"))"
  [[ "$(field engine "$zero")" == "\"zero$stage\"" ]] ||
    { echo "FAIL: the JSON line should name zero$stage: $zero"; exit 1; }
  [[ "$(round "$(losses "$ddp")")" == "$(round "$(losses "$zero")")" ]] ||
    { echo "FAIL: DDP and ZeRO-$stage trained differently from the same directory"; exit 1; }
done

# The recomputed MLP product where the parameters are freed after the forward and gathered
# again for the backward.
for engine in "--engine=fsdp2" "--engine=zero --zero_stage=3"; do
  # shellcheck disable=SC2086  # the engine's flags are two words for ZeRO-3
  recomputed=$(bench_json 2 $engine --recompute_mlp_product)
  echo "2 ranks, $engine, product recomputed: $(losses "$recomputed")"
  [[ "$(round "$(losses "$ddp")")" == "$(round "$(losses "$recomputed")")" ]] ||
    { echo "FAIL: $engine with --recompute_mlp_product trained differently from DDP"; exit 1; }
done
expect_refused "--init_dir=$init holds another model than --model=demo" --model=demo \
  --warmup=1 --steps=1

# --cuda_graphs times only replays: a run whose timed steps were not all replays fails, naming
# --warmup (on the CPU nothing is captured, so every timed step is eager).
expect_refused \
  "--cuda_graphs: 0 replays over --warmup=1 and --steps=3 steps.*give --warmup of at least 4" \
  --model=tiny --use_cpu --warmup=1 --steps=3 --cuda_graphs
echo "cuda_graphs without replays: refused"
echo PASS
