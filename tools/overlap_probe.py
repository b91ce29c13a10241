#!/usr/bin/env python3
"""How much of an AdamW step hides under a forward pass's matmuls when the two run on two
streams at once: a probe that decides whether to build the overlapped optimizer step (issue
#27's notes), not a benchmark row.

  python3 tools/overlap_probe.py                  # Llama-3.2-1B, micro-batch 4: one JSON line
  python3 tools/overlap_probe.py --tokens 16384   # micro-batch 8

The matmuls are a forward pass's: per layer q/k/v, o, gate/up and down, in bf16, at the
shape's hidden, kv and intermediate sizes and token count, plus the tied head over the vocab.
The optimizer step is PyTorch's fused AdamW (fp32 parameters, fp32 gradients, one list split
into --pieces tensors) over the shape's parameter count: the same pass over memory as ours'
kernel, more bytes a parameter (fp32 gradients, no bf16 copy). Three timings, CUDA events,
median of --repeats: the matmuls alone, the step alone, and both issued together, the step on
a low-priority stream. `hidden_ms` = alone + alone - together: the step time the matmuls
absorbed (the matmuls on a high-priority stream, the step on a low one). Prints one JSON
line.
"""
import argparse
import json
import statistics
import sys

import torch


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=8192, help="rows of each matmul (batch x seq)")
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--kv", type=int, default=512, help="key/value width (kv heads x head dim)")
    p.add_argument("--intermediate", type=int, default=8192)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--pieces", type=int, default=146, help="tensors the optimizer steps")
    p.add_argument("--repeats", type=int, default=7)
    return p.parse_args()


def forward_matmuls(a):
    """A closure running one forward pass's matmuls, and its FLOPs."""
    x = torch.randn(a.tokens, a.hidden, device="cuda", dtype=torch.bfloat16)
    h = torch.randn(a.tokens, a.intermediate, device="cuda", dtype=torch.bfloat16)
    weights = [torch.randn(a.hidden, n, device="cuda", dtype=torch.bfloat16) * 0.02
               for n in (a.hidden + 2 * a.kv, a.hidden, 2 * a.intermediate)]
    down = torch.randn(a.intermediate, a.hidden, device="cuda", dtype=torch.bfloat16) * 0.02
    head = torch.randn(a.hidden, a.vocab // 4, device="cuda", dtype=torch.bfloat16) * 0.02
    flops = 2 * a.tokens * a.layers * (a.hidden * (a.hidden + 2 * a.kv) + a.hidden * a.hidden +
                                       a.hidden * 2 * a.intermediate + a.intermediate * a.hidden)
    flops += 2 * a.tokens * a.hidden * (a.vocab // 4) * 4

    def run():
        for _ in range(a.layers):
            for w in weights:
                torch.mm(x, w)
            torch.mm(h, down)
        for _ in range(4):  # the head in four chunks of the vocab
            torch.mm(x, head)
    return run, flops


def adamw_step(a):
    """A closure running one fused AdamW step over the shape's parameter count."""
    per_layer = (a.hidden * (a.hidden + 2 * a.kv) + a.hidden * a.hidden +
                 3 * a.hidden * a.intermediate)
    total = a.layers * per_layer + a.vocab * a.hidden
    sizes = [total // a.pieces] * a.pieces
    sizes[-1] += total - sum(sizes)
    params = [torch.randn(n, device="cuda") * 0.02 for n in sizes]
    grads = [torch.randn(n, device="cuda") * 1e-3 for n in sizes]
    exp_avg = [torch.zeros(n, device="cuda") for n in sizes]
    exp_avg_sq = [torch.zeros(n, device="cuda") for n in sizes]
    steps = [torch.zeros((), device="cuda") for _ in sizes]

    def run():
        torch._foreach_add_(steps, 1)
        torch._fused_adamw_(params, grads, exp_avg, exp_avg_sq, [], steps, lr=1e-4, beta1=0.9,
                            beta2=0.999, weight_decay=0.0, eps=1e-8, amsgrad=False,
                            maximize=False)
    return run, total


def timed_ms(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), min(times), max(times)


def main():
    if not torch.cuda.is_available():
        sys.exit("overlap_probe: needs a CUDA device")
    a = parse_args()
    matmuls, flops = forward_matmuls(a)
    step, parameters = adamw_step(a)
    # Lower numbers are higher priorities; 0 (the default streams') is the lowest.
    high, low = torch.cuda.Stream(priority=-1), torch.cuda.Stream(priority=0)
    main_stream = torch.cuda.current_stream()

    def together():
        for stream in (high, low):
            stream.wait_stream(main_stream)
        with torch.cuda.stream(low):
            step()
        with torch.cuda.stream(high):
            matmuls()
        for stream in (high, low):
            main_stream.wait_stream(stream)

    alone_mm = timed_ms(matmuls, a.repeats)
    alone_step = timed_ms(step, a.repeats)
    both = timed_ms(together, a.repeats)
    print(json.dumps({
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "tokens": a.tokens,
        "parameters": parameters, "matmul_tflop": flops / 1e12,
        "matmuls_ms": alone_mm, "adamw_ms": alone_step, "together_ms": both,
        "hidden_ms": round(alone_mm[0] + alone_step[0] - both[0], 3),
        "method": "CUDA events, median [min, max] of --repeats; fused AdamW on a priority-0 "
                  "stream beside the forward matmuls on a priority -1 stream",
    }))


if __name__ == "__main__":
    main()
