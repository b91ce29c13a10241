#!/usr/bin/env bash
# tools/train on token files that are wrong in the ways a reader can check: a size that is not a
# multiple of the token width, ids at or above the vocabulary, uint32 ids read as uint16 (no
# metadata file), and a file cut short while the run reads it (before: SIGBUS, exit 135).
set -euo pipefail
train="$1"
fail() { echo "FAIL: $1"; [[ -n "${2:-}" ]] && cat "$2"; exit 1; }
# Writes N tokens (id = 1 + i % 60, below the tiny model's vocabulary of 64) as little-endian
# integers of WIDTH bytes to PATH; EXTRA is appended as is.
tokens() {
  python3 - "$@" <<'PY'
import struct, sys
path, n, width = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
extra = bytes.fromhex(sys.argv[4]) if len(sys.argv) > 4 else b""
fmt = "<H" if width == 2 else "<I"
with open(path, "wb") as f:
    f.write(b"".join(struct.pack(fmt, 1 + i % 60) for i in range(n)) + extra)
PY
}
job="$TEST_TMPDIR/job.textproto"
echo 'model { name: "tiny" } data { seq_len: 32 }' > "$job"
run() {  # run NAME FILE [--set ...]: tools/train on FILE, the tiny model; the exit code in $rc
  local name="$1" file="$2"; shift 2
  rc=0
  "$train" --config="$job" --set=data.train_file="$file" \
    --set=args.output_dir="$TEST_TMPDIR/out-$name" --set=args.eval_strategy=NO \
    --set=args.save_strategy=NO --set=args.per_device_train_batch_size=4 "$@" \
    >/dev/null 2>"$TEST_TMPDIR/$name.log" || rc=$?
}
expect() {  # expect NAME TEXT: exit 1 with TEXT in the log
  [[ "$rc" -eq 1 ]] || fail "$1: exit $rc, not 1" "$TEST_TMPDIR/$1.log"
  grep -qF "$2" "$TEST_TMPDIR/$1.log" || fail "$1: no '$2' in the log" "$TEST_TMPDIR/$1.log"
  echo "$1: exit $rc: $(grep -o "token file .*" "$TEST_TMPDIR/$1.log" | head -1 | cut -c1-240)"
}

tokens "$TEST_TMPDIR/odd.bin" 1000 2 01
run odd "$TEST_TMPDIR/odd.bin" --set=args.max_steps=1
expect odd "odd.bin has 2001 bytes, not a multiple of 2 (token_dtype UINT16)"

tokens "$TEST_TMPDIR/big_ids.bin" 1022 2 "64006400"  # two more tokens, id 100: 32 samples
run big_ids "$TEST_TMPDIR/big_ids.bin" --set=args.max_steps=1
expect big_ids "token 100 at byte offset 2044 (token 1022) is not below the model's vocab_size 64"

tokens "$TEST_TMPDIR/wide.bin" 1024 4
run wide "$TEST_TMPDIR/wide.bin" --set=args.max_steps=1
expect wide "is read as token_dtype UINT16, but every second one of the 2048 16-bit words in its samples is 0"
run wide_ok "$TEST_TMPDIR/wide.bin" --set=args.max_steps=1 --set=data.token_dtype=UINT32
[[ "$rc" -eq 0 ]] || fail "wide.bin read as UINT32: exit $rc" "$TEST_TMPDIR/wide_ok.log"

# Cut short while training: wait (polling, up to 120 s) for the first logged step, cut the file
# to 1000 bytes in place, and expect the run to end with the file's name and sizes.
tokens "$TEST_TMPDIR/shrinks.bin" 200000 2
out="$TEST_TMPDIR/out-shrinks"
rc=0
"$train" --config="$job" --set=data.train_file="$TEST_TMPDIR/shrinks.bin" \
  --set=args.output_dir="$out" --set=args.eval_strategy=NO --set=args.save_strategy=NO \
  --set=args.per_device_train_batch_size=4 --set=args.max_steps=100000 --set=args.logging_steps=1 \
  >/dev/null 2>"$TEST_TMPDIR/shrinks.log" &
pid=$!
for _ in $(seq 1200); do
  [[ -s "$out/metrics.jsonl" ]] && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
[[ -s "$out/metrics.jsonl" ]] || { kill "$pid" 2>/dev/null; fail "no step was logged" "$TEST_TMPDIR/shrinks.log"; }
truncate -s 1000 "$TEST_TMPDIR/shrinks.bin"
wait "$pid" || rc=$?
[[ "$rc" -ne 135 ]] || fail "the run died of SIGBUS (exit 135)" "$TEST_TMPDIR/shrinks.log"
expect shrinks "shrinks.bin was truncated while in use: sample"
grep -qF "but the file now holds 1000 bytes (400000 bytes when it was opened)" "$TEST_TMPDIR/shrinks.log" ||
  fail "the sizes are not named" "$TEST_TMPDIR/shrinks.log"
echo PASS
