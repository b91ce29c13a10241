#!/usr/bin/env bash
# report_to: "tensorboard" end to end: //tools:train on the demo config writes event files that
# TensorBoard's own reader (the tensorboard Python package from PyPI) loads, with Hugging
# Face's tags (train/loss, train/learning_rate, train/grad_norm, eval/loss, ...) and, at every
# step, the values metrics.jsonl has. The Python package comes from $CPPTRAIN_VENV (prepared
# by tools/install_deps.sh) or is installed into a virtualenv here.
set -euo pipefail
train="$1"
config="$2"
reader="$3"
out="${TEST_TMPDIR}/tb"
source "$(dirname "${BASH_SOURCE[0]}")/pypi_python.sh"
pypi_python tensorboard tensorboard_test
"$train" --config="$config" --set="args.output_dir=$out" --set=args.max_steps=30 \
  --set=args.logging_steps=5 --set=args.eval_steps=10 --set=args.report_to=tensorboard \
  --set="args.logging_dir=$out/runs/test" >/dev/null 2>"${TEST_TMPDIR}/train.log" || {
  cat "${TEST_TMPDIR}/train.log"; exit 1; }
ls "$out/runs/test"
"$python" "$reader" "$out/runs/test" "$out/metrics.jsonl"
