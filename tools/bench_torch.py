#!/usr/bin/env python3
"""PyTorch's own engines on the same model, weights and tokens as //tools:bench.

  torchrun --standalone --nproc_per_node 4 tools/bench_torch.py --engine ddp --init_dir DIR
  torchrun --standalone --nproc_per_node 4 tools/bench_torch.py --engine fsdp2 --init_dir DIR
  torchrun --standalone --nproc_per_node 4 tools/bench_torch.py --engine fsdp1 --init_dir DIR
  torchrun --standalone --nproc_per_node 1 tools/bench_torch.py --device cpu --model tiny \
      --init_dir DIR --seq_len 16 --micro_batch 2
  torchrun --standalone --nproc_per_node 1 tools/bench_torch.py --engine zero --stage 2 \
      --offload_optimizer cpu --init_dir DIR       # DeepSpeed (tools/install_deepspeed_wheels.sh)
  torchrun --standalone --nproc_per_node 4 tools/bench_torch.py --engine zero_redundancy ...
  torchrun --standalone --nproc_per_node 1 tools/bench_torch.py --engine fsdp2_offload ...

With --init_dir (written by tools/bench first) the model is the one in DIR (config.json and
model.safetensors, Hugging Face names) and each step trains on the token ids tools/bench's rank
of the same number trained on (DIR/tokens-w<world>-ga<accum>-mb<micro>-seq<seq>-steps<steps>-
rank<rank>.safetensors), so first_loss and last_loss are comparable with tools/bench's. Without
it: the shape from CONFIGS, weights normal(0, 0.02), random tokens.

The same settings as tools/bench's Trainer: AdamW (fused on CUDA) with the learning rate, betas,
eps and weight decay of TrainingArguments (decay on matrices only, as Hugging Face groups them),
gradient clipping at 1.0, the loss summed over shifted labels in fp32 and divided by the number
of targets, computed in a function so the logits are freed before backward. ddp and local: bf16
autocast with fp32 parameters (--bf16); fsdp2: fully_shard per layer and on the root with
MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32); fsdp1: FullyShardedDataParallel
(FULL_SHARD, each decoder layer its own flat parameter, use_orig_params=True, BACKWARD_PRE,
limit_all_gathers, MixedPrecision(param_dtype=bf16, reduce_dtype=fp32)), as tools/bench
--engine=fsdp1 configures its FSDP1 (fsdp { version: 1 }), clipping through FSDP's
clip_grad_norm_ (the norm over every shard) and no_sync() for the non-final micro-batches.

ZeRO counterparts (tools/bench --engine=zero --set=args.zero.stage=N ...):
  zero: DeepSpeed's engine (deepspeed.initialize), stage --stage, --offload_optimizer cpu and
    --offload_param cpu (stage 3) with pinned host memory, DeepSpeed's own AdamW from the config
    (FusedAdam on the GPU, DeepSpeedCPUAdam when offloaded) with the same lr, betas, eps and
    decay groups, "bf16": {"enabled": true} (bf16 parameters and fp32 master weights),
    "gradient_clipping" 1.0, overlap_comm, contiguous_gradients and the bucket sizes of
    ZeroConfig's defaults (proto/engines.proto); --ds_config FILE merges keys over that. The
    model is built in fp32 on the CPU from --init_dir, and DeepSpeed casts and moves it.
  zero_redundancy: DistributedDataParallel with torch.distributed.optim.ZeroRedundancyOptimizer
    around AdamW (fused on CUDA), bf16 autocast as ddp.
  fsdp2_offload: fsdp2 with fully_shard(offload_policy=CPUOffloadPolicy(pin_memory=True)); the
    AdamW steps the CPU shards (torch's fused CPU kernel where it has one, 2.4+).
Every JSON line also carries zero_stage, offload_optimizer, offload_param (null where they do not
apply), host_peak_gib (the largest rank's peak resident set, getrusage) and peak_by_phase_gib
(CUDA: the largest rank's peak allocated memory in each phase, as tools/bench's: setup up to the
first forward, forward with the loss, backward, and the optimizer step with the host work up
to the next forward; the largest is peak_memory_gib).

--impl native: the Qwen3/Llama decoder of models/decoder.cc written here in plain PyTorch, its
modules named as Hugging Face's. --impl hf: transformers' AutoModelForCausalLM from --init_dir.
--compile: torch.compile of each decoder layer (fsdp2, ddp: so gradients still come out layer by
layer for the collectives to overlap) or of the whole model (local), before wrapping.

--profile_steps N: device time per kernel family over the last N timed steps (torch.profiler),
printed to stderr as tools/bench --profile_steps prints ours (the same families, plus
"compiled (triton)" for torch.compile's kernels), so the two tables compare line by line.

Prints one JSON line with the same fields and formulas as the C++ bench.
"""
import argparse
import contextlib
import json
import math
import os
import re
import resource
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

# Shapes used without --init_dir, in config.json's field names (models/configs.cc).
CONFIGS = {
    "qwen3-0.6b": dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                       num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=128, tie_word_embeddings=True, rope_theta=1e6,
                       rms_norm_eps=1e-6, qk_norm=True),
    "llama3-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                      num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                      head_dim=128, tie_word_embeddings=False, rope_theta=5e5,
                      rms_norm_eps=1e-5, qk_norm=False),
    "tiny": dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                 tie_word_embeddings=True, rope_theta=10000, rms_norm_eps=1e-6, qk_norm=True),
}

# TrainingArguments' AdamW defaults (proto/training_args.proto), which tools/bench keeps.
ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8


