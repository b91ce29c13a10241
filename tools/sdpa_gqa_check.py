#!/usr/bin/env python3
"""Times causal SDPA forward + backward on the GPU with grouped-query keys and values passed
two ways: expanded to every query head (repeat_interleave, what base/torch_compat.cc does) and
as they are with enable_gqa=True, for the decoder shapes of the benchmarks; prints which
backend each way ran (from the profiler's kernel names) and the median time of 20 iterations.

  python3 tools/sdpa_gqa_check.py
"""
import statistics

import torch
import torch.nn.functional as F

SHAPES = {  # name: batch, query heads, key/value heads, sequence, head_dim
    "qwen3-0.6b": (4, 16, 8, 2048, 128),
    "llama3.2-1b": (4, 32, 8, 2048, 64),
}


def step(q, k, v, gqa):
    groups = q.size(1) // k.size(1)
    if gqa:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    else:
        out = F.scaled_dot_product_attention(q, k.repeat_interleave(groups, 1),
                                             v.repeat_interleave(groups, 1), is_causal=True)
    out.sum().backward()


def time_ms(q, k, v, gqa, iters=20):
    for _ in range(3):
        step(q, k, v, gqa)
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step(q, k, v, gqa)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def kernels(q, k, v, gqa):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step(q, k, v, gqa)
        torch.cuda.synchronize()
    names = {e.key for e in prof.key_averages() if "attn" in e.key.lower() or "flash" in e.key.lower()
             or "fmha" in e.key.lower() or "cudnn" in e.key.lower()}
    return sorted(n[:60] for n in names)


def main():
    for name, (b, h, kv, t, d) in SHAPES.items():
        make = lambda heads: torch.randn(b, heads, t, d, device="cuda", dtype=torch.bfloat16,
                                         requires_grad=True)
        q, k, v = make(h), make(kv), make(kv)
        for gqa in (False, True):
            try:
                ms = time_ms(q, k, v, gqa)
                print(f"{name} enable_gqa={gqa}: {ms:.3f} ms fwd+bwd; kernels {kernels(q, k, v, gqa)}")
            except RuntimeError as e:
                print(f"{name} enable_gqa={gqa}: error {str(e)[:200]}")


if __name__ == "__main__":
    main()
