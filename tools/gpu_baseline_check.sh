#!/usr/bin/env bash
# Ours against PyTorch at its strongest, on one GPU host in one call: builds what it needs with
# CMake (as tools/gpu_kernels_check.sh does), runs the GPU tests named in TESTS, measures the
# dense bf16 peak (tools/matmul_peak.py, for mfu_full_measured), then for each row of ROWS runs
# tools/bench_compare.py with --torch_sweep: every configuration of SWEEP once, then RUNS runs
# of ours and of the fastest configuration that passed the checks, interleaved. Logs and the
# summary go to $OUT (or /tmp/gpu_out); raw JSON lines to $OUT/<date>-1x<gpu>.jsonl. Exits 1
# when a test or a row failed or a row was cut or skipped for DEADLINE; the last line counts them.
#   NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
#     ROWS="local:qwen3-0.6b:4:graphs" tools/gpu_baseline_check.sh
# A row is engine:model:micro-batch[:graphs|:nofused][:config[:impl]] (engine zero1-3 is ours' ZeRO
# stage beside PyTorch's fully_shard, without resharding after the forward for stages 1-2;
# config, one of TORCH_CONFIGS, is this row's one; graphs: ours replays its step as a CUDA
# graph, and the sweep adds compile's reduce-overhead; nofused: ours without its fused kernels,
# for rows against DeepSpeed, whose model runs eagerly). SWEEP (comma-separated TORCH_CONFIGS of
# bench_compare.py) replaces the default sweep, TORCH_CONFIG names one configuration to compare
# with instead of sweeping; TESTS="" skips the tests; PEAK=0 skips the peak
# (PEAK_TFLOPS then gives it); RUNS (default 3) runs a side; DEADLINE (seconds after the start)
# cuts the rows to fit a call; COMPARE_ARGS adds bench_compare.py flags to every row (e.g.
# "--ours_arg=--profile_steps=4 --torch_arg=--profile_steps=4": both sides' kernel tables,
# gathered into $OUT/profiles.txt); TORCH_IMPL=hf runs transformers' model on PyTorch's side (the
# architectures bench_torch.py's own decoder lacks: Qwen2, Gemma, Mistral, Phi-3; configurations
# compiled-model, compiled-model-graphs and compiled-model-graphs-ddp); a row's impl field
# (native or hf) overrides TORCH_IMPL for that row, so one call can hold both kinds of row.
# Liger comes from .whl/ (carried; the device README's recipe). $OUT holds at most five files
# (summary.txt, the JSON lines, profiles.txt, matmul_peak.json, baseline_logs.tgz), and the
# device brings back eight: several runs of this script in one command share one OUT (the
# summary, the lines and the profiles are appended; the last tarball holds every run's logs).
set -uo pipefail
cd "$(dirname "$0")/.."
final="${OUT:-/tmp/gpu_out}"
out=/tmp/cpptrain_baseline_logs
summary="$final/summary.txt"  # straight into $OUT: a call cut at its limit keeps it
mkdir -p "$out" "$final"
trap 'tar czf "$final/baseline_logs.tgz" -C "$out" . 2>/dev/null' EXIT
trap 'exit 143' TERM
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
prefix=/tmp/cpptrain_prefix
mkdir -p "$prefix"
for f in .debs/*.deb; do dpkg -x "$f" "$prefix"; done
export LD_LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
export PATH="/usr/local/cuda/bin:$PATH"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/cpptrain_site .whl/*.whl && export PYTHONPATH=/tmp/cpptrain_site
fi
python3 -c 'import liger_kernel' 2>/dev/null || echo "liger-kernel missing: Liger rows will fail" |
  tee -a "$summary"

tests="${TESTS-kernels_fused_ops_test trainer_cuda_graph_test trainer_step_graph_test}"
build=/tmp/cpptrain_build
start=$SECONDS
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)');$prefix/usr" \
  -DCMAKE_MODULE_PATH="$prefix/usr/share/glog/cmake" -DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
  >"$out/build.log" 2>&1 &&
  cmake --build "$build" -j "$(nproc)" --target tools_bench tools_launch $tests \
    >>"$out/build.log" 2>&1
code=$?
echo "build exit $code in $((SECONDS - start)) s" | tee -a "$summary"
if ((code != 0)); then
  grep -E "error|Error" "$out/build.log" | head -20 | tee -a "$summary"
  exit 1
fi
find_bin() { find "$build" -type f -name "$1" -perm -u+x | head -1; }
# Waits up to 30 s for a row's processes to leave the GPU, then kills what is still there: a row
# cut by its timeout left a PyTorch process holding 73 GiB, and the next row ran out of memory
# (2026-12-06).
free_gpu() {
  local pids
  for _ in $(seq 30); do
    pids=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | tr -d ' ')
    [[ -z "$pids" ]] && return 0
    sleep 1
  done
  echo "processes still on the GPU 30 s after the row, killed: $(echo $pids)" | tee -a "$summary"
  kill -9 $pids 2>/dev/null
  sleep 2
}
# Counts for the closing line; the exit status is 1 when a test or a row failed or a row was
# skipped (a case a test skips, printed with its reason in the test's line, is only counted).
tests_run=0 tests_failed=0 cases_skipped=0 rows_run=0 rows_failed=0 rows_skipped=0
for test in $tests; do
  timeout 300 "$(find_bin "$test")" >"$out/$test.log" 2>&1
  code=$?
  skipped=$(grep -oE '^\[  SKIPPED \] [0-9]+ test' "$out/$test.log" | grep -oE '[0-9]+')
  ((tests_run += 1, tests_failed += code != 0, cases_skipped += ${skipped:-0}))
  echo "$test exit $code: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/$test.log" | tr '\n' ' ')" |
    tee -a "$summary"
  grep -E "^\[  FAILED|Failure" -A3 "$out/$test.log" | head -30 >>"$summary"
done

peak="${PEAK_TFLOPS:-790}"
peak_source="${PEAK_SOURCE:-not measured in this call}"
if [[ "${PEAK:-1}" != 0 ]]; then
  timeout 120 python3 tools/matmul_peak.py >"$out/matmul_peak.json" 2>"$out/matmul_peak.err"
  cp "$out/matmul_peak.json" "$final/" 2>/dev/null
  measured=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["peak_tflops"])' \
    "$out/matmul_peak.json" 2>/dev/null) && peak=$measured &&
    peak_source="tools/matmul_peak.py in this call: $(cat "$out/matmul_peak.json")"
  echo "peak: $peak TFLOP/s ($peak_source)" | tee -a "$summary"
fi

bench=$(find_bin bench)
launch=$(find_bin launch)
# "NVIDIA H200" -> h200, "NVIDIA H100 80GB HBM3" -> h100: the first word after the vendor.
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | awk '{print tolower($2)}')
jsonl="$final/$(date -u +%F)-1x${gpu_name}.jsonl"
for row in ${ROWS:-local:qwen3-0.6b:4:graphs}; do
  IFS=: read -r engine model micro graphs row_config row_impl <<<"$row"
  sweep="${SWEEP:-compiled-model,compiled-full,liger-compiled}"
  extra=()
  ours_engine="$engine"
  # zeroN: ours' ZeRO stage N beside PyTorch's fully_shard (DeepSpeed is not on the GPU host).
  # Stages 1 and 2 keep whole parameters through the step, as fully_shard does with
  # reshard_after_forward=False (FSDP's SHARD_GRAD_OP, its ZeRO-2), so they meet that one;
  # ZERO_TORCH_ENGINE (e.g. fsdp2) names another.
  if [[ "$engine" =~ ^zero([123])$ ]]; then
    ours_engine=zero
    zero_torch=fsdp2
    [[ "${BASH_REMATCH[1]}" != 3 ]] && zero_torch="${ZERO_TORCH_ENGINE:-fsdp2_noreshard}"
    extra+=(--zero_stage "${BASH_REMATCH[1]}" --torch_engine "$zero_torch")
  fi
  if [[ "$graphs" == graphs ]]; then
    extra+=(--ours_arg=--cuda_graphs)
    [[ -z "${SWEEP:-}" ]] && sweep="$sweep,compiled-full-graphs"
    # PyTorch's DDP wrapper on one GPU ran faster than no wrapper (2026-12-06): a local row
    # meets it too.
    [[ -z "${SWEEP:-}" && "$engine" == local ]] && sweep="$sweep,compiled-full-graphs-ddp"
  fi
  # nofused: ours on its eager reference path, so a row shows the engine apart from the kernels.
  [[ "$graphs" == nofused ]] && extra+=(--ours_arg=--fused_kernels=false)
  [[ -z "${SWEEP:-}" && "$engine" =~ ^(local|ddp)$ ]] && sweep="$sweep,bf16-params"
  pick=(--torch_sweep "$sweep")
  [[ -n "${TORCH_CONFIG:-}" ]] && pick=(--torch_config "$TORCH_CONFIG")  # one, no sweep
  [[ -n "$row_config" ]] && pick=(--torch_config "$row_config")  # this row's one
  name="${engine}_${model}_mb${micro}${graphs:+_$graphs}"
  start=$SECONDS
  row_timeout="${ROW_TIMEOUT:-1500}"
  # DEADLINE: seconds after the script's start by which every row must have ended and left the
  # GPU (45 s kept for that: timeout's 10 s from TERM to KILL, then free_gpu's 32).
  [[ -n "${DEADLINE:-}" ]] && row_timeout=$((DEADLINE - SECONDS - 45))
  if ((row_timeout < 60)); then
    echo "$row: SKIPPED, ${row_timeout} s left before DEADLINE" | tee -a "$summary"
    ((rows_skipped += 1))
    continue
  fi
  timeout -k 10 "$row_timeout" python3 tools/bench_compare.py --launch "$launch" \
    --bench "$bench" --nproc 1 --engine "$ours_engine" --model "$model" --micro_batch "$micro" \
    --init_dir "/tmp/cpptrain_bench_init_$model" --jsonl "$jsonl" --log_dir "$out/$name" \
    --runs "${RUNS:-3}" --steps "${STEPS:-12}" --warmup "${WARMUP:-5}" --timeout 420 \
    "${pick[@]}" --peak_tflops "$peak" --peak_source "$peak_source" "${extra[@]}" \
    --torch_impl "${row_impl:-${TORCH_IMPL:-native}}" ${COMPARE_ARGS:-} >"$out/$name.log" 2>&1
  code=$?
  free_gpu
  ((rows_run += 1, rows_failed += code != 0))
  echo "$name exit $code in $((SECONDS - start)) s:" | tee -a "$summary"
  grep -E '^   [a-z0-9-]+: |fastest|^[0-9]+ process|^\| (ours|torch) |^ours / |^largest|^bench_compare|^  .* differ' \
    "$out/$name.log" | tee -a "$summary"
  for log in "$out/$name"/*.log; do
    grep -q "profile:" "$log" 2>/dev/null &&
      { echo "== $name: $(basename "$log")"; grep -h "profile:" "$log"; } >>"$final/profiles.txt"
  done
done
echo "tests: $tests_run run, $tests_failed failed, $cases_skipped cases SKIPPED inside them;" \
  "rows: $rows_run run, $rows_failed failed" \
  "(a row cut by DEADLINE fails), $rows_skipped SKIPPED for DEADLINE" | tee -a "$summary"
((tests_failed + rows_failed + rows_skipped == 0))
