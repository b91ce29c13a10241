#!/usr/bin/env python3
"""PyTorch's own engines on the same model as //tools:bench, for side-by-side figures.

  torchrun --standalone --nproc_per_node 4 tools/bench_torch.py --engine ddp
  torchrun --standalone --nproc_per_node 4 tools/bench_torch.py --engine fsdp2

The model is the Qwen3/Llama decoder of models/decoder.cc written in plain PyTorch (RMSNorm,
rotary embeddings, grouped-query attention through scaled_dot_product_attention, SwiGLU, tied
head for Qwen3-0.6B), random tokens, AdamW, bf16 autocast with fp32 parameters. Prints one JSON
line with the same formulas as the C++ bench.
"""
import argparse
import json
import math
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

CONFIGS = {
    "qwen3-0.6b": dict(vocab=151936, hidden=1024, inter=3072, layers=28, heads=16, kv=8, head_dim=128,
                       tied=True, theta=1e6, qk_norm=True),
    "llama3-8b": dict(vocab=128256, hidden=4096, inter=14336, layers=32, heads=32, kv=8, head_dim=128,
                      tied=False, theta=5e5, qk_norm=False),
}


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, d = c["hidden"], c["head_dim"]
        self.c = c
        self.q_proj = nn.Linear(h, c["heads"] * d, bias=False)
        self.k_proj = nn.Linear(h, c["kv"] * d, bias=False)
        self.v_proj = nn.Linear(h, c["kv"] * d, bias=False)
        self.o_proj = nn.Linear(c["heads"] * d, h, bias=False)
        self.q_norm = RMSNorm(d) if c["qk_norm"] else nn.Identity()
        self.k_norm = RMSNorm(d) if c["qk_norm"] else nn.Identity()
        self.gate_proj = nn.Linear(h, c["inter"], bias=False)
        self.up_proj = nn.Linear(h, c["inter"], bias=False)
        self.down_proj = nn.Linear(c["inter"], h, bias=False)
        self.input_layernorm = RMSNorm(h)
        self.post_attention_layernorm = RMSNorm(h)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        c = self.c
        h = self.input_layernorm(x)
        q = self.q_norm(self.q_proj(h).view(b, t, c["heads"], c["head_dim"])).transpose(1, 2)
        k = self.k_norm(self.k_proj(h).view(b, t, c["kv"], c["head_dim"])).transpose(1, 2)
        v = self.v_proj(h).view(b, t, c["kv"], c["head_dim"]).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        groups = c["heads"] // c["kv"]
        k = k.repeat_interleave(groups, 1)
        v = v.repeat_interleave(groups, 1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o_proj(a.transpose(1, 2).reshape(b, t, -1))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Decoder(nn.Module):
    def __init__(self, c, checkpointing=False):
        super().__init__()
        self.c = c
        self.embed_tokens = nn.Embedding(c["vocab"], c["hidden"])
        self.layers = nn.ModuleList(Layer(c) for _ in range(c["layers"]))
        self.norm = RMSNorm(c["hidden"])
        self.lm_head = None if c["tied"] else nn.Linear(c["hidden"], c["vocab"], bias=False)
        self.checkpointing = checkpointing

    def forward(self, ids):
        c = self.c
        t = ids.shape[1]
        inv = 1.0 / (c["theta"] ** (torch.arange(0, c["head_dim"], 2, device=ids.device).float() / c["head_dim"]))
        freqs = torch.outer(torch.arange(t, device=ids.device).float(), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(torch.bfloat16), emb.sin().to(torch.bfloat16)
        x = self.embed_tokens(ids)
        for layer in self.layers:
            if self.checkpointing:
                x = torch.utils.checkpoint.checkpoint(layer, x, cos, sin, use_reentrant=False)
            else:
                x = layer(x, cos, sin)
        x = self.norm(x)
        w = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(x, w)


def flops_per_token(c, seq):
    h, d = c["hidden"], c["head_dim"]
    per_layer = h * c["heads"] * d * 2 + h * c["kv"] * d * 2 + 3 * h * c["inter"]
    matmul = c["layers"] * per_layer + c["vocab"] * h
    return 6 * matmul + 12 * c["layers"] * c["heads"] * d * seq


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="qwen3-0.6b")
    p.add_argument("--engine", default="ddp", choices=["ddp", "fsdp2", "fsdp2_noreshard", "local"])
    p.add_argument("--seq_len", type=int, default=2048)
    p.add_argument("--micro_batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--activation_checkpointing", action="store_true")
    p.add_argument("--peak_tflops", type=float, default=790.0)
    a = p.parse_args()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    world = dist.get_world_size()
    c = CONFIGS[a.model]
    torch.manual_seed(0)
    model = Decoder(c, a.activation_checkpointing).cuda()
    if a.engine == "ddp":
        model = nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])
    elif a.engine.startswith("fsdp2"):
        from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        reshard = a.engine == "fsdp2"
        for layer in model.layers:
            fully_shard(layer, mp_policy=mp, reshard_after_forward=reshard)
        fully_shard(model, mp_policy=mp, reshard_after_forward=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator(device="cuda").manual_seed(local_rank)
    last = 0.0
    start = None
    for step in range(a.warmup + a.steps):
        if step == a.warmup:
            torch.cuda.synchronize()
            start = time.perf_counter()
        ids = torch.randint(c["vocab"], (a.micro_batch, a.seq_len), device="cuda", generator=gen)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=not a.engine.startswith("fsdp2")):
            logits = model(ids)
        loss = F.cross_entropy(logits[:, :-1].float().reshape(-1, c["vocab"]), ids[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step == a.warmup + a.steps - 1:
            last = loss.item()
    torch.cuda.synchronize()
    seconds = torch.tensor([time.perf_counter() - start], device="cuda")
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    peak = torch.tensor([torch.cuda.max_memory_allocated() / 2**30], device="cuda")
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    tokens = a.steps * a.micro_batch * a.seq_len * world
    tps = tokens / seconds.item()
    fpt = flops_per_token(c, a.seq_len)
    tflops = tps / world * fpt / 1e12
    if dist.get_rank() == 0:
        print(json.dumps({"model": a.model, "engine": "torch_" + a.engine, "gpus": world,
                          "seq_len": a.seq_len, "micro_batch": a.micro_batch, "steps": a.steps,
                          "tokens_per_s": round(tps, 1), "tokens_per_s_per_gpu": round(tps / world, 1),
                          "tflops_per_gpu": round(tflops, 1), "mfu": round(tflops / a.peak_tflops, 4),
                          "peak_memory_gib": round(peak.item(), 2), "last_loss": round(last, 4)}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
