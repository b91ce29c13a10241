#!/usr/bin/env bash
# tools/bench_torch.py's native model runs on the CPU tiny model, one process, no compile: with
# its defaults (the logits out of the model, the loss outside it), with the loss inside and
# native GQA, and with the rotary tables computed in every forward instead of once. Each run
# prints its JSON line; the tables' two ways give the same losses. The GPU rows run this script
# with compile and CUDA graphs on top, so an error in its plain paths would cost a GPU call.
set -euo pipefail
script="$(realpath "$1")"
source "$(dirname "${BASH_SOURCE[0]}")/pypi_python.sh"
pypi_python torch bench_torch_smoke_test "${CPPTRAIN_VENV:-$TEST_TMPDIR/venv}"
run() {  # name, more flags...
  local name=$1
  shift
  "$python" "$script" --engine=local --device=cpu --impl=native --model=tiny --seq_len=32 \
    --micro_batch=2 --steps=3 --warmup=1 --bf16=false "$@" >"$TEST_TMPDIR/$name.out" \
    2>"$TEST_TMPDIR/$name.err" || {
    tail -n 20 "$TEST_TMPDIR/$name.err"
    echo "FAIL: $name"
    exit 1
  }
  grep '^{"model"' "$TEST_TMPDIR/$name.out" | tail -1
}
field() {  # json line, key
  "$python" -c 'import json, sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"
}
defaults=$(run defaults)
inside=$(run inside --loss=inside --attention=gqa)
step=$(run step --rotary_tables=step)
for line in "$defaults" "$inside" "$step"; do
  [[ -n "$line" ]] || { echo "FAIL: a run printed no JSON line"; exit 1; }
done
echo "first losses: defaults $(field "$defaults" first_loss), loss inside" \
  "$(field "$inside" first_loss), tables every step $(field "$step" first_loss)"
for key in rotary_tables first_loss last_loss; do
  echo "$key: cached $(field "$defaults" "$key"), every step $(field "$step" "$key")"
done
[[ "$(field "$defaults" rotary_tables)" == cached && "$(field "$step" rotary_tables)" == step ]] ||
  { echo "FAIL: the lines do not record the tables' way"; exit 1; }
for key in first_loss last_loss; do
  [[ "$(field "$defaults" "$key")" == "$(field "$step" "$key")" ]] ||
    { echo "FAIL: $key differs between cached tables and tables every step"; exit 1; }
done
# On the CPU there is no allocator peak: both memory fields say so.
[[ "$(field "$defaults" peak_memory_gib)" == None && "$(field "$defaults" peak_by_phase_gib)" == None ]] ||
  { echo "FAIL: peak memory (and by phase) on the CPU should be null: $defaults"; exit 1; }
# PhasePeaks over a counter that behaves as the CUDA caching allocator's (the real one needs a
# GPU), the sequence and figures of tools/phase_peaks_test.cc.
"$python" - "$script" <<'PY' || { echo "FAIL: bench_torch.py's PhasePeaks"; exit 1; }
import importlib.util, sys, types
spec = importlib.util.spec_from_file_location("bench_torch", sys.argv[1])
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
c = {"current": 0, "peak": 0}
def allocate(n):
    c["current"] += n
    c["peak"] = max(c["peak"], c["current"])
def free(n):
    c["current"] -= n
bench.torch.cuda.max_memory_allocated = lambda device: c["peak"]
bench.torch.cuda.reset_peak_memory_stats = lambda device: c.update(peak=c["current"])
peaks = bench.PhasePeaks(types.SimpleNamespace(type="cuda"))
allocate(100)
for step in range(2):
    peaks.begin("forward"); allocate(51 - step); allocate(30); free(30)
    peaks.begin("backward"); allocate(20); free(51 - step)
    peaks.begin("step"); allocate(5); free(5); free(20)
peaks.finish()
want = {"setup": 100, "forward": 181, "backward": 171, "step": 125}
assert peaks.peaks == want, peaks.peaks
print("PhasePeaks:", peaks.peaks)
PY
echo "PASS: bench_torch_smoke_test"
