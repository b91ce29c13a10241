#!/usr/bin/env python3
"""Times the matmuls and the attention of one decoder step at a model's shape, each way ours or
PyTorch's side could run it, so a profile's gap between the two can be put on a cause:

  python3 tools/shape_probe.py --model qwen3-0.6b --micro_batch 4 [--device cpu --tiny]

Prints one JSON line per case: {"case", "ms" (median of --iters), "min", "max", "tflops"}.
Cases: attention forward + backward with q, k and v as [B, H, T, D] views of [B, T, H, D]
memory (ours' rotary kernel writes q and k so), against [B, H, T, D] memory; the q/k/v and
gate/up projections as one matmul per block (ours), the input gradient accumulated by addmm
(ours) or summed after, and one matmul over the stacked weights; the LM head as ours' 4096-row
chunks with an fp32 weight gradient accumulated in the matmul, against one bf16 matmul over all
rows (PyTorch's).
--tiny shrinks every dimension so the script can be checked on the CPU.
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

SHAPES = {  # hidden, heads, kv heads, head dim, intermediate, vocabulary
    "qwen3-0.6b": (1024, 16, 8, 128, 3072, 151936),
    "llama-3.2-1b": (2048, 32, 8, 64, 8192, 128256),
}


def timed(fn, device, iters):
    """Median, min and max milliseconds of fn over iters calls after 3 warm-up calls."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times), min(times), max(times)


def report(case, fn, flop, device, iters):
    ms, lo, hi = timed(fn, device, iters)
    print(json.dumps({"case": case, "ms": round(ms, 4), "min": round(lo, 4), "max": round(hi, 4),
                      "tflops": round(flop / ms / 1e9, 1)}), flush=True)


def attention_cases(b, t, heads, kv, d, dtype, device, iters):
    flop = 4 * b * t * t * heads * d / 2 * 3.5  # causal: forward 1, backward 2.5
    def make(h, layout):
        x = torch.randn(b, t, h, d, device=device, dtype=dtype)
        return x.transpose(1, 2).contiguous() if layout in ("bhtd", "all") else x.transpose(1, 2)
    for name, qk_layout in (("q,k [B,H,T,D], v a [B,T,H,D] view", "bhtd"),
                            ("q,k,v [B,T,H,D] views (ours)", "bthd"),
                            ("q,k,v [B,H,T,D]", "all")):
        q = make(heads, qk_layout).requires_grad_()
        k = make(kv, qk_layout).requires_grad_()
        v = make(kv, "bhtd" if qk_layout == "all" else "bthd").requires_grad_()
        grad = torch.randn(b, t, heads * d, device=device, dtype=dtype)
        def step():
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            out.transpose(1, 2).reshape(b, t, -1).backward(grad)
        report(f"attention fwd+bwd, {name}", step, flop, device, iters)


def projection_cases(rows, hidden, sizes, label, dtype, device, iters):
    x = torch.randn(rows, hidden, device=device, dtype=dtype)
    ws = [torch.randn(n, hidden, device=device, dtype=dtype) / hidden**0.5 for n in sizes]
    stacked = torch.cat(ws)
    dys = [torch.randn(rows, n, device=device, dtype=dtype) for n in sizes]
    dy_all = torch.cat(dys, 1)
    flop = 2 * rows * hidden * sum(sizes)
    report(f"{label} forward, a matmul per block", lambda: [x @ w.t() for w in ws], flop, device,
           iters)
    report(f"{label} forward, one stacked matmul", lambda: x @ stacked.t(), flop, device, iters)
    def dx_addmm():
        dx = dys[0] @ ws[0]
        for dy, w in zip(dys[1:], ws[1:]):
            dx.addmm_(dy, w)
    def dx_sum():
        sum(dy @ w for dy, w in zip(dys, ws))
    report(f"{label} input grad, addmm per block", dx_addmm, flop, device, iters)
    report(f"{label} input grad, mm per block then add", dx_sum, flop, device, iters)
    report(f"{label} input grad, one stacked matmul", lambda: dy_all @ stacked, flop, device, iters)
    report(f"{label} weight grad, a matmul per block", lambda: [dy.t() @ x for dy in dys], flop,
           device, iters)
    report(f"{label} weight grad, one stacked matmul", lambda: dy_all.t() @ x, flop, device, iters)


def head_cases(rows, hidden, vocab, dtype, device, iters, chunk=4096):
    h = torch.randn(rows, hidden, device=device, dtype=dtype)
    w = torch.randn(vocab, hidden, device=device, dtype=dtype) / hidden**0.5
    dlogits = torch.randn(rows, vocab, device=device, dtype=dtype) / vocab
    dw = torch.empty(vocab, hidden, device=device, dtype=torch.float32)
    dh = torch.empty(rows, hidden, device=device, dtype=torch.float32)
    fp32_out = device.type == "cuda"  # addmm's out_dtype form is CUDA-only
    flop = 2 * rows * hidden * vocab
    def chunks():
        for i, start in enumerate(range(0, rows, chunk)):
            part = dlogits[start:start + chunk]
            if fp32_out:
                torch.addmm(dw, part.t(), h[start:start + chunk], out_dtype=torch.float32,
                            beta=0 if i == 0 else 1, out=dw)
            else:
                dw.add_(part.t().float() @ h[start:start + chunk].float())
    report("head weight grad, 4096-row chunks into fp32 (ours)", chunks, flop, device, iters)
    report("head weight grad, one bf16 matmul (PyTorch's)", lambda: dlogits.t() @ h, flop, device,
           iters)
    def dh_chunks():
        for start in range(0, rows, chunk):
            part = dlogits[start:start + chunk]
            if fp32_out:
                torch.mm(part, w, out_dtype=torch.float32, out=dh[start:start + chunk])
            else:
                dh[start:start + chunk] = (part @ w).float()
    report("head input grad, chunks into fp32 (ours)", dh_chunks, flop, device, iters)
    report("head input grad, one bf16 matmul (PyTorch's)", lambda: dlogits @ w, flop, device,
           iters)
    report("head forward, chunks (ours)",
           lambda: [h[s:s + chunk] @ w.t() for s in range(0, rows, chunk)], flop, device, iters)
    report("head forward, one matmul (PyTorch's)", lambda: h @ w.t(), flop, device, iters)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="qwen3-0.6b", choices=sorted(SHAPES))
    p.add_argument("--micro_batch", type=int, default=4)
    p.add_argument("--seq_len", type=int, default=2048)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="every dimension divided by 16")
    a = p.parse_args()
    hidden, heads, kv, d, inter, vocab = SHAPES[a.model]
    b, t = a.micro_batch, a.seq_len
    if a.tiny:
        hidden, inter, vocab, t, d = hidden // 16, inter // 16, vocab // 16, t // 16, d // 4
    device = torch.device(a.device)
    dtype = torch.bfloat16
    print(json.dumps({"model": a.model, "micro_batch": b, "seq_len": t, "device":
                      torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                      "torch": torch.__version__}), flush=True)
    attention_cases(b, t, heads, kv, d, dtype, device, a.iters)
    rows = b * t
    projection_cases(rows, hidden, [heads * d, kv * d, kv * d], "qkv", dtype, device, a.iters)
    projection_cases(rows, hidden, [inter, inter], "gate/up", dtype, device, a.iters)
    head_cases(rows, hidden, vocab, dtype, device, a.iters)


if __name__ == "__main__":
    main()
