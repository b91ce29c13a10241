#!/usr/bin/env bash
# Builds the project with CMake on a GPU host (pip LibTorch with CUDA + NCCL; Debian's Abseil,
# glog, gflags and libunwind .debs extracted from .debs/ into a prefix, as GPU_HOST.md says),
# runs the CTest suite, then the GPU measurements. Logs go to $OUT (or /tmp/gpu_out).
#   NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 tools/gpu_host_check.sh
#   TESTS=0 RUNS="local ddp fsdp2" tools/gpu_host_check.sh   # measurements only (see RUNS below)
# LOG_DIR (default /tmp/cpptrain_gpu_logs; $OUT/logs keeps them if the call is cut) and
# BUILD_DIR (default /tmp/cpptrain_build) move the logs and the build; CTEST_ARGS is added to
# the first CTest run (e.g. '-E ^tests_distributed_'); SHARED_DELAYS lists the staged delays and
# SHARED_CTEST_ARGS narrows those runs (e.g. '-E stopped_rank').
set -uo pipefail
cd "$(dirname "$0")/.."
final="${OUT:-/tmp/gpu_out}"
out=${LOG_DIR:-/tmp/cpptrain_gpu_logs}
summary="$out/summary.txt"
mkdir -p "$out" "$final"
trap 'cp "$summary" "$final/" 2>/dev/null; tar czf "$final/logs.tgz" -C "$out" .' EXIT
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
prefix=/tmp/cpptrain_prefix
mkdir -p "$prefix"
for f in .debs/*.deb; do dpkg -x "$f" "$prefix"; done
export LD_LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())')
echo "gpus: $gpus; $(python3 -c 'import torch; print(torch.__version__)')" | tee "$out/env.txt"
nvidia-smi topo -m >>"$out/env.txt" 2>&1

build=${BUILD_DIR:-/tmp/cpptrain_build}
start=$SECONDS
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)');$prefix/usr" \
  -DCMAKE_MODULE_PATH="$prefix/usr/share/glog/cmake" -DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
  >"$out/build.log" 2>&1 && cmake --build "$build" -j "$(nproc)" -- -k 0 >>"$out/build.log" 2>&1
echo "build exit $? in $((SECONDS - start)) s" | tee -a "$summary"
if [[ "${TESTS:-1}" != 0 ]]; then
  (cd "$build" && ctest -j 8 --output-on-failure --timeout 300 ${CTEST_ARGS:-} >"$out/ctest.log" 2>&1)
  grep -E "tests passed|FAILED|Failed|checks passed|CUDA host" "$out/ctest.log" | tail -12 | tee -a "$summary"
fi

bin="$build"
[[ -x "$build/tools/train" ]] || bin="$build/bin"
find "$build" -maxdepth 3 -type f -name train -perm -u+x | head -1 >>"$summary"
train=$(find "$build" -maxdepth 3 -type f -name train -perm -u+x | head -1)
bench=$(find "$build" -maxdepth 3 -type f -name bench -perm -u+x | head -1)
launch=$(find "$build" -maxdepth 3 -type f -name launch -perm -u+x | head -1)
comm=$(find "$build" -maxdepth 3 -type f -name comm_bench -perm -u+x | head -1)

# The NCCL checks again, with their output (CTest shows output only for failures).
if [[ "${TESTS:-1}" != 0 ]]; then
  bash tests/distributed/collectives_test.sh "$build/tools/launch" \
    "$build/tests/distributed/collectives_check" >"$out/nccl_checks.log" 2>&1
  echo "nccl checks exit $?: $(grep -c 'checks passed' "$out/nccl_checks.log") ranks passed" | tee -a "$summary"
  grep "checks passed" "$out/nccl_checks.log" | tee -a "$summary"
fi

# The multi-process suites again with CPPTRAIN_SHARED_GPU=1: every variant's CUDA path with
# 2 to 4 processes sharing this host's GPUs, collectives staged through Gloo or the store
# (tests/distributed/variants.sh), once plain and once with each staged result delayed by
# 200 us (SHARED_GPU=0 skips this).
if [[ "${TESTS:-1}" != 0 && "${SHARED_GPU:-1}" != 0 ]]; then
  for delay in ${SHARED_DELAYS:-0 200}; do
    (cd "$build" && CPPTRAIN_SHARED_GPU=1 CPPTRAIN_STAGED_DELAY_US=$delay \
      ctest -j "${SHARED_JOBS:-4}" --output-on-failure --timeout 600 -R '^tests_distributed_' \
        ${SHARED_CTEST_ARGS:-} >"$out/shared_gpu_delay$delay.log" 2>&1)
    echo "shared-GPU suites (delay $delay us) exit $?:" \
      "$(grep -E 'tests passed' "$out/shared_gpu_delay$delay.log" | tail -1)" | tee -a "$summary"
    grep -hE "^variants:|SKIPPED:|FAIL:" "$build"/Testing/Temporary/LastTest.log 2>/dev/null |
      sort | uniq -c | tee "$out/shared_gpu_delay$delay.variants" | tail -20 >>"$summary"
  done
fi

# BENCH=0 stops after the build and the test suite; TESTS=0 skips the test suite (a rerun of
# measurements on a machine that built and tested already: the build is then incremental).
# RUNS picks the measurements (default all). Training runs go through tools/bench_compare.py:
# ours and PyTorch's side REPEATS times each (default 3), interleaved, from one init directory
# (the model and token ids, written by the first run), checked to train the same thing (first
# and last loss within 1e-3), medians printed, every JSON line appended to
# $OUT/<date>-<gpus>x<gpu>.jsonl (meant for docs/benchmarks/). STEPS and WARMUP (default 15 and
# 3, one run about 20-40 s on an H200 with start-up) keep RUNS="local ddp fsdp2" on 1 GPU
# (18 runs) within about 8 minutes.
#   demo     the demo on one GPU
#   local    tools/bench --engine=local beside PyTorch without a wrapper (1 GPU)
#   ddp      --engine=ddp beside PyTorch DDP; on 2+ GPUs also ours without collectives
#   fsdp2    --engine=fsdp2 beside PyTorch fully_shard; on 2+ GPUs also ours without collectives
#   compile  ours local (1 GPU) and ddp beside PyTorch's with torch.compile
#   compile_fsdp2  fsdp2 beside PyTorch's fully_shard with torch.compile of each layer
#   mb8      ddp and fsdp2 at micro-batch 8
#   mb8_local  local at micro-batch 8 (1 GPU)
#   comm     comm_bench beside torch.distributed (256 MiB)
[[ "${BENCH:-1}" == 0 ]] && exit 0
runs=" ${RUNS:-demo local ddp fsdp2 compile compile_fsdp2 mb8 mb8_local comm} "
want() { [[ "$runs" == *" $1 "* ]]; }

if want demo; then
  timeout 120 "$train" --config=tools/demo.textproto --set=args.output_dir=/tmp/demo_gpu \
    --set=args.bf16=true >"$out/demo_gpu.log" 2>&1
  echo "demo on GPU exit $?: $(tail -1 "$out/demo_gpu.log")" | tee -a "$summary"
fi

run() {  # name, command...
  local name=$1; shift
  timeout 240 "$@" >"$out/$name.log" 2>&1
  echo "$name exit $?: $(grep -h '^{\|\] {' "$out/$name.log" | grep -v metrics_log | tail -3)" | tee -a "$summary"
}
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | awk '{print tolower($NF)}')
jsonl="$final/$(date -u +%F)-${gpus}x${gpu_name}.jsonl"
init_dir=/tmp/cpptrain_bench_init_qwen3-0.6b
steps=${STEPS:-15} warmup=${WARMUP:-3} repeats=${REPEATS:-3}
compare() {  # name, nproc, bench_compare flags...
  local name=$1 n=$2; shift 2
  timeout 1500 python3 tools/bench_compare.py --launch "$launch" --bench "$bench" --nproc "$n" \
    --init_dir "$init_dir" --jsonl "$jsonl" --log_dir "$out/$name" --runs "$repeats" \
    --steps "$steps" --warmup "$warmup" --timeout 300 "$@" >"$out/$name.log" 2>&1
  local code=$?
  echo "$name exit $code:" | tee -a "$summary"
  grep -E '^[0-9]+ process|^\| (ours|torch) |^ours / torch|^largest|^bench_compare|^  .* differ' "$out/$name.log" |
    tee -a "$summary"
}
for n in 1 2 4; do
  (( n > gpus )) && continue
  if want local && (( n == 1 )); then
    compare "local_$n" $n --engine local
  fi
  if want ddp; then
    compare "ddp_$n" $n --engine ddp
    (( n > 1 )) && run "bench_ddp_nocomm_$n" "$launch" --nproc_per_node=$n --master_port=0 "$bench" \
      --engine=ddp --skip_collectives --init_dir="$init_dir" --steps="$steps" --warmup="$warmup"
  fi
  if want fsdp2; then
    compare "fsdp2_$n" $n --engine fsdp2
    (( n > 1 )) && run "bench_fsdp2_nocomm_$n" "$launch" --nproc_per_node=$n --master_port=0 "$bench" \
      --engine=fsdp2 --skip_collectives --init_dir="$init_dir" --steps="$steps" --warmup="$warmup"
  fi
  if want compile; then
    (( n == 1 )) && compare "compile_local_$n" $n --engine local --torch_compile
    compare "compile_ddp_$n" $n --engine ddp --torch_compile
  fi
  want compile_fsdp2 && compare "compile_fsdp2_$n" $n --engine fsdp2 --torch_compile
  if want mb8; then
    compare "mb8_ddp_$n" $n --engine ddp --micro_batch 8
    compare "mb8_fsdp2_$n" $n --engine fsdp2 --micro_batch 8
  fi
  want mb8_local && (( n == 1 )) && compare "mb8_local_$n" $n --engine local --micro_batch 8
  if want comm && (( n > 1 )); then
    run "comm_$n" "$launch" --nproc_per_node=$n --master_port=0 "$comm" --device=cuda \
      --min_bytes=268435456 --max_bytes=268435456 --collectives=all_gather,reduce_scatter,all_reduce
    run "torch_comm_$n" torchrun --standalone --nproc_per_node $n tools/comm_bench_torch.py --bytes 268435456
  fi
done
