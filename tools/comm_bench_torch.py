#!/usr/bin/env python3
"""The torch.distributed side of the comm_bench comparison (issue: NCCL communicator).

Run under torchrun on the same GPUs:
  torchrun --standalone --nproc_per_node 4 tools/comm_bench_torch.py --bytes 268435456
Prints one JSON line per collective (rank 0) with the same formulas as //tools:comm_bench:
busbw = algbw * (n-1)/n for all_gather_into_tensor and reduce_scatter_tensor,
2(n-1)/n for all_reduce.
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bytes", type=int, default=256 << 20)
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}[args.dtype]
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    n = dist.get_world_size()
    elements = args.bytes // torch.tensor([], dtype=dtype).element_size() // n * n
    big = torch.empty(elements, dtype=dtype, device="cuda")
    small = torch.empty(elements // n, dtype=dtype, device="cuda")
    cases = {
        "all_gather": (lambda: dist.all_gather_into_tensor(big, small), (n - 1) / n),
        "reduce_scatter": (lambda: dist.reduce_scatter_tensor(small, big), (n - 1) / n),
        "all_reduce": (lambda: dist.all_reduce(big), 2 * (n - 1) / n),
    }
    for name, (fn, factor) in cases.items():
        for _ in range(args.warmup):
            fn()
        torch.cuda.synchronize()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(args.iters):
            fn()
        torch.cuda.synchronize()
        seconds = torch.tensor([(time.perf_counter() - start) / args.iters], device="cuda")
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        t = seconds.item()
        nbytes = big.numel() * big.element_size()
        if dist.get_rank() == 0:
            algbw = nbytes / t / 1e9
            print(json.dumps({"collective": name, "backend": "torch.distributed", "ranks": n,
                              "dtype": args.dtype, "bytes": nbytes, "time_us": round(t * 1e6, 2),
                              "algbw_gbps": round(algbw, 3), "busbw_gbps": round(algbw * factor, 3)}),
                  flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
