#!/usr/bin/env python3
"""The measured dense bf16 peak of one GPU, which tools/bench_compare.py --peak_tflops divides
by for mfu_full_measured (the other MFU divides causal FLOPs by the datasheet's 989).

  python3 tools/matmul_peak.py            # prints one JSON line, the method in "method"

torch.mm of two random bf16 matrices of each size (normal values: zeros run faster), four input
sets rotated so no product reads what the last one left in L2, after 10 untimed products; each
timing is CUDA events around 50 products, repeated 7 times; TFLOP/s = 2 m n k / time. The peak
is the best size's median.
"""
import json
import statistics
import sys

import torch


def timed_tflops(size, sets=4, products=50, repeats=7):
    mats = [(torch.randn(size, size, device="cuda", dtype=torch.bfloat16),
             torch.randn(size, size, device="cuda", dtype=torch.bfloat16)) for _ in range(sets)]
    out = torch.empty(size, size, device="cuda", dtype=torch.bfloat16)
    for i in range(10):
        torch.mm(*mats[i % sets], out=out)
    rates = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for i in range(products):
            torch.mm(*mats[i % sets], out=out)
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1e3
        rates.append(2 * size**3 * products / seconds / 1e12)
    return statistics.median(rates), min(rates), max(rates)


def main():
    if not torch.cuda.is_available():
        sys.exit("matmul_peak: needs a CUDA device")
    sizes = [4096, 8192, 16384]
    results = {size: timed_tflops(size) for size in sizes}
    best = max(sizes, key=lambda s: results[s][0])
    print(json.dumps({
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
        "peak_tflops": round(results[best][0], 1), "best_size": best,
        "by_size": {str(s): [round(x, 1) for x in results[s]] for s in sizes},
        "method": "torch.mm bf16 m=n=k, 4 rotated random input sets, CUDA events around 50 "
                  "products, median of 7 (min, max in by_size), 2mnk FLOPs"}))


if __name__ == "__main__":
    main()
