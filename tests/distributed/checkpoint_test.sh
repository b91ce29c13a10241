#!/usr/bin/env bash
# Checkpoints written by one engine on one world size resume on another, AdamW state included:
# FSDP on 4 ranks (sharded checkpoint) -> DDP on 2 -> one local process -> FSDP on 2 ranks
# (full-model checkpoint), FSDP 4 -> DDP 3 -> FSDP 2, and FSDP 4 -> FSDP 2, each leg resuming
# from the previous leg's checkpoint. The same global batches run in every leg, so each
# resumed step's loss must equal the uninterrupted 4-rank run's. Then a run killed in the
# middle of a save: the unfinished checkpoint is never picked, and resuming from the previous
# one continues exactly. Then preemption: SIGTERM on one rank, and SIGTERM to the launcher,
# each saving a checkpoint and exiting 143, and a resume from it continuing exactly. Then
# restarts: a rank SIGKILLed mid-run, the launcher's --max_restarts, a resume from the newest
# checkpoint, and a final model equal to an uninterrupted run's bit for bit (on the CPU). Legs
# with more processes than GPUs run on the CPU.
set -uo pipefail
launch="$1"
program="$2"
fail=0
# Each leg runs on the GPUs when the host has enough, else on the CPU (variants.sh).
source "$(dirname "$0")/variants.sh"
big=4

leg fsdp4 "$big" --engine=fsdp
ls "$TEST_TMPDIR/fsdp4/checkpoint-2"
leg ddp2 2 --engine=ddp --resume="$TEST_TMPDIR/fsdp4/checkpoint-2"
leg local1 1 --engine=local --resume="$TEST_TMPDIR/ddp2/checkpoint-4"
leg fsdp2 2 --engine=fsdp_full --resume="$TEST_TMPDIR/local1/checkpoint-6"
checked="ddp2 local1 fsdp2 fsdp4to2 resumed_after_kill ddp3 fsdp2b"
leg ddp3 3 --engine=ddp --resume="$TEST_TMPDIR/fsdp4/checkpoint-2"
leg fsdp2b 2 --engine=fsdp --resume="$TEST_TMPDIR/ddp3/checkpoint-4"
leg fsdp4to2 2 --engine=fsdp --resume="$TEST_TMPDIR/fsdp4/checkpoint-8"

# Killed while saving checkpoint-4 (after the shard files, before the rename).
CPPTRAIN_TEST_KILL_IN_SAVE_AT_STEP=4 timeout 300 "$launch" --nproc_per_node=2 --master_port=0 \
  "$program" --engine=fsdp --output_dir="$TEST_TMPDIR/killed" $(placement 2) \
  > "$TEST_TMPDIR/killed.log" 2>&1
code=$?
if [[ $code -eq 0 || $code -eq 124 ]]; then
  echo "FAIL: the killed run should fail (exit $code)"; fail=1
fi
if [[ -e "$TEST_TMPDIR/killed/checkpoint-4" || ! -d "$TEST_TMPDIR/killed/checkpoint-2" ]]; then
  echo "FAIL: after a kill mid-save, checkpoint-2 must be intact and checkpoint-4 absent"; fail=1
fi
ls -a "$TEST_TMPDIR/killed"
leg resumed_after_kill 2 --engine=fsdp --output_dir="$TEST_TMPDIR/killed" --resume=latest
if compgen -G "$TEST_TMPDIR/killed/.tmp-*" > /dev/null; then
  echo "FAIL: the next save should clear the unfinished checkpoint"; fail=1
fi

# Preemption, from inside: the last rank gets SIGTERM after step 4; every rank stops after
# step 5 (the signal rides in that step's all-reduce), checkpoint-5 is saved, and the exit
# code is 128 + 15. Then a resume from latest continues the uninterrupted run's losses.
timeout 300 "$launch" --nproc_per_node=2 --master_port=0 "$program" --engine=fsdp \
  --output_dir="$TEST_TMPDIR/sigterm" --sigterm_at_step=4 $(placement 2) \
  > "$TEST_TMPDIR/sigterm.log" 2>&1
code=$?
stopped=$(grep -o "STOPPED [0-9]*" "$TEST_TMPDIR/sigterm.log" | cut -d' ' -f2)
echo "== sigterm: 2 processes, SIGTERM on rank 1 after step 4: exit $code," \
  "stopped after step $stopped"
saved="$TEST_TMPDIR/sigterm/checkpoint-5/trainer_state.textproto"
if [[ $code -ne 143 || "$stopped" != 5 || ! -f "$saved" ]]; then
  grep -E "Terminated|launch:|ERROR" "$TEST_TMPDIR/sigterm.log" | head; ls "$TEST_TMPDIR/sigterm"
  echo "FAIL: SIGTERM should save checkpoint-5 and exit 143"; fail=1
fi
record 2 $(( code == 143 ? 0 : 1 ))
leg sigterm_resumed 2 --engine=ddp --output_dir="$TEST_TMPDIR/sigterm" --resume=latest
checked="$checked sigterm_resumed"

# Preemption through the launcher: SIGTERM to the launcher once training is under way; it
# forwards it, the ranks save and exit, and it exits 143. --foreground: otherwise timeout
# passes the SIGTERM on twice (to the launcher and to its process group), and the launcher
# takes the second one as "SIGKILL now": no checkpoint, in 2 of 5 runs here.
timeout --foreground 300 "$launch" --nproc_per_node=2 --master_port=0 "$program" --engine=ddp \
  --output_dir="$TEST_TMPDIR/forwarded" --max_steps=100000 $(placement 2) \
  > "$TEST_TMPDIR/forwarded.log" 2>&1 &
