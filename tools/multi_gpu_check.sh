#!/usr/bin/env bash
# Everything the project has not yet run on several GPUs, in one unattended command, for the
# first multi-GPU machine (2, 4 or 8 GPUs of one host; never run yet: docs/ARCHITECTURE.md,
# "What the tests run where"). Each stage writes its results to $OUT (or /tmp/gpu_out) as it
# finishes, so a call cut short keeps what ran; the summary is $OUT/summary.txt.
#   NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
#     CPPTRAIN_COMMIT=<hash> tools/multi_gpu_check.sh
# Stages (STAGES picks some, default all, in this order):
#   tests    tools/gpu_host_check.sh BENCH=0: the CMake build and the CTest suite, whose
#            multi-process scripts run every variant over NCCL when the host has as many GPUs
#            as the variant has ranks (DDP, FSDP1 in every strategy, FSDP2, HSDP 2 x 2, ZeRO
#            1/2/3 with offload, the checkpoint chain, the fault cases), then the NCCL
#            collective checks on all GPUs; the closing "variants: N ran (K on CUDA ...)"
#            lines say how many ran over NCCL.
#   engines  each engine beside its PyTorch counterpart (tools/bench_compare.py: same weights
#            and tokens, RUNS=3 runs a side, the checks of docs/BENCHMARKS.md) at 1, 2, 4 and
#            8 GPUs (those the host has): DDP vs DDP, FSDP1 vs FullyShardedDataParallel, FSDP2
#            vs fully_shard, ZeRO 1/2/3 vs DDP + ZeroRedundancyOptimizer / fully_shard, PyTorch
#            each in its strongest configuration of SWEEP (bench_compare --torch_sweep).
#   deepspeed  ZeRO 1/2/3 vs DeepSpeed (tools/gpu_zero_check.sh's install of the carried
#            .wheels/) at every GPU count.
#   comm     tools/comm_bench beside torch.distributed: all-gather, reduce-scatter, all-reduce
#            bus bandwidth at every GPU count.
#   scaling  from the raw lines: tokens/s per GPU at N over the same engine's at 1 GPU
#            (scaling efficiency), per engine and side, and the exposed communication
#            (ours with --skip_collectives against ours with collectives).
set -uo pipefail
cd "$(dirname "$0")/.."
final="${OUT:-/tmp/gpu_out}"
out=/tmp/cpptrain_multi_gpu_logs
summary="$final/summary.txt"
mkdir -p "$out" "$final"
trap 'tar czf "$final/multi_gpu_logs.tgz" -C "$out" . 2>/dev/null' EXIT
trap 'exit 143' TERM
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
stages=" ${STAGES:-tests engines deepspeed comm scaling} "
want() { [[ "$stages" == *" $1 "* ]]; }
gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())')
echo "multi_gpu_check: $gpus GPUs, stages:$stages" | tee -a "$summary"
((gpus >= 2)) || echo "only $gpus GPU: every multi-rank variant runs on the CPU" | tee -a "$summary"
counts=""
for n in 1 2 4 8; do ((n <= gpus)) && counts="$counts $n"; done

if want tests; then
  OUT="$out/tests" BENCH=0 bash tools/gpu_host_check.sh >"$out/tests.log" 2>&1
  echo "tests exit $?:" | tee -a "$summary"
  grep -hE "build exit|tests passed|FAILED|variants:|checks passed" "$out/tests/summary.txt" \
    "$out/tests.log" 2>/dev/null | sort -u | tee -a "$summary"
fi

build=/tmp/cpptrain_build  # gpu_host_check.sh's
find_bin() { find "$build" -maxdepth 3 -type f -name "$1" -perm -u+x | head -1; }
bench=$(find_bin bench)
launch=$(find_bin launch)
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | awk '{print tolower($NF)}')
jsonl="$final/$(date -u +%F)-${gpus}x${gpu_name}-multi.jsonl"
sweep="${SWEEP:-compiled-model,compiled-full,liger-compiled}"
compare() {  # name, processes, bench_compare flags...
  local name=$1 n=$2
  shift 2
  timeout "${COMPARE_TIMEOUT:-1800}" python3 tools/bench_compare.py --launch "$launch" \
    --bench "$bench" --nproc "$n" --init_dir /tmp/cpptrain_bench_init_qwen3-0.6b --jsonl "$jsonl" \
    --log_dir "$out/$name" --runs "${RUNS:-3}" --steps "${STEPS:-12}" --warmup "${WARMUP:-3}" \
    --timeout 600 "$@" >"$out/$name.log" 2>&1
  echo "$name exit $?:" | tee -a "$summary"
  grep -E 'fastest|^\| (ours|torch) |^ours / |^bench_compare|^  .* differ' "$out/$name.log" |
    tee -a "$summary"
}