def config_from_json(path, impl="native"):
    """The decoder shape of a Hugging Face config.json: llama or qwen3 for --impl native (the
    decoder written here), any decoder transformers knows for --impl hf (the shape then serves
    only the FLOP count)."""
    with open(path) as f:
        j = json.load(f)
    if impl == "native" and j.get("model_type") not in ("llama", "qwen3"):
        raise SystemExit(f"{path}: model_type {j.get('model_type')!r} is not llama or qwen3, "
                         "which --impl native builds: give --impl hf for transformers' model")
    if impl == "native" and j.get("attention_bias"):
        raise SystemExit(f"{path}: attention_bias is true; the native model has no biases "
                         "(use --impl hf)")
    heads = j["num_attention_heads"]
    head_dim = j.get("head_dim") or (128 if j["model_type"] == "qwen3"
                                     else j["hidden_size"] // heads)
    theta = j.get("rope_theta") or j.get("rope_parameters", {}).get("rope_theta", 10000.0)
    return dict(vocab_size=j["vocab_size"], hidden_size=j["hidden_size"],
                intermediate_size=j["intermediate_size"],
                num_hidden_layers=j["num_hidden_layers"], num_attention_heads=heads,
                num_key_value_heads=j.get("num_key_value_heads") or heads, head_dim=head_dim,
                tie_word_embeddings=j.get("tie_word_embeddings", False), rope_theta=theta,
                rms_norm_eps=j.get("rms_norm_eps", 1e-6), qk_norm=j["model_type"] == "qwen3",
                attn_logit_softcapping=j.get("attn_logit_softcapping"))


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


def apply_rotary(x, cos, sin):
    a, b = x.chunk(2, dim=-1)
    return x * cos.to(x.dtype) + torch.cat((-b, a), dim=-1) * sin.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, d = c["hidden_size"], c["head_dim"]
        self.heads, self.kv_heads, self.head_dim = c["num_attention_heads"], c["num_key_value_heads"], d
        self.q_proj = nn.Linear(h, self.heads * d, bias=False)
        self.k_proj = nn.Linear(h, self.kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, self.kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.heads * d, h, bias=False)
        self.qk_norm = c["qk_norm"]
        self.native_gqa = c.get("attention") == "gqa"  # SDPA's enable_gqa (torch 2.5+)
        if self.qk_norm:
            self.q_norm = RMSNorm(d, c["rms_norm_eps"])
            self.k_norm = RMSNorm(d, c["rms_norm_eps"])

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rotary(q.transpose(1, 2), cos, sin).to(v.dtype)
        k = apply_rotary(k.transpose(1, 2), cos, sin).to(v.dtype)
        groups = self.heads // self.kv_heads
        if groups > 1 and self.native_gqa:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            if groups > 1:
                k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, i = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])

    def forward(self, x, cos, sin):
        h = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return h + self.mlp(self.post_attention_layernorm(h))


class Body(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(Layer(c) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])


def summed_cross_entropy(logits, labels):
    """Cross-entropy summed in fp32 over the rows of `logits` [N, V]."""
    return F.cross_entropy(logits.float(), labels, reduction="sum")


def liger_summed_cross_entropy(h, weight, labels):
    """Liger's fused linear cross-entropy (liger-kernel): the logits never exist whole. Under
    autocast both operands go in as the autocast dtype, as the eager head's matmul would."""
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy
    dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else h.dtype
    return liger_fused_linear_cross_entropy(h.to(dtype), weight.to(dtype), labels,
                                            reduction="sum", accum_dtype=torch.float32)


