#!/usr/bin/env bash
# FSDP1 (fsdp { version: 1 }, flat parameters) through the real launcher: evaluate/predict
# before train, training equivalence with the LocalEngine (losses at each of 5 steps and the
# gathered parameters, relative 1e-5), and a model flat-sharded at load time adopted by a
# Trainer that names no engine. Worlds of 2 to 4 processes; the tiny decoder's parameter sizes
# are not multiples of 3 or 4. AdamW (weight-decay groups by name) unless a variant says SGD.
set -uo pipefail
launch="$1"
program="$2"
show="relative difference|unsharded at once|sharded at load time|EQUIVALENT|MISMATCH|ERROR|Error"
source "$(dirname "$0")/variants.sh"

variant full_shard2 2 --strategy=FULL_SHARD --optimizer=adamw
variant full_shard3 3 --strategy=FULL_SHARD --optimizer=adamw
variant full_shard4 4 --strategy=FULL_SHARD --optimizer=adamw
variant shard_grad_op3 3 --strategy=SHARD_GRAD_OP --optimizer=adamw
variant no_shard3 3 --strategy=NO_SHARD --optimizer=adamw
variant hybrid_shard4 4 --strategy=HYBRID_SHARD --optimizer=adamw
variant hybrid_zero2_4 4 --strategy=HYBRID_SHARD_ZERO2 --optimizer=adamw
variant backward_post3 3 --backward_prefetch=BACKWARD_POST --optimizer=adamw
variant no_prefetch2 2 --backward_prefetch=NO_PREFETCH --forward_prefetch --optimizer=adamw
variant sync_each_batch3 3 --sync_each_batch --optimizer=adamw
variant checkpointing3 3 --checkpointing --optimizer=adamw
variant offload2 2 --offload --optimizer=adamw
variant frozen3 3 --frozen --optimizer=adamw
variant frozen_checkpointing4 4 --frozen --checkpointing --strategy=SHARD_GRAD_OP --optimizer=adamw
variant no_wrap3 3 --wrap=none --optimizer=adamw
variant size_wrap2 2 --wrap=size --optimizer=adamw
variant sgd3 3 --strategy=SHARD_GRAD_OP
variant uneven3 3 --uneven --optimizer=adamw

variants_done
