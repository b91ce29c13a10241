#!/usr/bin/env bash
# The whole bench verification path on the CPU, without a GPU: tools/bench (Bazel build) beside
# tools/bench_torch.py on the tiny model in fp32, through tools/bench_compare.py, on 1 and 2
# processes, at a learning rate (1e-2) at which the tiny model's loss falls within the run; then
# the check must fail when one side gets other weights, other tokens or another weight decay,
# or when bench_torch.py injects a fault (a no-op optimizer, a gradient 1.002x, other tokens);
# and the PyTorch configurations that run on the CPU (compiled with the loss inside, native GQA,
# a compiled AdamW, transformers' model with activation checkpointing) pass. Creates a
# virtualenv with CPU-usable torch, safetensors and transformers from PyPI when VENV (default
# /tmp/cpptrain_bench_venv) has none (about 5 GiB: PyPI's torch brings CUDA libraries).
#   tools/bench_cpu_check.sh            # about 5 minutes once torch is installed
#   VENV=/path/to/venv JSONL=docs/benchmarks/<date>-cpu-tiny.jsonl tools/bench_cpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
venv="${VENV:-/tmp/cpptrain_bench_venv}"
if ! "$venv/bin/python" -c 'import torch, safetensors, transformers' 2>/dev/null; then
  python3 -m venv "$venv" && "$venv/bin/pip" install -q torch safetensors numpy transformers ||
    exit 2
fi
# Before the virtualenv joins PATH: Bazel's actions see PATH, and another one rebuilds all.
bazel build //tools:bench //tools:launch || exit 2
export PATH="$venv/bin:$PATH"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# JSONL=file keeps the raw lines of the cases that must pass (the others go to $work).
compare() {  # init_dir, nproc, engine, more flags...
  local init=$1 n=$2 engine=$3; shift 3
  python3 tools/bench_compare.py --launch bazel-bin/tools/launch --bench bazel-bin/tools/bench \
    --device cpu --bf16 false --model tiny --seq_len 32 --micro_batch 2 --steps 4 --warmup 2 \
    --learning_rate 1e-2 --ours_arg=--use_cpu --init_dir "$init" --nproc "$n" --engine "$engine" \
    "$@"
}
failed=0
expect() {  # want (pass|fail), name, compare arguments...
  local want=$1 name=$2; shift 2
  local jsonl="$work/runs.jsonl"
  [[ $want == pass && -n "${JSONL:-}" ]] && jsonl="$JSONL"
  compare "$@" --jsonl "$jsonl" >"$work/$name.log" 2>&1
  local code=$?
  if [[ ($want == pass && $code == 0) || ($want == fail && $code == 1) ]]; then
    echo "ok   $name (exit $code)"
  else
    echo "FAIL $name: exit $code, expected the check to $want"; failed=1
  fi
  grep -E '^largest|^  .* differ' "$work/$name.log" | sed 's/^/     /'
}
expect pass local_1 "$work/init" 1 local --runs 3
expect pass ddp_2 "$work/init" 2 ddp --runs 3
expect pass fsdp2_2 "$work/init" 2 fsdp2 --runs 3
expect pass fsdp1_2 "$work/init" 2 fsdp1 --runs 3

# Other weights on PyTorch's side: the same tokens, every matrix perturbed.
cp -r "$work/init" "$work/other"
python3 - "$work/other/model.safetensors" <<'EOF'
import sys, torch
from safetensors.torch import load_file, save_file
state = load_file(sys.argv[1])
gen = torch.Generator().manual_seed(1)
save_file({k: v + 0.01 * torch.randn(v.shape, generator=gen) if v.dim() == 2 else v
           for k, v in state.items()}, sys.argv[1], metadata={"format": "pt"})
EOF
expect fail other_weights "$work/init" 1 local --runs 1 --torch_arg=--init_dir="$work/other"

# Other tokens in PyTorch's first step.
cp -r "$work/init" "$work/tokens"
python3 - "$work/tokens/tokens-markov-w1-ga1-mb2-seq32-steps6-rank0.safetensors" <<'EOF'
import sys, torch
from safetensors.torch import load_file, save_file
ids = load_file(sys.argv[1])["input_ids"]
ids[0] = torch.randint(64, ids[0].shape, generator=torch.Generator().manual_seed(7))
save_file({"input_ids": ids}, sys.argv[1], metadata={"format": "pt"})
EOF
expect fail other_tokens "$work/tokens" 1 local --runs 1

# Another weight decay on PyTorch's side: six steps of decay 0.1 at 1e-2 shrink every matrix by
# about 0.6%, which moves param_checksum (the sum of squares, mostly the norms' ones on this
# model) by 9e-4: under the bf16 default of 1e-3, but fp32 runs agree to about 1e-8.
expect fail weight_decay "$work/init" 1 local --runs 1 --torch_arg=--weight_decay=0.1 \
  --checksum_tolerance 1e-5
expect pass same_weight_decay "$work/init" 1 local --runs 1 --weight_decay 0.1 \
  --checksum_tolerance 1e-5

# Faults injected on PyTorch's side (tools/bench_fault_test.sh injects them into ours in CI).
for fault in noop_optimizer scaled_gradient other_tokens; do
  expect fail "torch_$fault" "$work/init" 1 local --runs 1 --torch_arg=--inject_fault=$fault
done
# The configurations of TORCH_CONFIGS that run on the CPU (Liger needs CUDA; graphs too).
expect pass sweep_local "$work/init" 1 local --runs 1 \
  --torch_sweep eager,compiled-model,compiled-full,compiled-full-adamw
expect pass sweep_ddp_2 "$work/init" 2 ddp --runs 1 --torch_sweep eager,compiled-full
# transformers' model compiled whole, unwrapped and under DDP's wrapper (graphs need CUDA: on
# the CPU reduce-overhead compiles without them).
expect pass sweep_hf "$work/init" 1 local --runs 1 --torch_impl hf \
  --torch_sweep compiled-model-graphs,compiled-model-graphs-ddp
# transformers' model with activation checkpointing on both sides (bench_torch.py refuses to run
# when transformers' layers would not checkpoint, as they did not in eval mode before 2026-12-06).
expect pass hf_checkpointing "$work/init" 1 local --runs 1 --torch_impl hf --torch_config eager \
  --ours_arg=--activation_checkpointing --torch_arg=--activation_checkpointing
((failed)) && { echo "bench_cpu_check: FAILED"; exit 1; }
echo "bench_cpu_check: every case as expected"
