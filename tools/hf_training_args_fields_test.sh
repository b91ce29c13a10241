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
venv="${CPPTRAIN_VENV:-$TEST_TMPDIR/venv}"
if ! "$venv/bin/python" -c 'import transformers' >/dev/null 2>&1; then
  [[ -x "$venv/bin/pip" ]] || python3 -m venv "$venv"
  if ! "$venv/bin/pip" install -q --disable-pip-version-check transformers; then
    python3 -c 'import socket; socket.create_connection(("pypi.org", 443), 5)' 2>/dev/null || {
      echo "SKIPPED: hf_training_args_fields_test: no transformers here and PyPI cannot be reached"
      exit 0
    }
    echo "FAIL: could not install transformers into $venv"; exit 1
  fi
fi
generated="$TEST_TMPDIR/fields.txt"
"$venv/bin/python" "$script" >"$generated" 2>"$TEST_TMPDIR/stderr" ||
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