class Decoder(nn.Module):
    """Parameter names as Hugging Face's: model.embed_tokens.weight, model.layers.N..., lm_head.

    loss "outside": forward returns the logits (the cross-entropy runs outside, eagerly);
    "inside": forward returns the summed cross-entropy of the shifted labels (so compiling the
    model compiles the loss with it); "liger": the same through Liger's fused linear
    cross-entropy."""

    def __init__(self, c, checkpointing=False, loss="outside"):
        super().__init__()
        self.c = c
        self.model = Body(c)
        if not c["tie_word_embeddings"]:
            self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        self.checkpointing = checkpointing
        self.loss = loss
        self.head_loss = self.summed_head_loss  # replaced by a compiled one (compile_head_loss)

    def summed_head_loss(self, x, ids):
        """The head and the loss over the final hidden states `x` [B, T, H]."""
        head = self.model.embed_tokens if self.c["tie_word_embeddings"] else self.lm_head
        h = x[:, :-1].reshape(-1, x.size(-1))
        labels = ids[:, 1:].reshape(-1)
        if self.loss == "liger":
            return liger_summed_cross_entropy(h, head.weight, labels)
        return summed_cross_entropy(F.linear(h, head.weight), labels)

    def rotary_tables(self, t, device):
        """cos and sin [t, head_dim] in fp32, as models/decoder_layer.cc ComputeRotary."""
        c = self.c
        exponents = torch.arange(0, c["head_dim"], 2, device=device).float() / c["head_dim"]
        inv_freq = 1.0 / torch.pow(c["rope_theta"], exponents)
        freqs = torch.outer(torch.arange(t, device=device).float(), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()

    def cache_rotary_tables(self, t, device):
        """Computes the tables once, as plain attributes (no buffer: DDP would broadcast it and
        DeepSpeed's bf16 would round it). Computed in forward, compile fused the sin and cos of
        the whole table into every layer's rotary kernels (7.5 ms a step at Qwen3-0.6B,
        micro-batch 4, on an H100): what an expert would precompute."""
        self.cached_tables = self.rotary_tables(t, device)
        for table in self.cached_tables:
            torch._dynamo.mark_static_address(table)

    def forward(self, ids):
        c, t = self.c, ids.shape[1]
        tables = getattr(self, "cached_tables", None)
        if tables is not None and tables[0].device != ids.device:
            # DeepSpeed moves parameters and buffers to the GPU, not plain attributes: once.
            tables = self.cached_tables = tuple(table.to(ids.device) for table in tables)
        if tables is not None and tables[0].size(0) >= t:
            cos, sin = tables[0][:t], tables[1][:t]
        else:
            cos, sin = self.rotary_tables(t, ids.device)
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            if self.checkpointing:
                x = torch.utils.checkpoint.checkpoint(layer, x, cos, sin, use_reentrant=False)
            else:
                x = layer(x, cos, sin)
        x = self.model.norm(x)
        if self.loss != "outside":
            return self.head_loss(x, ids)
        head = self.model.embed_tokens if c["tie_word_embeddings"] else self.lm_head
        return F.linear(x, head.weight)


def init_like_hf(model, std=0.02):
    """normal(0, std) for linear and embedding weights, ones for norms (HF's _init_weights)."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                m.weight.normal_(0.0, std)
            elif isinstance(m, RMSNorm):
                m.weight.fill_(1.0)


def build_model(a, c, device):
    """The model on `device` and its forward: logits (--loss outside) or the summed loss."""
    if a.impl == "hf":
        import transformers
        if not a.init_dir:
            raise SystemExit("--impl hf loads --init_dir: give the directory tools/bench wrote")
        new = int(transformers.__version__.split(".")[0]) >= 5  # torch_dtype became dtype
        dtype_arg = {"dtype" if new else "torch_dtype": torch.float32}
        if c.get("attn_logit_softcapping"):
            # transformers' SDPA attention skips Gemma 2's soft-capping (ours applies it, in its
            # eager attention): the eager implementation computes what ours does.
            dtype_arg["attn_implementation"] = "eager"
        model = transformers.AutoModelForCausalLM.from_pretrained(a.init_dir, **dtype_arg)
        # from_pretrained returns the model in eval mode, and transformers' layers checkpoint only
        # in training mode: before this, --activation_checkpointing did nothing on this side.
        model.train()
        if a.activation_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            if not (model.training and model.is_gradient_checkpointing):
                raise SystemExit("--activation_checkpointing: transformers' model did not turn "
                                 "gradient checkpointing on; the two sides would not do the "
                                 "same work")
        return model.to(device), lambda m, ids: m(input_ids=ids, use_cache=False).logits
    with torch.device("meta"):
        model = Decoder(dict(c, attention=a.attention), a.activation_checkpointing, a.loss)
    if a.init_dir:
        from safetensors.torch import load_file
        state = load_file(os.path.join(a.init_dir, "model.safetensors"))
        if c["tie_word_embeddings"]:
            state.pop("lm_head.weight", None)
        model.load_state_dict(state, strict=True, assign=True)
    else:
        model.to_empty(device="cpu")
        torch.manual_seed(0)
        init_like_hf(model)
    model = model.to(device)
    if a.rotary_tables == "cached":
        model.cache_rotary_tables(a.seq_len, device)
    return model, lambda m, ids: m(ids)


def decoder_layers(model):
    return model.model.layers


def compile_kwargs(a):
    return {} if a.compile_mode == "default" else {"mode": a.compile_mode}


class FullgraphOrBreaks(nn.Module):
    """torch.compile(module, fullgraph=True), falling back to a compile that may break the graph
    when the first call cannot trace it whole. `fullgraph` says which one runs."""

    def __init__(self, module, a):
        super().__init__()
        self.inner, self.a = module, a
        self.compiled = torch.compile(module, fullgraph=True, **compile_kwargs(a))
        self.fullgraph = True
        self.tried = False

    def forward(self, *args, **kwargs):  # transformers' models take input_ids=...
        if self.tried:
            return self.compiled(*args, **kwargs)
        self.tried = True
        try:
            return self.compiled(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 (dynamo's errors have no common public base)
            print(f"bench_torch: fullgraph compile failed ({type(e).__name__}: "
                  f"{str(e).splitlines()[0][:200]}); compiling with graph breaks", file=sys.stderr)
            torch._dynamo.reset()
            self.compiled = torch.compile(self.inner, **compile_kwargs(self.a))
            self.fullgraph = False
            return self.compiled(*args, **kwargs)


def compile_model(model, a):
    """--compile_scope layers: each decoder layer (and, unless the loss is outside or Liger's, the
    head and loss together); model: the whole module, its loss with it when inside."""
    if a.compile_scope == "model":
        return FullgraphOrBreaks(model, a)
    layers = decoder_layers(model)
    for i, layer in enumerate(layers):
        layers[i] = torch.compile(layer, **compile_kwargs(a))
    if model.loss == "inside":
        model.head_loss = torch.compile(model.summed_head_loss, **compile_kwargs(a))
    return model


def wrap(model, a, device, world):
    """Compiles (--compile) and wraps the model for the engine. Layers are compiled before
    wrapping (so gradients still come out layer by layer for the collectives to overlap); the
    whole model after DDP's wrapper, as torch.compile's DDP support expects."""
    if a.compile and a.compile_scope == "layers":
        model = compile_model(model, a)
    if a.engine in ("ddp", "zero_redundancy"):
        ids = [device.index] if device.type == "cuda" else None
        model = nn.parallel.DistributedDataParallel(model, device_ids=ids)
    elif a.engine == "fsdp1":
        from torch.distributed.fsdp import BackwardPrefetch, MixedPrecision, ShardingStrategy
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        mp = (MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if a.bf16 else None)
        layer_classes = {type(layer) for layer in decoder_layers(model)}
        model = FSDP(model, sharding_strategy=ShardingStrategy.FULL_SHARD,
                     auto_wrap_policy=ModuleWrapPolicy(layer_classes), mixed_precision=mp,
                     backward_prefetch=BackwardPrefetch.BACKWARD_PRE, limit_all_gathers=True,
                     use_orig_params=True, device_id=device)  # a CPU device: FSDP on Gloo
    elif a.engine.startswith("fsdp2"):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh(device.type, (world,))
        mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if a.bf16 else MixedPrecisionPolicy())
        offload = (CPUOffloadPolicy(pin_memory=device.type == "cuda")
                   if a.engine == "fsdp2_offload" else OffloadPolicy())
        reshard = a.engine in ("fsdp2", "fsdp2_offload")
        for layer in decoder_layers(model):
            fully_shard(layer, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard,
                        offload_policy=offload)
        fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=False,
                    offload_policy=offload)
    if a.compile and a.compile_scope == "model":
        model = compile_model(model, a)
    return model


def excluded_from_weight_decay(name):
    """trainer/optimizer.cc ExcludedFromWeightDecay: biases and normalization weights."""
    n = name.lower()
    return ("bias" in n or "layernorm" in n or "rmsnorm" in n
            or re.search(r"(^|\.)norm($|\.)|_norm($|\.)", n) is not None)


def decay_groups(model, a):
    """Hugging Face's two groups: decay on matrices, none on biases and norms."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if excluded_from_weight_decay(name) else decay).append(p)
    return [g for g in ({"params": decay, "weight_decay": a.weight_decay},
                        {"params": no_decay, "weight_decay": 0.0}) if g["params"]]


def make_optimizer(model, a, device):
    groups = decay_groups(model, a)
    if a.optimizer == "compiled":
        # torch.compile's optimizer recipe: foreach AdamW, clipping and step compiled together
        # (Stepper). The learning rate is constant here, so a float causes no recompiles.
        return torch.optim.AdamW(groups, lr=a.learning_rate, betas=ADAM_BETAS, eps=ADAM_EPS,
                                 foreach=True)
    # Fused on CUDA like tools/bench's FusedAdamW; single-tensor on the CPU like LibTorch's.
    # fsdp2_offload on CUDA steps CPU shards: torch's fused CPU AdamW.
    kind = {"fused": True} if device.type == "cuda" else {"foreach": False}
    if a.engine == "zero_redundancy":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        return ZeroRedundancyOptimizer(groups, optimizer_class=torch.optim.AdamW,
                                       lr=a.learning_rate, betas=ADAM_BETAS, eps=ADAM_EPS, **kind)
    return torch.optim.AdamW(groups, lr=a.learning_rate, betas=ADAM_BETAS, eps=ADAM_EPS, **kind)


class Stepper:
    """Clipping and the optimizer step of one optimizer step (not DeepSpeed's, which steps
    itself); returns the global gradient norm before clipping, on the device.
    --inject_fault noop_optimizer clips but never steps."""

    def __init__(self, model, opt, a):
        self.model, self.opt, self.a = model, opt, a
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.step = self.clip_and_step
        if a.optimizer == "compiled":
            self.step = torch.compile(self.clip_and_step, fullgraph=False)

    def clip_and_step(self):
        if self.a.engine == "fsdp1":
            norm = self.model.clip_grad_norm_(self.a.max_grad_norm)  # over every rank's shards
        else:
            norm = torch.nn.utils.clip_grad_norm_(self.params, self.a.max_grad_norm)
        if self.a.inject_fault != "noop_optimizer":
            self.opt.step()
        return norm

    def __call__(self):
        norm = self.step()
        self.opt.zero_grad(set_to_none=True)
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # fsdp2: a DTensor


def deepspeed_config(a):
    """The DeepSpeed JSON config of --engine zero: the same call as tools/bench's ZeroConfig
    defaults (proto/engines.proto), with --ds_config's keys merged over it."""
    zero = {"stage": a.stage, "overlap_comm": True, "contiguous_gradients": True,
            "reduce_bucket_size": 500000000, "allgather_bucket_size": 500000000,
            "round_robin_gradients": False}
    if a.stage == 3:
        zero.update(stage3_prefetch_bucket_size=50000000,
                    stage3_param_persistence_threshold=100000,
                    stage3_max_live_parameters=1000000000, stage3_max_reuse_distance=1000000000)
    if a.offload_optimizer == "cpu":
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if a.offload_param == "cpu":
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    config = {
        "train_micro_batch_size_per_gpu": a.micro_batch,
        "gradient_accumulation_steps": a.grad_accum,
        "gradient_clipping": a.max_grad_norm,
        "bf16": {"enabled": a.bf16},
        "optimizer": {"type": "AdamW", "params": {
            "lr": 0.0 if a.inject_fault == "noop_optimizer" else a.learning_rate, "betas": list(ADAM_BETAS), "eps": ADAM_EPS,
            "weight_decay": a.weight_decay}},
        "zero_optimization": zero,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if a.ds_config:
        with open(a.ds_config) as f:
            merge_into(config, json.load(f))
    return config


def merge_into(base, extra):
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            merge_into(base[key], value)
        else:
            base[key] = value


def deepspeed_initialize(model, a, device):
    """DeepSpeed's engine around `model` (fp32, on the CPU: DeepSpeed casts it to bf16 and
    moves it, so the GPU never holds the fp32 copy), with DeepSpeed's optimizer."""
    if device.type == "cuda":
        # DeepSpeed's builder cannot parse the "9.0a" of torch's default list: name the
        # device's own architecture for its JIT-built FusedAdam.
        major, minor = torch.cuda.get_device_capability(device)
        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", f"{major}.{minor}")
    import deepspeed
    engine, optimizer, _, _ = deepspeed.initialize(
        model=model, model_parameters=decay_groups(model, a), config=deepspeed_config(a),
        dist_init_required=False)
    return engine, optimizer


def tokens_path(a, world, rank):
    """tools/bench_init_dir.cc BenchTokensPath."""
    steps = a.warmup + a.steps
    return os.path.join(a.init_dir, f"tokens-{a.tokens}-w{world}-ga{a.grad_accum}"
                                    f"-mb{a.micro_batch}-seq{a.seq_len}-steps{steps}"
                                    f"-rank{rank}.safetensors")


def load_tokens(a, world, rank, device):
    """[steps, grad_accum, micro_batch, seq_len] token ids tools/bench's rank `rank` trained on."""
    from safetensors.torch import load_file
    path = tokens_path(a, world, rank)
    if not os.path.exists(path):
        raise SystemExit(f"{path} does not exist: run tools/bench with --init_dir={a.init_dir} "
                         "and the same --tokens, --nproc_per_node, --grad_accum, --micro_batch, "
                         "--seq_len, --warmup and --steps first (it writes the token ids there)")
    ids = load_file(path)["input_ids"]
    want = (a.warmup + a.steps, a.grad_accum, a.micro_batch, a.seq_len)
    if tuple(ids.shape) != want:
        raise SystemExit(f"{path} holds token ids of shape {tuple(ids.shape)}, expected {want}")
    return ids.to(device)


def fingerprint(ids, rank):
    """tools/bench_init_dir.cc BenchTokensFingerprint."""
    flat = ids.reshape(-1).long().cpu()
    weights = torch.arange(flat.numel()).remainder(97) + 1
    return int((flat * weights).sum()) * (rank + 1)


def kernel_family(name):
    """tools/kernel_profile.cc's KernelProfile::Family, with torch.compile's Triton kernels
    (triton_poi_/triton_red_/triton_per_..., named after the ops they fuse) as their own."""
    n = name.lower()
    rules = (("fused (kernels/)", ("cpptrain",)), ("memcpy/memset", ("memcpy", "memset")),
             ("attention", ("flash", "fmha", "attention", "sdpa", "cudnn")),
             ("matmul", ("gemm", "nvjet", "cutlass", "xmma", "cublas", "matmul", "gemv")),
             ("compiled (triton)", ("triton_",)),
             ("optimizer", ("adam", "multi_tensor", "foreach")),
             ("cross-entropy/softmax", ("softmax", "nll_loss", "cross_entropy", "logsumexp")),
             ("cast/copy", ("copy_kernel", "catarray", "cat_", "_to_copy")),
             ("norm/reduction", ("reduce", "norm")), ("add", ("functor_add", "add_kernel")),
             ("elementwise", ("elementwise", "vectorized", "unrolled")))
    for family, words in rules:
        if any(w in n for w in words):
            return family
    return "other"


def is_annotation(event):
    """A record_function range mirrored on the GPU's timeline (DistributedDataParallel.forward,
    Optimizer.step#AdamW.step): it spans kernels counted on their own, so counting it too would
    add its whole length again (26 ms a step at Qwen3-0.6B under the DDP wrapper)."""
    if getattr(event, "is_user_annotation", None) and event.is_user_annotation():
        return True
    return "annotation" in str(getattr(event, "activity_type", lambda: "")()).lower()


def profile_table(prof, steps):
    """Device time per step by kernel family, then the 15 kernels with most time: the lines
    tools/bench --profile_steps prints (tools/kernel_profile.cc)."""
    families, kernels = {}, {}
    for event in prof.profiler.kineto_results.events():
        if event.device_type() != torch.autograd.DeviceType.CUDA or is_annotation(event):
            continue
        ns, name = float(event.duration_ns()), event.name()
        total_count = families.setdefault(kernel_family(name), [0.0, 0])
        total_count[0] += ns
        total_count[1] += 1
        kernels[name] = kernels.get(name, 0.0) + ns
    total = sum(v[0] for v in families.values())
    if total == 0:
        return ("profile: SKIPPED: no CUDA kernels were recorded (device time per kernel needs "
                "a CUDA device)\n")
    per_step = 1e6 * max(steps, 1)
    out = [f"profile: device time per step over {steps} steps: {total / per_step:.1f} ms",
           "profile: | family | ms/step | share | kernels/step |"]
    for name, (ns, count) in sorted(families.items(), key=lambda kv: -kv[1][0]):
        out.append(f"profile: | {name} | {ns / per_step:.2f} | {100 * ns / total:.1f}% | "
                   f"{count / max(steps, 1):.0f} |")
    out.append("profile: top kernels (ms/step, family, name):")
    for name, ns in sorted(kernels.items(), key=lambda kv: -kv[1])[:15]:
        out.append(f"profile:   {ns / per_step:7.2f}  {kernel_family(name):<22} {name[:110]}")
    return "\n".join(out) + "\n"


def micro_batch_loss(forward, model, ids, targets, a):
    """Cross-entropy summed over logits[:, :-1] against ids[:, 1:] in fp32, divided by `targets`
    (labels are the inputs, as tools/bench's collator makes them). The logits die on return.
    --loss inside or liger: the model's forward returns the sum itself.
    --inject_fault scaled_gradient: the same value, its gradient 1.002 times as large."""
    out = forward(model, ids)
    if a.loss == "outside":
        out = summed_cross_entropy(out[:, :-1].reshape(-1, out.size(-1)), ids[:, 1:].reshape(-1))
    loss = out / targets
    if a.inject_fault == "scaled_gradient":
        loss = loss * 1.002 - (loss * 0.002).detach()
    return loss


@contextlib.contextmanager
def gradient_sync(model, engine, enabled):
    """Gradients communicated only on the last micro-batch of a step."""
    if isinstance(model, FullgraphOrBreaks):
        model = model.inner
    if engine in ("ddp", "fsdp1", "zero_redundancy") and not enabled:
        with model.no_sync():
            yield
        return
    if engine.startswith("fsdp2"):
        model.set_requires_gradient_sync(enabled)
    yield


def flops_per_token(c, seq):
    """Training FLOPs per token, attention counted as the full square and as its causal half:
    6 * matmul parameters + 12 (or 6) * layers * heads * head_dim * seq (tools/bench's)."""
    h, d = c["hidden_size"], c["head_dim"]
    heads, kv = c["num_attention_heads"], c["num_key_value_heads"]
    per_layer = h * heads * d * 2 + h * kv * d * 2 + 3 * h * c["intermediate_size"]
    matmul = c["num_hidden_layers"] * per_layer + c["vocab_size"] * h
    attention = 6 * c["num_hidden_layers"] * heads * d * seq
    return 6 * matmul + 2 * attention, 6 * matmul + attention


def finite_or_none(x):
    """JSON has no NaN or infinity."""
    return x if math.isfinite(x) else None


def parse_bool(text):
    if text.lower() in ("1", "true", "yes"):
        return True
    if text.lower() in ("0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not true or false")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="qwen3-0.6b", help="shape without --init_dir; a label with it")
    p.add_argument("--init_dir", default="", help="directory tools/bench wrote (model and tokens)")
    p.add_argument("--impl", default="native", choices=["native", "hf"])
    p.add_argument("--compile", action="store_true", help="torch.compile (--compile_scope)")
    p.add_argument("--compile_scope", default="", choices=["", "layers", "model"],
                   help="layers: each decoder layer (and the head with the loss inside); model: "
                        "the whole model, fullgraph where it traces whole (not fsdp*); default "
                        "model for --engine local, layers otherwise")
    p.add_argument("--compile_mode", default="default",
                   choices=["default", "max-autotune-no-cudagraphs", "reduce-overhead",
                            "max-autotune"])
    p.add_argument("--loss", default="outside", choices=["outside", "inside", "liger"],
                   help="outside: the model returns logits, cross-entropy after it (eager); "
                        "inside: the model's forward computes it (compiled with the model); "
                        "liger: Liger's fused linear cross-entropy in the forward")
    p.add_argument("--attention", default="repeat", choices=["repeat", "gqa"],
                   help="GQA keys and values: repeat_interleave, or SDPA's enable_gqa=True")
    p.add_argument("--rotary_tables", default="cached", choices=["cached", "step"],
                   help="native model: cos and sin computed once (cached), or in every forward "
                        "(step; what runs before 2026-12-07 did)")
    p.add_argument("--optimizer", default="fused", choices=["fused", "compiled"],
                   help="fused AdamW (CUDA), or foreach AdamW compiled with the clipping")
    p.add_argument("--tokens", default="markov", choices=["markov", "random"],
                   help="the token stream tools/bench wrote into --init_dir (its --tokens)")
    p.add_argument("--inject_fault", default="none",
                   choices=["none", "noop_optimizer", "scaled_gradient", "other_tokens"],
                   help="for testing the check (tools/bench_compare.py): no optimizer step; "
                        "gradients 1.002x with the same loss; every token id + 1 (mod vocab) "
                        "while the fingerprint says the original ones")
    p.add_argument("--engine", default="ddp",
                   choices=["ddp", "fsdp1", "fsdp2", "fsdp2_noreshard", "fsdp2_offload", "local",
                            "zero", "zero_redundancy"])
    p.add_argument("--stage", type=int, default=1, choices=[1, 2, 3], help="--engine zero")
    p.add_argument("--offload_optimizer", default="none", choices=["none", "cpu"],
                   help="--engine zero: optimizer state and fp32 master weights on the host")
    p.add_argument("--offload_param", default="none", choices=["none", "cpu"],
                   help="--engine zero --stage 3: parameters on the host")
    p.add_argument("--ds_config", default="", help="--engine zero: JSON merged over the config")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--bf16", type=parse_bool, default=None,
                   help="bf16 autocast (ddp, local) or bf16 parameters (fsdp2); default: on CUDA")
    p.add_argument("--seq_len", type=int, default=2048)
    p.add_argument("--micro_batch", type=int, default=4)
    p.add_argument("--grad_accum", type=int, default=1)
    p.add_argument("--steps", type=int, default=20, help="timed optimizer steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed optimizer steps first")
    p.add_argument("--learning_rate", type=float, default=1e-4)
    p.add_argument("--weight_decay", type=float, default=0.0,
                   help="of the matrices; tools/bench's default too")
    p.add_argument("--max_grad_norm", type=float, default=1.0)
    p.add_argument("--activation_checkpointing", action="store_true")
    p.add_argument("--profile_steps", type=int, default=0,
                   help="profile the last N timed steps and print device time per kernel family "
                        "to stderr (CUDA; those steps run slower, so the JSON line says "
                        "profiled_steps)")
    p.add_argument("--peak_tflops", type=float, default=790.0,
                   help="measured dense bf16 peak of one GPU (tools/matmul_peak.py), for "
                        "mfu_full_measured")
    p.add_argument("--spec_tflops", type=float, default=989.0,
                   help="the GPU's specified dense bf16 peak (H100/H200 SXM: 989), for "
                        "mfu_causal_spec")
    a = p.parse_args()
    if not a.compile_scope:
        a.compile_scope = "model" if a.engine == "local" else "layers"
    if a.compile_scope == "model" and a.engine.startswith("fsdp"):
        p.error(f"--compile_scope model compiles the whole model, which --engine {a.engine} "
                "shards unit by unit: use --compile_scope layers (the head and loss are compiled "
                "together with --loss inside)")
    if a.impl == "hf" and a.loss != "outside":
        p.error(f"--loss {a.loss} needs the native model: --impl hf computes the loss outside")
    if a.optimizer == "compiled" and a.engine not in ("local", "ddp", "fsdp2"):
        p.error(f"--optimizer compiled steps torch.optim.AdamW, not --engine {a.engine}'s")
    if a.bf16 is None:
        a.bf16 = a.device == "cuda"
    a.profile_steps = min(a.profile_steps, a.steps)  # the timed steps at most
    if a.engine != "zero" and (a.stage != 1 or a.offload_optimizer != "none" or
                               a.offload_param != "none" or a.ds_config):
        p.error(f"--stage, --offload_optimizer, --offload_param and --ds_config are for "
                f"--engine zero, not --engine {a.engine}")
    if a.offload_param != "none" and a.stage != 3:
        p.error(f"--offload_param {a.offload_param} needs --stage 3 (DeepSpeed offloads "
                f"parameters only when it partitions them), got --stage {a.stage}")
    return a


