#!/usr/bin/env bash
# FSDP2 through the real launcher: evaluate/predict before train, training equivalence with
# the LocalEngine, and a model sharded at load time adopted by a Trainer that names no engine.
# Worlds of 1 to 4 processes, one run per variant. On a CUDA host, variants needing more
# processes than GPUs run on the CPU (variants.sh), so every variant runs everywhere.
set -uo pipefail
launch="$1"
program="$2"
show="relative difference|groups unsharded|peak parameter|sharded at load time|built deferred|EQUIVALENT|MISMATCH|ERROR|Error"
source "$(dirname "$0")/variants.sh"

variant world1 1
variant world2 2
variant world3 3
variant world4 4
variant keep_after_forward 2 --reshard_after_forward=false
variant no_wrap 3 --wrap=none
variant size_wrap 2 --wrap=size
variant hsdp 4 --hsdp
variant checkpointing 3 --checkpointing
variant bf16 2 --bf16
variant sync_each_batch 3 --sync_each_batch
variant offload 2 --offload
variant adamw2 2 --optimizer=adamw
variant adamw_hsdp 4 --hsdp --optimizer=adamw
variant frozen_checkpointing3 3 --frozen --checkpointing --optimizer=adamw
variant uneven2 2 --uneven
variant uneven3 3 --uneven --optimizer=adamw

variants_done
