#!/usr/bin/env bash
# A write of metrics.jsonl or of the TensorBoard event file that fails must end the run with
# an error naming the file, after saving a checkpoint where one can be saved (before: exit 0,
# the records lost, and on a disk that filled mid-line a metrics.jsonl cut mid-record).
set -euo pipefail
train="$1"
config="$2"
fail() { echo "FAIL: $1"; [[ -n "${2:-}" ]] && cat "$2"; exit 1; }
common=(--config="$config" --set=args.max_steps=8 --set=args.logging_steps=2
        --set=args.save_steps=100 --set=args.eval_strategy=NO)

# metrics.jsonl on a full disk: /dev/full takes no byte.
out="$TEST_TMPDIR/full"
mkdir -p "$out"
ln -s /dev/full "$out/metrics.jsonl"
rc=0; "$train" "${common[@]}" --set="args.output_dir=$out" >/dev/null 2>"$TEST_TMPDIR/full.log" || rc=$?
[[ "$rc" -eq 1 ]] || fail "metrics.jsonl on /dev/full: exit $rc, not 1" "$TEST_TMPDIR/full.log"
grep -qF "training stops after step 1 because a log could not be written: cannot write metrics log '$out/metrics.jsonl': No space left on device (0 of " "$TEST_TMPDIR/full.log" ||
  fail "no error naming metrics.jsonl and the cause" "$TEST_TMPDIR/full.log"
grep -qF "saved checkpoint-1 first. Resume with resume_from_checkpoint: latest" "$TEST_TMPDIR/full.log" ||
  fail "the error does not say a checkpoint was saved first" "$TEST_TMPDIR/full.log"
[[ -d "$out/checkpoint-1" ]] || fail "no checkpoint-1 saved before stopping" "$TEST_TMPDIR/full.log"
echo "metrics.jsonl on /dev/full: exit $rc; $(grep -o 'training stops.*' "$TEST_TMPDIR/full.log")"

# A file that fills mid-record: a file size limit (ulimit -f, 1 KiB, SIGXFSZ ignored so the
# write fails with EFBIG) lets the write that crosses it through in part. The file must end at
# a whole record. No checkpoint fits under the limit either, and the error says so.
out="$TEST_TMPDIR/limit"
# The log goes through a pipe, which the limit does not cover.
rc=0; (trap '' XFSZ; ulimit -f 2; exec "$train" "${common[@]}" --set=args.max_steps=40 \
  --set=args.logging_steps=1 --set="args.output_dir=$out" 2>&1 >/dev/null) |
  cat >"$TEST_TMPDIR/limit.log" || rc=$?
[[ "$rc" -eq 1 ]] || fail "metrics.jsonl over the size limit: exit $rc, not 1" "$TEST_TMPDIR/limit.log"
grep -qF "cannot write metrics log '$out/metrics.jsonl': File too large" "$TEST_TMPDIR/limit.log" ||
  fail "no error naming metrics.jsonl and the cause" "$TEST_TMPDIR/limit.log"
grep -qF "the part written was removed, so the file ends at its last whole record" \
  "$TEST_TMPDIR/limit.log" || fail "the error does not say the partial record was removed" "$TEST_TMPDIR/limit.log"
grep -qF "could not be saved either" "$TEST_TMPDIR/limit.log" ||
  fail "the failed checkpoint is not reported" "$TEST_TMPDIR/limit.log"
size=$(stat -c %s "$out/metrics.jsonl")
[[ "$(tail -c 1 "$out/metrics.jsonl" | od -An -c | tr -d ' ')" == '\n' ]] ||
  fail "metrics.jsonl ($size bytes) ends mid-record: $(tail -c 80 "$out/metrics.jsonl")"
bad=$(grep -cv '^{.*}$' "$out/metrics.jsonl" || true)
[[ "$bad" -eq 0 ]] || fail "metrics.jsonl holds $bad line(s) that are not whole records"
echo "metrics.jsonl at the size limit: exit $rc, $size bytes of $(wc -l < "$out/metrics.jsonl") whole records"

# The TensorBoard event file on a full disk (report_to tensorboard).
out="$TEST_TMPDIR/tensorboard"
rc=0; CPPTRAIN_TEST_TENSORBOARD_EVENT_FILE=/dev/full "$train" "${common[@]}" \
  --set=args.report_to=tensorboard --set="args.output_dir=$out" >/dev/null \
  2>"$TEST_TMPDIR/tensorboard.log" || rc=$?
[[ "$rc" -eq 1 ]] || fail "event file on /dev/full: exit $rc, not 1" "$TEST_TMPDIR/tensorboard.log"
grep -qF "report_to tensorboard: cannot write TensorBoard event file '/dev/full': No space left on device" \
  "$TEST_TMPDIR/tensorboard.log" || fail "no error naming the event file" "$TEST_TMPDIR/tensorboard.log"
echo "event file on /dev/full: exit $rc; $(grep -o 'training stops.*' "$TEST_TMPDIR/tensorboard.log")"
# Evaluation alone (do_train false): the record of the evaluation cannot be written.
out="$TEST_TMPDIR/eval_only"
mkdir -p "$out"
ln -s /dev/full "$out/metrics.jsonl"
rc=0; "$train" --config="$config" --set=args.do_train=false --set=args.do_eval=true \
  --set="args.output_dir=$out" >/dev/null 2>"$TEST_TMPDIR/eval_only.log" || rc=$?
[[ "$rc" -eq 1 ]] || fail "evaluation alone, metrics.jsonl on /dev/full: exit $rc, not 1" "$TEST_TMPDIR/eval_only.log"
grep -qF "cannot write metrics log '$out/metrics.jsonl': No space left on device" "$TEST_TMPDIR/eval_only.log" ||
  fail "evaluation alone: no error naming metrics.jsonl" "$TEST_TMPDIR/eval_only.log"
echo "evaluation alone, metrics.jsonl on /dev/full: exit $rc; $(grep -o 'cannot write metrics log.*' "$TEST_TMPDIR/eval_only.log")"
echo PASS