def init_distributed(a):
    if "WORLD_SIZE" not in os.environ:  # started without torchrun: one process
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if a.device == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        # Offloaded shards are CPU tensors (fsdp2_offload's gradient norm reduces them): Gloo
        # for those, NCCL for the rest.
        backend = "cpu:gloo,cuda:nccl" if a.engine == "fsdp2_offload" else "nccl"
        dist.init_process_group(backend, device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    return device


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def engine_label(a):
    """torch_<engine>, or deepspeed_zero<stage>[_offload_optimizer][_offload_param]."""
    if a.engine != "zero":
        return "torch_" + a.engine
    label = f"deepspeed_zero{a.stage}"
    if a.offload_optimizer != "none":
        label += "_offload_optimizer"
    if a.offload_param != "none":
        label += "_offload_param"
    return label


def deepspeed_version():
    import deepspeed
    return deepspeed.__version__


def param_checksum(model, a):
    """Sum of squares of every parameter, whole and at full precision (fp32 masters), in fp64:
    tools/bench's param_checksum. Collective where the parameters are sharded."""
    inner = model.inner if isinstance(model, FullgraphOrBreaks) else model
    if a.engine == "zero":
        from deepspeed.utils import safe_get_full_fp32_param
        values = [safe_get_full_fp32_param(p) for p in inner.module.parameters()]
    elif a.engine == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        with FSDP.summon_full_params(inner, writeback=False):
            return sum(p.detach().double().square().sum().item() for p in inner.parameters())
    else:
        values = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in inner.parameters()]
    return sum(v.detach().double().square().sum().item() for v in values)


