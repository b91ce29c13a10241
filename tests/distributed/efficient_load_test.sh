#!/usr/bin/env bash
# fsdp.cpu_ram_efficient_loading (FSDP1) and zero.zero3_init_flag (ZeRO-3) through the real
# launcher, 4 processes on the CPU: a Hugging Face directory of a 59M-parameter decoder (fp32
# file, 16 layers, 236 MB) is loaded as tools/train loads it, with and without the option.
# Every rank's gathered parameters equal the file either way. What a rank adds at its peak
# (VmHWM after the load - VmRSS before it), less what the same load of a 0.1M-parameter model
# adds (communicators, threads: the runtime's share), must fall at least 3x with the option:
# the parameters' share falls 4x, and each rank also holds one tensor's rows (or 8 MiB of the
# mapped file while it checksums) at a time.
#
# glibc's dynamic mmap threshold keeps freed blocks of the load (the deferred build frees every
# module it builds) in its heap, ~70-120 MB per rank here in both modes; the test fixes the
# threshold so that VmHWM measures what the load holds (docs/ARCHITECTURE.md has both figures).
set -uo pipefail
launch="$1"
program="$2"
export MALLOC_MMAP_THRESHOLD_=65536
failed=0
fail() {
  echo "FAIL: $*"
  failed=1
}

mkdir -p "$TEST_TMPDIR/model" "$TEST_TMPDIR/small"
"$program" --write="$TEST_TMPDIR/model" --model=demo --vocab=8192 --hidden=512 \
  --intermediate=1536 --layers=16 || { echo "FAIL: writing the model directory"; exit 1; }
"$program" --write="$TEST_TMPDIR/small" --model=demo --vocab=256 --hidden=64 \
  --intermediate=128 --layers=2 || { echo "FAIL: writing the small model directory"; exit 1; }

# The largest load_peak_kib of the 4 ranks of one run: directory, engine, efficient.
peak() {
  local out code
  out=$(timeout 300 "$launch" --nproc_per_node=4 --master_port=0 "$program" --dir="$1" \
        --engine="$2" --efficient="$3" --check 2>&1)
  code=$?
  echo "$out" | grep -E "^(\[rank [0-9]\] )?LOAD " >&2
  if [[ $code -ne 0 || $(grep -c "CHECKED" <<<"$out") -ne 4 ]]; then
    echo "$out" | tail -20 >&2
    echo "FAIL: $1 $2 efficient=$3 (exit $code)" >&2
    echo 0
    return
  fi
  grep -o '"load_peak_kib":[0-9-]*' <<<"$out" | cut -d: -f2 | sort -n | tail -1
}

for engine in fsdp1 zero3; do
  runtime=$(peak "$TEST_TMPDIR/small" "$engine" false)
  whole=$(peak "$TEST_TMPDIR/model" "$engine" false)
  efficient=$(peak "$TEST_TMPDIR/model" "$engine" true)
  echo "== $engine: largest per-rank load peak $whole KiB whole, $efficient KiB efficient," \
    "$runtime KiB for the small model"
  if (( runtime <= 0 || whole <= 0 || efficient <= 0 )); then
    fail "$engine: a run failed"
  elif (( (efficient - runtime) * 3 > whole - runtime )); then
    fail "$engine: the efficient load adds $((efficient - runtime)) KiB beyond the runtime's" \
      "share, not 3x below the whole load's $((whole - runtime)) KiB"
  else
    ratio=$(( (whole - runtime) * 100 / (efficient - runtime) ))
    printf '%s: beyond the runtime'"'"'s share %d KiB whole -> %d KiB efficient (%d.%02dx)\n' \
      "$engine" $((whole - runtime)) $((efficient - runtime)) $((ratio / 100)) $((ratio % 100))
  fi
done
[[ $failed -eq 0 ]] && echo PASS
[[ $failed -eq 0 ]]
