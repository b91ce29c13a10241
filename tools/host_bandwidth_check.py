# Host memory throughput at 16 threads: what the ZeRO-Offload step's host work can reach.
import time, torch
torch.set_num_threads(16)
n = 800_000_000
x = torch.randn(n); y = torch.randn(n)
def t(name, f, gb):
    f(); s = time.perf_counter(); f(); d = time.perf_counter() - s
    print(f"{name}: {d*1e3:.1f} ms, {gb/d:.1f} GB/s", flush=True)
t("copy_", lambda: x.copy_(y), 8 * n / 1e9)
t("mul_", lambda: x.mul_(0.999), 8 * n / 1e9)
t("norm", lambda: x.norm(), 4 * n / 1e9)
t("pow2sum", lambda: x.dot(x), 4 * n / 1e9)
