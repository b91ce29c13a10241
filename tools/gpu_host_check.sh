#!/usr/bin/env bash
# Builds the project with CMake on a GPU host (pip LibTorch with CUDA + NCCL; Debian's Abseil,
# glog, gflags and libunwind .debs extracted from .debs/ into a prefix, as GPU_HOST.md says),
# runs the CTest suite, then the GPU measurements. Logs go to $OUT (or /tmp/gpu_out).
#   NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 tools/gpu_host_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
final="${OUT:-/tmp/gpu_out}"
out=/tmp/cpptrain_gpu_logs
mkdir -p "$out" "$final"
trap 'cp "$out/summary.txt" "$final/" 2>/dev/null; tar czf "$final/logs.tgz" -C "$out" .' EXIT
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
prefix=/tmp/cpptrain_prefix
mkdir -p "$prefix"
for f in .debs/*.deb; do dpkg -x "$f" "$prefix"; done
export LD_LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())')
echo "gpus: $gpus; $(python3 -c 'import torch; print(torch.__version__)')" | tee "$out/env.txt"
nvidia-smi topo -m >>"$out/env.txt" 2>&1

build=/tmp/cpptrain_build
start=$SECONDS
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)');$prefix/usr" \
  -DCMAKE_MODULE_PATH="$prefix/usr/share/glog/cmake" -DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
  >"$out/build.log" 2>&1 && cmake --build "$build" -j "$(nproc)" >>"$out/build.log" 2>&1
echo "build exit $? in $((SECONDS - start)) s" | tee -a "$out/summary.txt"
(cd "$build" && ctest -j 8 --output-on-failure --timeout 300 >"$out/ctest.log" 2>&1)
grep -E "tests passed|FAILED|Failed|checks passed|CUDA host" "$out/ctest.log" | tail -12 | tee -a "$out/summary.txt"

bin="$build"
[[ -x "$build/tools/train" ]] || bin="$build/bin"
find "$build" -maxdepth 3 -type f -name train -perm -u+x | head -1 >>"$out/summary.txt"
train=$(find "$build" -maxdepth 3 -type f -name train -perm -u+x | head -1)
bench=$(find "$build" -maxdepth 3 -type f -name bench -perm -u+x | head -1)
launch=$(find "$build" -maxdepth 3 -type f -name launch -perm -u+x | head -1)
comm=$(find "$build" -maxdepth 3 -type f -name comm_bench -perm -u+x | head -1)

# The NCCL checks again, with their output (CTest shows output only for failures).
bash tests/distributed/collectives_test.sh "$build/tools/launch" \
  "$build/tests/distributed/collectives_check" >"$out/nccl_checks.log" 2>&1
echo "nccl checks exit $?: $(grep -c 'checks passed' "$out/nccl_checks.log") ranks passed" | tee -a "$out/summary.txt"
grep "checks passed" "$out/nccl_checks.log" | tee -a "$out/summary.txt"

# BENCH=0 stops after the build and the test suite. RUNS picks the measurements (default all):
#   demo   the demo on one GPU            ddp    tools/bench --engine=ddp beside PyTorch DDP
#   comm   comm_bench beside torch.distributed (256 MiB)
#   fsdp2  tools/bench --engine=fsdp2 beside PyTorch fully_shard, and without collectives
[[ "${BENCH:-1}" == 0 ]] && exit 0
runs=" ${RUNS:-demo ddp comm fsdp2} "
want() { [[ "$runs" == *" $1 "* ]]; }

if want demo; then
  timeout 120 "$train" --config=tools/demo.textproto --set=args.output_dir=/tmp/demo_gpu \
    --set=args.bf16=true >"$out/demo_gpu.log" 2>&1
  echo "demo on GPU exit $?: $(tail -1 "$out/demo_gpu.log")" | tee -a "$out/summary.txt"
fi

run() {  # name, command...
  local name=$1; shift
  timeout 240 "$@" >"$out/$name.log" 2>&1
  echo "$name exit $?: $(grep -h '^{\|\] {' "$out/$name.log" | grep -v metrics_log | tail -3)" | tee -a "$out/summary.txt"
}
for n in 1 2 4; do
  (( n > gpus )) && continue
  if want ddp; then
    run "bench_ddp_$n" "$launch" --nproc_per_node=$n --master_port=0 "$bench" --engine=ddp
    run "torch_ddp_$n" torchrun --standalone --nproc_per_node $n tools/bench_torch.py --engine ddp
    (( n > 1 )) && run "bench_ddp_nocomm_$n" "$launch" --nproc_per_node=$n --master_port=0 "$bench" \
      --engine=ddp --skip_collectives
  fi
  if want comm && (( n > 1 )); then
    run "comm_$n" "$launch" --nproc_per_node=$n --master_port=0 "$comm" --device=cuda \
      --min_bytes=268435456 --max_bytes=268435456 --collectives=all_gather,reduce_scatter,all_reduce
    run "torch_comm_$n" torchrun --standalone --nproc_per_node $n tools/comm_bench_torch.py --bytes 268435456
  fi
  if want fsdp2; then
    run "bench_fsdp2_$n" "$launch" --nproc_per_node=$n --master_port=0 "$bench" --engine=fsdp2
    run "torch_fsdp2_$n" torchrun --standalone --nproc_per_node $n tools/bench_torch.py --engine fsdp2
    (( n > 1 )) && run "bench_fsdp2_nocomm_$n" "$launch" --nproc_per_node=$n --master_port=0 "$bench" \
      --engine=fsdp2 --skip_collectives
  fi
done