class PhasePeaks:
    """Peak CUDA memory by phase, as tools/phase_peaks.h: begin() ends the phase running (its
    peak: max_memory_allocated since the last begin) and resets the counter for the next."""

    def __init__(self, device):
        self.device, self.current, self.peaks = device, "setup", {}

    def begin(self, phase):
        self.finish()
        self.current = phase

    def finish(self):
        if self.device.type != "cuda":
            return
        peak = torch.cuda.max_memory_allocated(self.device)
        self.peaks[self.current] = max(self.peaks.get(self.current, 0), peak)
        torch.cuda.reset_peak_memory_stats(self.device)


def train(model, forward, opt, tokens, a, device, peaks):
    """Every step; returns the first and last step's loss and the first step's gradient norm
    before clipping (device tensors) and the seconds of the timed steps."""
    total = a.warmup + a.steps
    # This rank's loss targets per step (no padding, no ignored labels); equal on every rank, so
    # the engines' gradient averaging gives the gradient of the global mean, as tools/bench's sum
    # over ranks of (summed loss / global targets) does.
    targets = a.grad_accum * a.micro_batch * (a.seq_len - 1)
    autocast = a.bf16 and not a.engine.startswith("fsdp") and a.engine != "zero"
    graphs = a.compile and a.compile_mode in ("reduce-overhead", "max-autotune")
    stepper = Stepper(model, opt, a) if a.engine != "zero" else None
    kept = {}
    start = None
    profiler = None
    for step in range(total):
        if step == a.warmup:
            synchronize(device)
            start = time.perf_counter()
        if a.profile_steps and step == total - a.profile_steps:
            synchronize(device)
            profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                          torch.profiler.ProfilerActivity.CUDA])
            profiler.start()
        step_loss = None
        for i in range(a.grad_accum):
            ids = tokens[step, i]
            if a.inject_fault == "other_tokens":
                ids = (ids + 1) % a.vocab_size
            if graphs:
                torch.compiler.cudagraph_mark_step_begin()
            peaks.begin("forward")
            if a.engine == "zero":
                # The loss is already divided by the step's targets: no further 1/accum.
                # DeepSpeed clips, steps and zeroes on the last micro-batch's step().
                loss = micro_batch_loss(forward, model, ids, targets, a)
                peaks.begin("backward")
                model.backward(loss, scale_wrt_gas=False)
                peaks.begin("step")
                model.step()  # --inject_fault noop_optimizer: its learning rate is 0
            else:
                with gradient_sync(model, a.engine, enabled=i + 1 == a.grad_accum):
                    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
                        loss = micro_batch_loss(forward, model, ids, targets, a)
                    peaks.begin("backward")
                    loss.backward()
                peaks.begin("step")
            # A CUDA graph's output is overwritten by its next replay: keep a copy.
            loss = loss.detach().clone()
            step_loss = loss if step_loss is None else step_loss + loss
        if stepper is not None:
            norm = stepper()
        else:
            norm = torch.as_tensor(model.get_global_grad_norm() or float("nan"), device=device)
        if step == 0:
            kept["first_grad_norm"] = norm.detach().clone().reshape(())
        if step in (0, total - 1):
            kept[step] = step_loss  # stays on the device until after the run
    synchronize(device)
    seconds = time.perf_counter() - start
    if profiler is not None:
        profiler.stop()
        if dist.get_rank() == 0:
            print(profile_table(profiler, a.profile_steps), end="", file=sys.stderr, flush=True)
    return kept[0], kept[total - 1], kept["first_grad_norm"], seconds


