"""Host memory throughput of copy, scale and norm on this machine's usable CPUs: the floor of
ZeRO-Offload's host step (tools/gpu_zero_check.sh runs it on the GPU host).

  python3 tools/host_bandwidth_check.py [elements]     # default 800M fp32 (two 3.2 GB tensors)
"""
import os
import sys
import time

import torch


def timed(name, f, gigabytes):
    f()
    start = time.perf_counter()
    f()
    seconds = time.perf_counter() - start
    print(f"host {name}: {seconds * 1e3:.1f} ms, {gigabytes / seconds:.1f} GB/s", flush=True)


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 800_000_000
    threads = len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    print(f"host: {threads} threads, {n} fp32 elements per tensor")
    x, y = torch.randn(n), torch.randn(n)
    timed("copy_ (read + write)", lambda: x.copy_(y), 8 * n / 1e9)
    timed("mul_ (read + write)", lambda: x.mul_(0.999), 8 * n / 1e9)
    timed("norm (read)", lambda: x.norm(), 4 * n / 1e9)
    timed("dot (read)", lambda: x.dot(x), 4 * n / 1e9)


if __name__ == "__main__":
    main()