if want engines && [[ -n "$bench" ]]; then
  for n in $counts; do
    compare "ddp_$n" "$n" --engine ddp --torch_sweep "$sweep"
    compare "fsdp1_$n" "$n" --engine fsdp1 --torch_config eager
    compare "fsdp2_$n" "$n" --engine fsdp2 --torch_sweep "$sweep"
    compare "zero1_$n" "$n" --engine zero --zero_stage 1 --torch_engine zero_redundancy \
      --torch_config compiled-model
    compare "zero2_$n" "$n" --engine zero --zero_stage 2 --torch_engine zero_redundancy \
      --torch_config compiled-model
    compare "zero3_$n" "$n" --engine zero --zero_stage 3 --torch_engine fsdp2 \
      --torch_config compiled-model
    if ((n > 1)); then
      for engine in ddp fsdp2; do  # the exposed communication: ours without collectives
        timeout 600 "$launch" --nproc_per_node="$n" --master_port=0 "$bench" \
          --engine="$engine" --skip_collectives --init_dir=/tmp/cpptrain_bench_init_qwen3-0.6b \
          --steps="${STEPS:-12}" --warmup="${WARMUP:-3}" >"$out/nocomm_${engine}_$n.log" 2>&1
        grep -o '{"model".*' "$out/nocomm_${engine}_$n.log" | tail -1 >>"$jsonl"
      done
    fi
  done
fi

if want deepspeed && compgen -G ".wheels/*.whl" >/dev/null; then
  for n in $counts; do
    OUT="$out/deepspeed_$n" TESTS=0 NPROC="$n" bash tools/gpu_zero_check.sh \
      >"$out/deepspeed_$n.log" 2>&1
    echo "deepspeed at $n GPUs exit $?" | tee -a "$summary"
    cat "$out/deepspeed_$n"/*.jsonl >>"$jsonl" 2>/dev/null
  done
elif want deepspeed; then
  echo "deepspeed: SKIPPED, no .wheels/ carried (docs/BENCHMARKS.md says how to build them)" |
    tee -a "$summary"
fi

comm=$(find_bin comm_bench)
if want comm && [[ -n "$comm" ]]; then
  for n in $counts; do
    ((n > 1)) || continue
    timeout 600 "$launch" --nproc_per_node="$n" --master_port=0 "$comm" --device=cuda \
      --min_bytes=1024 --max_bytes=1073741824 \
      --collectives=all_gather,reduce_scatter,all_reduce >"$out/comm_$n.log" 2>&1
    echo "comm_bench at $n GPUs exit $?" | tee -a "$summary"
    grep -h '^{\|\] {' "$out/comm_$n.log" | sed 's/^\[rank 0\] //' >>"$jsonl"
    timeout 600 torchrun --standalone --nproc_per_node "$n" tools/comm_bench_torch.py \
      --bytes 268435456 >"$out/torch_comm_$n.log" 2>&1
    echo "torch.distributed at $n GPUs exit $?: $(tail -1 "$out/torch_comm_$n.log")" |
      tee -a "$summary"
  done
fi

if want scaling && [[ -s "$jsonl" ]]; then
  python3 - "$jsonl" <<'PY' | tee -a "$summary"
import collections, json, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "tokens_per_s_per_gpu" not in r or r.get("sweep"):
        continue
    side = r.get("side", "ours") + ("-nocomm" if r.get("skip_collectives") else "")
    runs[(r["engine"], side, r["gpus"])].append(r["tokens_per_s_per_gpu"])
print("| engine | side | GPUs | tokens/s per GPU (median) | scaling efficiency vs 1 GPU |")
print("|---|---|---|---|---|")
for (engine, side, n), values in sorted(runs.items()):
    med = statistics.median(values)
    one = runs.get((engine, side.replace("-nocomm", ""), 1))
    eff = f"{med / statistics.median(one):.3f}" if one else "-"
    print(f"| {engine} | {side} | {n} | {med:,.0f} | {eff} |")
PY
fi
