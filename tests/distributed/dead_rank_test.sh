#!/usr/bin/env bash
# A rank killed in the middle of a collective: the launcher and every other rank end, non-zero,
# within 60 s, and the launcher names the dead rank. 3 and 4 processes, Gloo on the CPU.
set -uo pipefail
launch="$1"
program="$2"
fail=0
for n in 3 4; do
  start=$SECONDS
  out=$(timeout 90 "$launch" --nproc_per_node="$n" --master_port=0 --grace_period_s=5 \
        "$program" --die_at=20 2>&1)
  code=$?
  elapsed=$((SECONDS - start))
  dead=$((n - 1))
  echo "$out" | grep -E "launch:|failed" | head -6
  echo "$n processes: exit $code after ${elapsed} s"
  if [[ $code -eq 0 || $code -eq 124 ]]; then echo "FAIL: exit $code"; fail=1; fi
  if (( elapsed >= 60 )); then echo "FAIL: took ${elapsed} s"; fail=1; fi
  if ! grep -q "launch: rank $dead was killed by signal SIGKILL" <<<"$out"; then
    echo "FAIL: the launcher did not name rank $dead"; fail=1
  fi
  if [[ $code -ne 137 ]]; then echo "FAIL: expected exit 137 (the dead rank's), got $code"; fail=1; fi
done
[[ $fail -eq 0 ]] && echo PASS
exit $fail
