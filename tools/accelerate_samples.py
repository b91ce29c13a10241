#!/usr/bin/env python3
"""Writes config/testdata/accelerate/: `accelerate config` YAML files made by Accelerate's own
config class (ClusterConfig.to_yaml_file, what `accelerate config` calls), for the tests of
config/accelerate_yaml.h and config/accelerate_config.h, and a DeepSpeed JSON in the form
Hugging Face's docs give (ZeRO-2 with "auto" values) that one sample names.

Needs the accelerate package (and the torch it imports):
  python3 -m venv /tmp/acc && /tmp/acc/bin/pip install accelerate
  /tmp/acc/bin/python tools/accelerate_samples.py config/testdata/accelerate
"""
import json
import os
import sys

from accelerate.commands.config.config_args import ClusterConfig
from accelerate.utils import ComputeEnvironment, DistributedType


def cluster(distributed_type, mixed_precision="no", num_processes=2, **extra):
    return ClusterConfig(
        compute_environment=ComputeEnvironment.LOCAL_MACHINE,
        distributed_type=distributed_type,
        mixed_precision=mixed_precision,
        use_cpu=False,
        debug=False,
        num_processes=num_processes,
        **extra,
    )


SAMPLES = {
    # What `accelerate config` writes for plain DDP on one machine with bf16.
    "multi_gpu_bf16.yaml": cluster(DistributedType.MULTI_GPU, "bf16", gpu_ids="all"),
    "multi_cpu.yaml": cluster(DistributedType.MULTI_CPU, main_process_port=0),
    # FSDP1, as the HF FSDP guide's sample: FULL_SHARD, layers wrapped by class.
    "fsdp1_full_shard.yaml": cluster(
        DistributedType.FSDP,
        fsdp_config={
            "fsdp_version": 1,
            "fsdp_reshard_after_forward": "FULL_SHARD",
            "fsdp_offload_params": False,
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_transformer_layer_cls_to_wrap": "LlamaDecoderLayer",
            "fsdp_backward_prefetch": "BACKWARD_PRE",
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_forward_prefetch": False,
            "fsdp_use_orig_params": True,
            # False in this sample; fsdp2.yaml sets it (FSDP1 honours it as well: each rank
            # reads only its own rows of a pretrained model).
            "fsdp_cpu_ram_efficient_loading": False,
            "fsdp_sync_module_states": True,
            "fsdp_activation_checkpointing": False,
        },
    ),
    "fsdp2.yaml": cluster(
        DistributedType.FSDP,
        fsdp_config={
            "fsdp_version": 2,
            "fsdp_reshard_after_forward": True,
            "fsdp_offload_params": False,
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_transformer_layer_cls_to_wrap": "LlamaDecoderLayer",
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_cpu_ram_efficient_loading": True,
            "fsdp_activation_checkpointing": False,
        },
    ),
    "deepspeed_zero3.yaml": cluster(
        DistributedType.DEEPSPEED,
        deepspeed_config={
            "gradient_accumulation_steps": 1,
            "offload_optimizer_device": "none",
            "offload_param_device": "none",
            # False in this sample; accelerate_config_test checks that true reaches
            # zero.zero3_init_flag (each ZeRO-3 rank then reads only its own rows).
            "zero3_init_flag": False,
            "zero3_save_16bit_model": True,
            "zero_stage": 3,
        },
    ),
    "deepspeed_zero2_offload.yaml": cluster(
        DistributedType.DEEPSPEED,
        deepspeed_config={
            "gradient_accumulation_steps": 2,
            "gradient_clipping": 1.0,
            "offload_optimizer_device": "cpu",
            "offload_param_device": "none",
            "zero3_init_flag": False,
            "zero_stage": 2,
        },
    ),
    "deepspeed_config_file.yaml": cluster(
        DistributedType.DEEPSPEED,
        deepspeed_config={
            "deepspeed_config_file": "ds_config_zero2.json",
            "zero3_init_flag": False,
        },
    ),
}

# ZeRO-2 as Hugging Face's DeepSpeed guide writes it, "auto" where the Trainer fills values in.
DS_CONFIG_ZERO2 = {
    "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000,
             "initial_scale_power": 16, "hysteresis": 2, "min_loss_scale": 1},
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                               "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                  "warmup_num_steps": "auto"}},
    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "none"},
                          "allgather_partitions": True, "allgather_bucket_size": 2e8,
                          "overlap_comm": True, "reduce_scatter": True,
                          "reduce_bucket_size": 2e8, "contiguous_gradients": True},
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "config/testdata/accelerate"
    os.makedirs(out, exist_ok=True)
    for name, config in SAMPLES.items():
        config.to_yaml_file(os.path.join(out, name))
    with open(os.path.join(out, "ds_config_zero2.json"), "w") as f:
        json.dump(DS_CONFIG_ZERO2, f, indent=2)
        f.write("\n")
    print(f"wrote {len(SAMPLES) + 1} files to {out}")


if __name__ == "__main__":
    main()
