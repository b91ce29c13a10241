# Sourced by the multi-process test scripts, after setting `launch` and `program`:
#
#   variant NAME PROCESSES FLAGS...   runs the program under the launcher
#   record PROCESSES OK [cpu]         counts a run a script checked its own way (OK: 0 passed;
#                                     cpu: it ran on the CPU whatever GPUs the host has)
#   skip NAME REASON                  records a variant that cannot run here
#   variants_done                     prints the closing line; returns non-zero on a failure
#   leg NAME PROCESSES FLAGS...       a checkpoint leg: runs the program into $TEST_TMPDIR/NAME,
#                                     keeps its log and its LOSS lines (NAME.losses), records it
#   continues REF NAME [TOLERANCE]    true when leg NAME's losses equal leg REF's at the same
#                                     steps (relative TOLERANCE, default 1e-4; 0 is exactly);
#                                     prints the largest difference
#
# A variant runs on the GPUs (NCCL, one process per GPU) when the host has at least PROCESSES
# of them, and otherwise on the CPU (--use_cpu: Gloo, or the store communicator in builds
# without Gloo), so every variant runs on every machine and the closing line says where:
#   variants: 14 ran (3 on CUDA, 11 on the CPU), 0 skipped, 0 failed
# With CPPTRAIN_SHARED_GPU=1 on a CUDA host, every variant runs on the GPUs, several
# processes sharing one (sharding/local_device.h), their CUDA collectives staged through the
# CPU communicator instead of NCCL (sharding/staged_communicator.h); the closing line says
# "staged". CPPTRAIN_STAGED_DELAY_US delays each staged result, widening race windows.
# A variant passes when the program exits 0 and prints $expect (default EQUIVALENT); lines
# matching $show are echoed. `placement N` prints the flag a leg with N processes needs.

expect=${expect:-EQUIVALENT}
show=${show:-"relative difference|EQUIVALENT|MISMATCH|ERROR|Error"}
gpus=0
if command -v nvidia-smi >/dev/null 2>&1 && gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU'); then
  echo "CUDA host with $gpus GPUs: variants needing more processes run on the CPU"
else
  gpus=0
fi
shared_gpu=0
if [[ "${CPPTRAIN_SHARED_GPU:-0}" == 1 ]] && ((gpus >= 1)); then
  shared_gpu=1
  echo "CPPTRAIN_SHARED_GPU=1: every variant runs on the $gpus GPU(s), processes sharing them," \
    "collectives staged through the CPU (delay ${CPPTRAIN_STAGED_DELAY_US:-0} us)"
fi
ran_cuda=0
ran_cpu=0
skipped=0
failed=0

placement() {  # processes -> "" (CUDA) or --use_cpu
  if (( gpus >= $1 || shared_gpu == 1 )); then echo ""; else echo "--use_cpu"; fi
}

record() {  # processes, 0 when it passed, [cpu]
  if [[ "${3:-}" != cpu && -z "$(placement "$1")" ]]; then
    ran_cuda=$((ran_cuda + 1))
  else
    ran_cpu=$((ran_cpu + 1))
  fi
  [[ "$2" == 0 ]] || failed=$((failed + 1))
}

variant() {  # name, processes, flags...
  local name=$1 n=$2 where=CUDA flag out code
  shift 2
  flag=$(placement "$n")
  [[ -n "$flag" ]] && where=CPU
  out=$(timeout 300 "$launch" --nproc_per_node="$n" --master_port=0 "$program" \
        --output_dir="$TEST_TMPDIR/$name" $flag "$@" 2>&1)
  code=$?
  echo "== $name: $n processes on the $where $*"
  echo "$out" | grep -E "$show" | sed 's/^\(\[rank [0-9]*\]\) [IWE][0-9 :.]*[a-z_]*\.cc:[0-9]*\]/\1/' | head -16
  if [[ $code -ne 0 || "$out" != *"$expect"* ]]; then
    echo "$out" | tail -30
    echo "FAIL: $name (exit $code)"
    record "$n" 1
  else
    record "$n" 0
  fi
}

skip() {  # name, reason
  echo "SKIPPED: $1: $2"
  skipped=$((skipped + 1))
}

variants_done() {
  local cuda="on CUDA"
  ((shared_gpu == 1)) && cuda="on CUDA, staged on shared GPUs"
  echo "variants: $((ran_cuda + ran_cpu)) ran ($ran_cuda $cuda, $ran_cpu on the CPU)," \
    "$skipped skipped, $failed failed"
  [[ $failed -eq 0 ]] && echo PASS
  [[ $failed -eq 0 ]]
}

leg() {  # name, processes, flags...
  local name=$1 n=$2
  shift 2
  timeout 300 "$launch" --nproc_per_node="$n" --master_port=0 "$program" \
    --output_dir="$TEST_TMPDIR/$name" $(placement "$n") "$@" > "$TEST_TMPDIR/$name.log" 2>&1
  local code=$?
  echo "== leg $name: $n processes on the $([[ -z "$(placement "$n")" ]] && echo CUDA || echo CPU) $*"
  if [[ $code -ne 0 ]]; then
    tail -30 "$TEST_TMPDIR/$name.log"; echo "FAIL: leg $name exited $code"
  fi
  record "$n" $code
  grep -o "LOSS .*" "$TEST_TMPDIR/$name.log" > "$TEST_TMPDIR/$name.losses"
}

continues() {  # reference leg, leg[, relative tolerance, default 1e-4]
  awk -v name="$2" -v tolerance="${3:-1e-4}" '
      NR == FNR { want[$2] = $3; next }
      { seen++; d = $3 - want[$2]; if (d < 0) d = -d; if (d / want[$2] > worst) worst = d / want[$2];
        if (!($2 in want) || d > tolerance * want[$2]) { print "step " $2 ": " $3 " vs " want[$2]; bad = 1 } }
      END { if (seen == 0) { print name ": no losses"; bad = 1 }
            printf "%s: %d resumed steps, max relative loss difference %.2g\n", name, seen, worst;
            exit bad }' \
      "$TEST_TMPDIR/$1.losses" "$TEST_TMPDIR/$2.losses"
}
