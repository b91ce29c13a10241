#!/usr/bin/env bash
# The committed list of transformers.TrainingArguments fields
# (config/testdata/hf_training_arguments_fields.txt, which config/hf_training_args_test holds
# the table to) against the transformers PyPI has now: a field transformers added that the list
# lacks fails here, naming it, so it gets a row (accepted, mapped or refused) in
# config/hf_training_args.cc. transformers is installed into $CPPTRAIN_VENV (tools/test's) or a
# virtualenv of this test; TrainingArguments imports without torch.
set -euo pipefail
script="$(realpath "$1")"
committed="$(realpath "$2")"
source "$(dirname "${BASH_SOURCE[0]}")/pypi_python.sh"
pypi_python transformers hf_training_args_fields_test "${CPPTRAIN_VENV:-$TEST_TMPDIR/venv}"
generated="$TEST_TMPDIR/fields.txt"
"$python" "$script" >"$generated" 2>"$TEST_TMPDIR/stderr" ||
  { cat "$TEST_TMPDIR/stderr"; echo "FAIL: $script failed"; exit 1; }
echo "installed: $(head -1 "$generated")"
echo "committed: $(head -1 "$committed")"
new=$(comm -23 <(grep -v '^#' "$generated" | sort) <(grep -v '^#' "$committed" | sort))
gone=$(comm -13 <(grep -v '^#' "$generated" | sort) <(grep -v '^#' "$committed" | sort))
if [[ -n "$gone" ]]; then
  echo "note: fields the installed transformers no longer has: $(echo $gone)"
fi
if [[ -n "$new" ]]; then
  echo "FAIL: transformers.TrainingArguments fields missing from $committed: $(echo $new)"
  echo "regenerate the list (python3 tools/hf_training_args_fields.py >" \
    "config/testdata/hf_training_arguments_fields.txt), give each new field a row in" \
    "config/hf_training_args.cc (or a field in proto/training_args.proto), then" \
    "bazel run //tools:training_args_table into docs/TRAINING_ARGUMENTS.md"
  exit 1
fi
echo "ok: all $(grep -vc '^#' "$generated") fields of the installed transformers are listed"