launcher_pid=$!
for _ in $(seq 600); do
  grep -q '"step":3}' "$TEST_TMPDIR/forwarded.log" 2>/dev/null && break
  sleep 0.1
done
kill -TERM "$launcher_pid"
wait "$launcher_pid"
code=$?
stopped=$(grep -o "STOPPED [0-9]*" "$TEST_TMPDIR/forwarded.log" | cut -d' ' -f2)
echo "== forwarded: SIGTERM to the launcher at step >= 3: exit $code," \
  "stopped after step $stopped"
grep -E "launch: got|Terminated: saved" "$TEST_TMPDIR/forwarded.log" | head -3
saved="$TEST_TMPDIR/forwarded/checkpoint-$stopped/trainer_state.textproto"
if [[ $code -ne 143 || -z "$stopped" || ! -f "$saved" ]]; then
  tail -20 "$TEST_TMPDIR/forwarded.log"
  echo "FAIL: a SIGTERM to the launcher should save a checkpoint and exit 143"; fail=1
fi
record 2 $(( code == 143 ? 0 : 1 ))

# Restarts, on the CPU (where bitwise is the claim): the last rank is SIGKILLed after step 5 on
# the first attempt only (--kill_at_step looks at TORCHELASTIC_RESTART_COUNT); the launcher
# restarts both ranks (--max_restarts=1), which resume from the newest checkpoint the way a
# user's job script does: --resume=latest once output_dir holds a checkpoint. The final
# checkpoint's tensors (parameters, optimizer state, RNG) equal an uninterrupted run's bit for
# bit, and so does every loss the restarted attempt trained.
wrapper="$TEST_TMPDIR/resume_if_saved.sh"
cat > "$wrapper" <<'EOF'
#!/usr/bin/env bash
# OUTPUT_DIR PROGRAM ARGS...: resumes from output_dir's newest checkpoint when it has one.
dir=$1
shift
resume=()
compgen -G "$dir/checkpoint-*" > /dev/null && resume=(--resume=latest)
exec "$@" --output_dir="$dir" "${resume[@]}"
EOF
chmod +x "$wrapper"
for engine in ddp fsdp; do
  ok=0
  ref="$TEST_TMPDIR/uninterrupted_$engine"
  out="$TEST_TMPDIR/restarted_$engine"
  timeout 300 "$launch" --nproc_per_node=2 --master_port=0 "$program" --engine=$engine --use_cpu \
    --output_dir="$ref" > "$ref.log" 2>&1 || { tail -20 "$ref.log"; ok=1; }
  timeout 300 "$launch" --nproc_per_node=2 --master_port=0 --max_restarts=1 "$wrapper" "$out" \
    "$program" --engine=$engine --use_cpu --kill_at_step=5 > "$out.log" 2>&1
  code=$?
  echo "== restarted_$engine: 2 processes on the CPU, rank 1 SIGKILLed after step 5," \
    "--max_restarts=1: exit $code"
  grep -E "^launch:" "$out.log" | head -4
  if [[ $code -ne 0 ]]; then tail -20 "$out.log"; ok=1; fi
  grep -q "launch: rank 1 was killed by signal SIGKILL" "$out.log" &&
    grep -q "launch: restarting all 2 ranks (restart 1 of 1)" "$out.log" ||
    { echo "FAIL: the launcher should report rank 1's SIGKILL and restart once"; ok=1; }
  want=$(grep -o "LOSS .*" "$ref.log" | awk '$2 > 4')
  got=$(grep -o "LOSS .*" "$out.log")
  if [[ -z "$want" || "$got" != "$want" ]]; then
    echo "FAIL: the restart should train steps 5-10 from checkpoint-4 with the uninterrupted" \
      "run's losses, to the last digit:"; diff <(echo "$want") <(echo "$got"); ok=1
  fi
  tensors=0
  for file in "$ref/checkpoint-10"/*.safetensors; do
    tensors=$((tensors + 1))
    cmp "$file" "$out/checkpoint-10/${file##*/}" || ok=1
  done
  (( tensors > 0 )) || ok=1
  (( ok )) || echo "restarted_$engine: steps 5-10 resumed from checkpoint-4; losses and the" \
    "$tensors tensor files of checkpoint-10 equal the uninterrupted run's bit for bit"
  record 2 $ok cpu
done

for name in $checked; do
  if ! continues fsdp4 "$name"; then
    echo "FAIL: $name does not continue the 4-rank run"; fail=1
  fi
done
first=$(head -1 "$TEST_TMPDIR/local1.losses" | cut -d' ' -f2)
[[ "$first" == "5" ]] || { echo "FAIL: local1 should start at step 5, starts at $first"; fail=1; }
first=$(head -1 "$TEST_TMPDIR/resumed_after_kill.losses" | cut -d' ' -f2)
[[ "$first" == "3" ]] || { echo "FAIL: resuming after the kill should start at step 3, starts at $first"; fail=1; }
last=$(tail -1 "$TEST_TMPDIR/resumed_after_kill.losses" | cut -d' ' -f2)
[[ "$last" == "10" ]] || { echo "FAIL: resuming after the kill should reach step 10, reached $last"; fail=1; }
[[ -f "$TEST_TMPDIR/fsdp2/checkpoint-8/model.safetensors" ]] ||
  { echo "FAIL: fsdp.state_dict_type FULL_STATE_DICT should write model.safetensors"; fail=1; }
last_shard=$(printf "shard-%05d-of-%05d.safetensors" $((big - 1)) "$big")
[[ -f "$TEST_TMPDIR/fsdp4/checkpoint-2/$last_shard" ]] ||
  { echo "FAIL: a sharded $big-rank checkpoint should hold $big shard files"; fail=1; }

# The checks across legs count as one more.
(( fail )) && failed=$((failed + 1))
variants_done
