#!/usr/bin/env bash
# The fused-kernel work on one GPU host in one call: builds only what it needs with CMake (as
# tools/gpu_host_check.sh does), runs the kernel tests against their eager references, then
# profiles and times the training step with and without fused kernels (tools/bench
# --profile_steps). Logs go to $OUT (or /tmp/gpu_out); the summary is printed last.
#   NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
#     tools/gpu_kernels_check.sh
#   STEPS=15 WARMUP=5 PROFILE=0 tools/gpu_kernels_check.sh   # timings only
# ENGINES (default "local"), MICRO (default 4) and MODEL (default qwen3-0.6b) pick the timed
# runs; COMPARE (below) the runs beside PyTorch with torch.compile. TESTS=0 skips the kernel
# tests and norm_kernel_bench (a second invocation in the same call). GRAPHS=1 runs ours with
# --cuda_graphs (the step replayed as a CUDA graph) in the timed and compared runs; GRAPHS=both
# times each engine both ways (the compared runs then use graphs).
set -uo pipefail
cd "$(dirname "$0")/.."
final="${OUT:-/tmp/gpu_out}"
out=/tmp/cpptrain_kernel_logs
summary="$out/summary.txt"
mkdir -p "$out" "$final"
trap 'cp "$summary" "$final/" 2>/dev/null; tar czf "$final/kernel_logs.tgz" -C "$out" .' EXIT
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
prefix=/tmp/cpptrain_prefix
mkdir -p "$prefix"
for f in .debs/*.deb; do dpkg -x "$f" "$prefix"; done
export LD_LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
export PATH="/usr/local/cuda/bin:$PATH"

build=/tmp/cpptrain_build
start=$SECONDS
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)');$prefix/usr" \
  -DCMAKE_MODULE_PATH="$prefix/usr/share/glog/cmake" -DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
  >"$out/build.log" 2>&1 &&
  cmake --build "$build" -j "$(nproc)" --target tools_bench tools_launch kernels_fused_ops_test \
    models_decoder_test tools_kernel_profile_test tools_train tools_norm_kernel_bench \
    trainer_cuda_graph_test trainer_step_graph_test engines_grad_utils_test \
    trainer_optimizer_test kernels_cuda_adamw_test engines_working_parameters_test \
    engines_local_local_engine_test >>"$out/build.log" 2>&1
code=$?
grep -E "cpptrain: Gloo|CUDA kernels" "$out/build.log" | tee -a "$summary"
echo "build exit $code in $((SECONDS - start)) s" | tee -a "$summary"
if ((code != 0)); then
  grep -E "error|Error" "$out/build.log" | head -20 | tee -a "$summary"
  exit 1
fi
find_bin() { find "$build" -type f -name "$1" -perm -u+x | head -1; }
kernel_tests="kernels_fused_ops_test models_decoder_test tools_kernel_profile_test
  trainer_cuda_graph_test trainer_step_graph_test engines_grad_utils_test trainer_optimizer_test
  kernels_cuda_adamw_test engines_working_parameters_test engines_local_local_engine_test"
[[ "${TESTS:-1}" == 0 ]] && kernel_tests=""
for test in $kernel_tests; do
  bin=$(find_bin "$test")
  timeout 300 "$bin" >"$out/$test.log" 2>&1
  echo "$test exit $?: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/$test.log" | tr '\n' ' ')" |
    tee -a "$summary"
  grep -E "^\[  FAILED|Failure|error" -A3 "$out/$test.log" | head -30 >>"$summary"
  grep -E "^CudaAdamWStep, " "$out/$test.log" | tee -a "$summary"  # its timing line
done
# The norm kernels against their eager references, timed (tools/norm_kernel_bench_main.cc).
if [[ "${TESTS:-1}" != 0 ]]; then
  timeout 120 "$(find_bin norm_kernel_bench)" --iters=50 >"$out/norm_kernel_bench.log" 2>&1
  echo "norm_kernel_bench exit $?" | tee -a "$summary"
  grep -v '^{' "$out/norm_kernel_bench.log" | tail -15 | tee -a "$summary"
  grep '^{' "$out/norm_kernel_bench.log" >>"$final/norm_kernel_bench.jsonl"
fi

# PARITY=1: the demo job (tools/demo.textproto, 300 steps) on the GPU in bf16, fused kernels
# against the eager path (the fused-kernel issue's loss-parity check: final losses within 1%).
# The job's loss sits on a plateau near 1.52 from about step 150 until the model starts getting
# the digits right (about 1.44), and whether one run gets there by step 300 is chance
# (docs/BENCHMARKS.md), so each side trains once per seed of PARITY_SEEDS (default five) and
# the medians of their final losses are compared; every run's final loss is printed.
if [[ "${PARITY:-0}" == 1 ]]; then
  train=$(find_bin train)
  for seed in ${PARITY_SEEDS:-42 43 44 45 46}; do
    for fused in true false; do
      timeout 300 "$train" --config=tools/demo.textproto --set=args.bf16=true \
        --set=args.fused_kernels=$fused --set=args.seed=$seed \
        --set=args.output_dir=/tmp/parity_${fused}_$seed >"$out/parity_${fused}_$seed.log" 2>&1
      echo "parity fused=$fused seed=$seed exit $?" | tee -a "$summary"
      # One file for all runs (the device returns only so many files), each line tagged.
      python3 -c 'import json, sys
for line in open(sys.argv[1]):
    print(json.dumps({"commit": sys.argv[2], "fused_kernels": sys.argv[3] == "true",
                      "seed": int(sys.argv[4]), **json.loads(line)}))' \
        /tmp/parity_${fused}_$seed/metrics.jsonl "${CPPTRAIN_COMMIT:-unknown}" $fused $seed \
        >>"$final/parity.jsonl"
    done
  done
  python3 - "$final" ${PARITY_SEEDS:-42 43 44 45 46} <<'PY' | tee -a "$summary"
import json, statistics, sys
rows = [json.loads(l) for l in open(f"{sys.argv[1]}/parity.jsonl")]
seeds = sys.argv[2:]
def last(fused, seed, key):
    return [r for r in rows if r["fused_kernels"] == fused and str(r["seed"]) == seed
            and key in r][-1][key]
for key in ("loss", "eval_loss"):
    side = {f: [last(f == "true", s, key) for s in seeds] for f in ("true", "false")}
    fused, eager = statistics.median(side["true"]), statistics.median(side["false"])
    rel = abs(fused - eager) / abs(eager)
    print(f"parity {key}, final, by seed {seeds}: fused {[round(v, 4) for v in side['true']]} "
          f"eager {[round(v, 4) for v in side['false']]}")
    print(f"parity {key}: median fused {fused:.6f} eager {eager:.6f} relative {rel:.2e} "
          f"{'OK' if rel <= 0.01 else 'FAIL'}")
PY
fi
[[ "${BENCH:-1}" == 0 ]] && exit 0

bench=$(find_bin bench)
steps=${STEPS:-12} warmup=${WARMUP:-5}
run_bench() {  # name, flags...
  local name=$1
  shift
  timeout 300 "$bench" --steps="$steps" --warmup="$warmup" --model="${MODEL:-qwen3-0.6b}" "$@" \
    >"$out/$name.log" 2>&1
  local code=$?
  local line
  line=$(grep -h '^{' "$out/$name.log" | tail -1)
  echo "$name exit $code: $(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(d["tokens_per_s"], "tok/s", d["peak_memory_gib"], "GiB", "loss", d["first_loss"], d["last_loss"])' "$line" 2>/dev/null)" |
    tee -a "$summary"
  [[ -n "$line" ]] && echo "$line" >>"$final/bench_runs.jsonl"
  grep '^profile:' "$out/$name.log" >>"$summary"
  ((code != 0)) && tail -5 "$out/$name.log" >>"$summary"
}
graph_modes=false
[[ "${GRAPHS:-0}" == 1 ]] && graph_modes=true
[[ "${GRAPHS:-0}" == both ]] && graph_modes="false true"
for engine in ${ENGINES:-local}; do
  for micro in ${MICRO:-4}; do
    for fused in ${FUSED:-false true}; do
      for graphs in $graph_modes; do
        tag="${engine}_mb${micro}_fused_${fused}_graphs_${graphs}"
        if [[ "${PROFILE:-1}" != 0 ]]; then
          run_bench "profile_$tag" --engine="$engine" --micro_batch="$micro" \
            --fused_kernels="$fused" --cuda_graphs="$graphs" --profile_steps=3
        fi
        for repeat in $(seq 1 "${REPEATS:-1}"); do
          run_bench "time_${tag}_$repeat" --engine="$engine" --micro_batch="$micro" \
            --fused_kernels="$fused" --cuda_graphs="$graphs"
        done
      done
    done
  done
done

# COMPARE: engines to measure beside PyTorch + torch.compile through tools/bench_compare.py
# (same initial weights and tokens, first and last loss checked, REPEATS_COMPARE runs per side,
# interleaved, medians; raw lines appended to $OUT/<date>-1x<gpu>.jsonl). MICRO_COMPARE picks
# the micro-batch (default 4); COMPARE_COMPILE=0 compares with eager PyTorch instead;
# MODEL_COMPARE (default qwen3-0.6b) another named shape of models/configs.cc.
launch=$(find_bin launch)
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | awk '{print tolower($NF)}')
jsonl="$final/$(date -u +%F)-1x${gpu_name}.jsonl"
for engine in ${COMPARE:-}; do
  for micro in ${MICRO_COMPARE:-4}; do
    compile=--torch_compile name="compile_${engine}_mb${micro}"
    [[ "${COMPARE_COMPILE:-1}" == 0 ]] && compile="" name="eager_${engine}_mb${micro}"
    model=${MODEL_COMPARE:-qwen3-0.6b}
    [[ "$model" != qwen3-0.6b ]] && name="${name}_$model"
    graph_arg=""
    [[ "${GRAPHS:-0}" != 0 ]] && graph_arg="--ours_arg=--cuda_graphs" name="${name}_graphs"
    timeout 900 python3 tools/bench_compare.py --launch "$launch" --bench "$bench" --nproc 1 \
      --engine "$engine" $compile $graph_arg --micro_batch "$micro" --model "$model" \
      --init_dir "/tmp/cpptrain_bench_init_$model" --jsonl "$jsonl" --log_dir "$out/$name" \
      --runs "${REPEATS_COMPARE:-3}" --steps "${STEPS_COMPARE:-15}" --warmup 3 --timeout 300 \
      >"$out/$name.log" 2>&1
    echo "$name exit $?:" | tee -a "$summary"
    grep -E '^[0-9]+ process|^\| (ours|torch) |^ours / torch|^largest|^bench_compare|^  .* differ' \
      "$out/$name.log" | tee -a "$summary"
  done
done
