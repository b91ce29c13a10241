#!/usr/bin/env bash
# resume_from_checkpoint: latest continues only a checkpoint of the same run, with real
# tools/train processes on the demo job: run A saves checkpoint-2 and checkpoint-4; run B, of
# another configuration, is killed (SIGKILL) during its first save in the same output_dir, and
# restarted with latest: it must refuse A's checkpoint-4 (naming both run identities and the
# way out) instead of continuing it. A job with other data is refused too; run A's own
# configuration with more steps resumes; an explicit path continues whatever it names.
set -euo pipefail
train="$1"
config="$2"
out="${TEST_TMPDIR}/run"
logs="${TEST_TMPDIR}/logs"
mkdir -p "$logs"
common=(--config="$config" --set="args.output_dir=$out" --set=args.eval_strategy=NO
        --set=args.save_strategy=STEPS --set=args.save_steps=2 --set=args.local.device=cpu
        --set=args.save_only_model=false)
fail() { echo "FAIL: $*"; for f in "$logs"/*.log; do echo "--- $f"; tail -15 "$f"; done; exit 1; }

"$train" "${common[@]}" --set=args.max_steps=4 >"$logs/a.out" 2>"$logs/a.log" || fail "run A failed"
[[ -e "$out/checkpoint-4/trainer_state.textproto" ]] || fail "run A saved no checkpoint-4"

# Run B (another learning rate) is killed during its first save (checkpoint-2 unfinished).
set +e
CPPTRAIN_TEST_KILL_IN_SAVE_AT_STEP=2 "$train" "${common[@]}" --set=args.max_steps=4 \
  --set=args.learning_rate=1e-3 --set=args.overwrite_output_dir=false \
  >"$logs/b_killed.out" 2>"$logs/b_killed.log"
set -e
grep -q "killing rank 0 mid-save" "$logs/b_killed.log" || fail "run B was not killed in its first save"
[[ -d "$out/.tmp-checkpoint-2" ]] || fail "run B's unfinished save is not there"
# Restarted with latest, B must not continue A's checkpoint-4.
set +e
"$train" "${common[@]}" --set=args.max_steps=4 --set=args.learning_rate=1e-3 \
  --set=args.resume_from_checkpoint=latest >"$logs/b.out" 2>"$logs/b.log"
b_rc=$?
set -e
[[ $b_rc -ne 0 ]] || fail "run B continued run A's checkpoint (exit 0)"
grep -q "latest found $out/checkpoint-4, but another run saved it: its run identity is [0-9a-f]\{16\}, this job's is [0-9a-f]\{16\}" \
  "$logs/b.log" || fail "run B's refusal does not name the checkpoint and both identities"
grep -q "set resume_from_checkpoint to its path" "$logs/b.log" || fail "no way out named"
echo "run B refused (exit $b_rc): $(grep -o "latest found.*this job's is [0-9a-f]*" "$logs/b.log")"

# Other data, same arguments: refused as well.
set +e
"$train" "${common[@]}" --set=args.max_steps=6 --set=data.builtin_train_samples=2048 \
  --set=args.resume_from_checkpoint=latest >"$logs/data.out" 2>"$logs/data.log"
data_rc=$?
set -e
[[ $data_rc -ne 0 ]] && grep -q "but another run saved it" "$logs/data.log" ||
  fail "a job with other data continued run A's checkpoint (exit $data_rc)"

# Run A's configuration with more steps (max_steps is not part of the identity) resumes.
"$train" "${common[@]}" --set=args.max_steps=6 --set=args.resume_from_checkpoint=latest \
  >"$logs/a2.out" 2>"$logs/a2.log" || fail "run A's own resume failed"
grep -q "resumed from $out/checkpoint-4 at step 4" "$logs/a2.log" || fail "run A did not resume"

# The explicit path continues another run's checkpoint.
"$train" "${common[@]}" --set=args.max_steps=8 --set=args.learning_rate=1e-3 \
  --set="args.resume_from_checkpoint=$out/checkpoint-6" >"$logs/explicit.out" \
  2>"$logs/explicit.log" || fail "the explicit path was refused"
grep -q "resumed from $out/checkpoint-6 at step 6" "$logs/explicit.log" || fail "no resume"
echo PASS
