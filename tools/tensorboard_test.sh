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
python="${CPPTRAIN_VENV:-}/bin/python"
# The system's Python when it has the package (GPU hosts do, and reach no PyPI).
"$python" -c "import tensorboard" 2>/dev/null || python=python3
if ! "$python" -c "import tensorboard" 2>/dev/null; then
  python3 -m venv "${TEST_TMPDIR}/venv"
  if ! "${TEST_TMPDIR}/venv/bin/pip" install -q tensorboard; then
    python3 -c 'import socket; socket.create_connection(("pypi.org", 443), 5)' 2>/dev/null ||
      { echo "SKIPPED: tensorboard_test: no tensorboard package here and PyPI cannot be reached"; exit 0; }
    echo "FAIL: cannot install the tensorboard package from PyPI"; exit 1
  fi
  python="${TEST_TMPDIR}/venv/bin/python"
fi
"$train" --config="$config" --set="args.output_dir=$out" --set=args.max_steps=30 \
  --set=args.logging_steps=5 --set=args.eval_steps=10 --set=args.report_to=tensorboard \
  --set="args.logging_dir=$out/runs/test" >/dev/null 2>"${TEST_TMPDIR}/train.log" || {
  cat "${TEST_TMPDIR}/train.log"; exit 1; }
ls "$out/runs/test"
"$python" "$reader" "$out/runs/test" "$out/metrics.jsonl"
