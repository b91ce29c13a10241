#!/usr/bin/env bash
# Under `bazel run //tools:train -- --config=jobs/job.textproto` the tool starts in its runfiles
# tree, and Bazel names the directory the user typed the command in as
# BUILD_WORKING_DIRECTORY. Relative paths (the config file, output_dir in it, a checkpoint
# given to ckpt) must resolve from there, as they would without Bazel. Runs the tools from /
# with the variable set, as `bazel run` does.
set -euo pipefail
train="$(realpath "$1")"
config="$(realpath "$2")"
ckpt="$(realpath "$3")"
fail() { echo "FAIL: $1"; [[ -n "${2:-}" ]] && cat "$2"; exit 1; }
user="$TEST_TMPDIR/user"
mkdir -p "$user/jobs"
cp "$config" "$user/jobs/job.textproto"

cd /
BUILD_WORKING_DIRECTORY="$user" timeout 300 "$train" --config=jobs/job.textproto \
  --set=args.output_dir=out --set=args.max_steps=2 --set=args.save_steps=2 \
  --set=args.eval_strategy=NO --set=args.use_cpu=true >/dev/null 2>"$TEST_TMPDIR/train.log" ||
  fail "train with a relative --config under BUILD_WORKING_DIRECTORY failed" "$TEST_TMPDIR/train.log"
[[ -d "$user/out/checkpoint-2" ]] || fail "no checkpoint-2 in $user/out (output_dir \"out\")"
BUILD_WORKING_DIRECTORY="$user" "$ckpt" verify out/checkpoint-2 >"$TEST_TMPDIR/verify.log" 2>&1 ||
  fail "ckpt verify of a relative path under BUILD_WORKING_DIRECTORY failed" "$TEST_TMPDIR/verify.log"
echo "train and ckpt resolved jobs/job.textproto, out and out/checkpoint-2 from $user"
echo PASS
