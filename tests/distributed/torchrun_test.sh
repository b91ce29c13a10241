#!/usr/bin/env bash
# tools/train under the real torchrun of the current PyPI torch (tools/install_torchrun.sh puts
# it in $CPPTRAIN_VENV, or in a virtualenv here), 2 processes on the CPU over Gloo, the demo
# job for 3 steps:
#   - with torchrun's agent store (--standalone's default and the static rendezvous': every
#     worker sees TORCHELASTIC_USE_AGENT_STORE=True), under DDP (the default engine), FSDP2
#     and ZeRO-3;
#   - without it (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: the workers see
#     TORCHELASTIC_USE_AGENT_STORE=False, rank 0 hosts the store at MASTER_PORT), under DDP
#     and FSDP2.
# Each run must finish its 3 steps as one job of world 2 (one writer of metrics.jsonl) with
# the losses tools/launch gives the same engine. Before the agent store was understood, the
# first kind hung until ddp_timeout ("missing ranks: []"); ddp_timeout is 120 s here so a
# hang fails the test rather than its time limit.
set -euo pipefail
train="$1"
config="$2"
launch="$3"
installer="$4"
fail() { echo "FAIL: $1"; [[ -n "${2:-}" ]] && tail -40 "$2"; exit 1; }

venv="${CPPTRAIN_VENV:-$TEST_TMPDIR/venv}"
source "$(dirname "${BASH_SOURCE[0]}")/../../tools/pypi_python.sh"
"$installer" "$venv" || pypi_skip_or_fail torchrun_test "torch's torchrun"
torchrun="$venv/bin/torchrun"
echo "torchrun of torch $("$venv/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null)"

source "$(dirname "$0")/demo_job.sh"

# tools/launch's run of each engine: the losses torchrun's runs must match.
declare -A want
for engine in ddp fsdp2 zero3; do
  out="$TEST_TMPDIR/launch_$engine"
  timeout 300 "$launch" --nproc_per_node=2 --master_port=0 "$train" "${common[@]}" \
    "$(engine_flag "$engine")" --set="args.output_dir=$out" >/dev/null 2>"$out.log" ||
    fail "tools/launch with $engine failed" "$out.log"
  want[$engine]=$(losses "$out")
done

# run NAME ENGINE AGENT(True|False) TORCHRUN_ARGS...: torchrun starts bash, which records the
# worker's TORCHELASTIC_USE_AGENT_STORE and becomes tools/train.
run() {
  local name=$1 engine=$2 agent=$3; shift 3
  local out="$TEST_TMPDIR/$name" start=$SECONDS
  mkdir -p "$out.seen"
  timeout 300 "$torchrun" "$@" --nproc_per_node 2 --no-python /bin/bash -c \
    'echo "${TORCHELASTIC_USE_AGENT_STORE:-unset}" >"$0/rank$RANK"; exec "$@"' "$out.seen" \
    "$train" "${common[@]}" "$(engine_flag "$engine")" --set="args.output_dir=$out" \
    >"$out.log" 2>&1 || fail "$name: torchrun exited $?" "$out.log"
  local seen
  seen=$(cat "$out.seen/rank0" "$out.seen/rank1" | sort -u | tr '\n' ' ')
  [[ "$seen" == "$agent " ]] ||
    fail "$name: the workers saw TORCHELASTIC_USE_AGENT_STORE=$seen, the test wanted $agent"
  grep -q "on cpu, world 2, run $out" "$out.log" ||
    fail "$name: the run did not train as one job of world 2" "$out.log"
  local got
  got=$(losses "$out")
  [[ "$(wc -w <<<"$got")" -eq 3 ]] || fail "$name: metrics.jsonl has losses '$got', not 3 steps" "$out.log"
  [[ "$got" == "${want[$engine]}" ]] ||
    fail "$name: losses $got differ from tools/launch's ${want[$engine]}"
  echo "ok   $name: agent store $agent, $engine, losses $got($((SECONDS - start)) s)"
}

for engine in ddp fsdp2 zero3; do
  run "standalone_agent_$engine" "$engine" True --standalone
done
port=$("$venv/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
run static_agent_ddp ddp True --nnodes 1 --master_addr 127.0.0.1 --master_port "$port"
for engine in ddp fsdp2; do
  TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 run "standalone_own_store_$engine" "$engine" False --standalone
done
echo "torchrun: 6 runs passed"
