#!/usr/bin/env bash
# The benchmark check can fail (tools/bench_compare.py): on the tiny model in fp32 on the CPU,
# ours against ours (--baseline ours: tools/bench again, no PyTorch needed), from one init
# directory of learnable tokens. The clean pair passes; each fault injected into the baseline
# side exits 1, named by the check that caught it:
#   noop_optimizer   learning rate 0: the loss does not fall       -> last_loss, param_checksum
#   scaled_gradient  the same loss, its gradient 1.002x            -> first_grad_norm
#   other_tokens     ids + 1 (mod vocab), the original fingerprint -> first_grad_norm
# And uniform random tokens at a small learning rate move the loss too little for the check
# to mean anything, which it says (loss_fall) instead of passing. Then --records checks the
# lines those runs wrote, split over files, as a row cut across calls is.
set -euo pipefail
launch="$1"
bench="$2"
compare="$3"
work="${TEST_TMPDIR}/fault"
mkdir -p "$work"

run() {  # name, more bench_compare flags...
  local name=$1
  shift
  python3 "$compare" --launch "$launch" --bench "$bench" --baseline ours --device cpu \
    --bf16 false --model tiny --seq_len 32 --micro_batch 2 --steps 4 --warmup 2 --runs 1 \
    --learning_rate 1e-2 --init_dir "$work/init" --ours_arg=--use_cpu --jsonl "$work/$name.jsonl" \
    "$@" >"$work/$name.log" 2>&1
}
failed=0
expect() {  # want exit code, name, pattern the output must hold, flags...
  local want=$1 name=$2 pattern=$3
  shift 3
  local code=0
  run "$name" "$@" || code=$?
  if [[ $code != "$want" ]]; then
    echo "FAIL $name: exit $code, expected $want"
    tail -n 25 "$work/$name.log"
    failed=1
  elif ! grep -qE -- "$pattern" "$work/$name.log"; then
    echo "FAIL $name: exit $code as expected, but the output lacks /$pattern/"
    tail -n 25 "$work/$name.log"
    failed=1
  else
    echo "ok   $name (exit $code): $(grep -E -- "$pattern" "$work/$name.log" | head -1 | sed 's/^ *//')"
  fi
}

expect 0 clean "bench_compare: verified"
expect 1 noop_optimizer "last_loss differs: baseline run 1" \
  --baseline_arg=--inject_fault=noop_optimizer
grep -q "param_checksum differs: baseline run 1" "$work/noop_optimizer.log" ||
  { echo "FAIL noop_optimizer: param_checksum did not catch it"; failed=1; }
expect 1 scaled_gradient "first_grad_norm differs: baseline run 1" \
  --baseline_arg=--inject_fault=scaled_gradient
expect 1 other_tokens "first_grad_norm differs: baseline run 1" \
  --baseline_arg=--inject_fault=other_tokens
# A gradient 1.002x larger changes nothing else by as much: only the norm check sees it.
if grep -qE "(first_loss|last_loss|param_checksum) differs" "$work/scaled_gradient.log"; then
  echo "note: scaled_gradient also moved another figure past its tolerance"
fi
expect 1 random_tokens "loss_fall: ours run 1" --tokens random --learning_rate 1e-5

# --records: the same checks over lines already written (a row split over calls). The clean
# pair's two runs from two files passes; ours' clean run beside the no-op baseline fails as the
# live run did; a side whose runs ran different commands, and runs of different settings (the
# random-token case's), are refused (exit 2).
side() {  # case, side, file: that case's run lines of that side into the file
  grep "\"side\": \"$2\"" "$work/$1.jsonl" >"$3" ||
    { echo "FAIL: $1.jsonl holds no $2 run"; failed=1; }
}
records() {  # want exit code, name, pattern, files...
  local want=$1 name=$2 pattern=$3 code=0
  shift 3
  local -a flags=()
  for f in "$@"; do flags+=(--records "$f"); done
  python3 "$compare" "${flags[@]}" >"$work/$name.log" 2>&1 || code=$?
  if [[ $code != "$want" ]] || ! grep -qE -- "$pattern" "$work/$name.log"; then
    echo "FAIL $name: exit $code (expected $want), /$pattern/ $(grep -cE -- "$pattern" \
      "$work/$name.log") times"
    tail -n 25 "$work/$name.log"
    failed=1
  else
    echo "ok   $name (exit $code): $(grep -E -- "$pattern" "$work/$name.log" | head -1)"
  fi
}
side clean ours "$work/ours_clean.jsonl"
side clean baseline "$work/baseline_clean.jsonl"
side noop_optimizer baseline "$work/baseline_noop.jsonl"
side random_tokens baseline "$work/baseline_random.jsonl"
cat "$work/baseline_clean.jsonl" "$work/baseline_noop.jsonl" >"$work/baseline_two.jsonl"
records 0 records_clean "bench_compare: verified" "$work/ours_clean.jsonl" \
  "$work/baseline_clean.jsonl"
records 1 records_noop "last_loss differs: baseline run 1" "$work/ours_clean.jsonl" \
  "$work/baseline_noop.jsonl"
records 2 records_mixed "holds baseline runs of different commands" "$work/ours_clean.jsonl" \
  "$work/baseline_two.jsonl"
records 2 records_shape "mixes runs of different (tokens|learning_rate)" \
  "$work/ours_clean.jsonl" "$work/baseline_random.jsonl"
((failed)) && { echo "bench_fault_test: FAILED"; exit 1; }
echo PASS