def main():
    a = parse_args()
    device = init_distributed(a)
    world, rank = dist.get_world_size(), dist.get_rank()
    c = (config_from_json(os.path.join(a.init_dir, "config.json"), a.impl) if a.init_dir
         else CONFIGS[a.model])
    a.vocab_size = c["vocab_size"]
    if a.engine == "zero":
        model, forward = build_model(a, c, torch.device("cpu"))
        model, opt = deepspeed_initialize(model, a, device)
    else:
        model, forward = build_model(a, c, device)
        model = wrap(model, a, device, world)
        opt = make_optimizer(model, a, device)
    if a.init_dir:
        tokens = load_tokens(a, world, rank, device)
    else:
        gen = torch.Generator(device=device).manual_seed(rank)
        tokens = torch.randint(c["vocab_size"],
                               (a.warmup + a.steps, a.grad_accum, a.micro_batch, a.seq_len),
                               device=device, generator=gen)
    peaks = PhasePeaks(device)  # setup: everything since the process started
    first, last, first_norm, seconds = train(model, forward, opt, tokens, a, device, peaks)
    seconds = torch.tensor([seconds], device=device)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    peak, by_phase = None, None
    if device.type == "cuda":
        peaks.finish()
        phases = ("setup", "forward", "backward", "step")
        peak_t = torch.tensor([peaks.peaks.get(p, 0) / 2**30 for p in phases], device=device)
        dist.all_reduce(peak_t, op=dist.ReduceOp.MAX)
        by_phase = {p: round(v, 2) for p, v in zip(phases, peak_t.tolist())}
        peak = round(peak_t.max().item(), 2)
    host_peak_t = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20],
                               device=device)  # ru_maxrss is in KiB on Linux
    dist.all_reduce(host_peak_t, op=dist.ReduceOp.MAX)
    losses = torch.stack([first, last]).double()
    dist.all_reduce(losses)
    losses /= world  # mean over ranks of the local means = the global mean
    fp = torch.tensor([fingerprint(tokens, rank)], dtype=torch.int64, device=device)
    dist.all_reduce(fp)
    checksum = param_checksum(model, a)  # after the peak was read: it gathers whole tensors
    tps = a.steps * a.grad_accum * a.micro_batch * a.seq_len * world / seconds.item()
    full_fpt, causal_fpt = flops_per_token(c, a.seq_len)
    tflops, tflops_causal = tps / world * full_fpt / 1e12, tps / world * causal_fpt / 1e12
    zero = a.engine == "zero"
    if rank == 0:
        print(json.dumps({
            "model": a.model, "engine": engine_label(a), "impl": a.impl, "compile": a.compile,
            "compile_scope": a.compile_scope if a.compile else None,
            "compile_mode": a.compile_mode if a.compile else None,
            "fullgraph": (model.fullgraph if isinstance(model, FullgraphOrBreaks) else None),
            "loss": a.loss, "attention": a.attention, "optimizer": a.optimizer,
            "rotary_tables": a.rotary_tables if a.impl == "native" else None,
            "param_dtype": ("bf16 (fully_shard MixedPrecisionPolicy)"
                            if a.bf16 and a.engine.startswith("fsdp") else
                            "bf16 (DeepSpeed)" if a.bf16 and zero else
                            "fp32, bf16 autocast" if a.bf16 else "fp32"),
            "gpus": world, "device": str(device), "seq_len": a.seq_len,
            "micro_batch": a.micro_batch, "grad_accum": a.grad_accum, "steps": a.steps,
            "warmup": a.warmup, "bf16": a.bf16,
            "profiled_steps": a.profile_steps,
            "activation_checkpointing": a.activation_checkpointing,
            "learning_rate": a.learning_rate, "weight_decay": a.weight_decay,
            "init_dir": a.init_dir, "tokens": a.tokens, "inject_fault": a.inject_fault,
            "seconds": round(seconds.item(), 3),
            "tokens_per_s": round(tps, 1), "tokens_per_s_per_gpu": round(tps / world, 1),
            "flops_per_token": full_fpt, "flops_per_token_causal": causal_fpt,
            "tflops_per_gpu": round(tflops, 1), "tflops_per_gpu_causal": round(tflops_causal, 1),
            "peak_tflops": a.peak_tflops, "spec_tflops": a.spec_tflops,
            "mfu_full_measured": round(tflops / a.peak_tflops, 4),
            "mfu_causal_spec": round(tflops_causal / a.spec_tflops, 4),
            "peak_memory_gib": peak, "peak_by_phase_gib": by_phase,
            "first_loss": finite_or_none(losses[0].item()),
            "last_loss": finite_or_none(losses[1].item()),
            "first_grad_norm": finite_or_none(first_norm.item()),
            "param_checksum": finite_or_none(checksum),
            "tokens_fingerprint": int(fp.item()), "torch": torch.__version__,
            "zero_stage": a.stage if zero else None,
            "offload_optimizer": (a.offload_optimizer if zero else
                                  "cpu" if a.engine == "fsdp2_offload" else None),
            "offload_param": a.offload_param if zero else None,
            "host_peak_gib": round(host_peak_t.item(), 2),
            "deepspeed": deepspeed_version() if zero else None}), flush=True)
    dist.destroy_process_group()
    if device.type == "cpu":
        # torch 2.15's Gloo teardown at interpreter exit sometimes aborts ("terminate called
        # without an active exception", about one run in ten here) after all the work is done.
        sys.stdout.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
