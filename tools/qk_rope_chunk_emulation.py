"""Checks the index arithmetic of the register-chunk QK-norm + rotary kernels on the CPU.

kernels/fused_kernels_cuda.cu's QkNormRope{Forward,Backward}ChunkKernel give lane l of a warp
the columns [l * C, (l + 1) * C) of a head row (C = head_dim / 32) and take the rotary partner
of column j (j + half or j - half) from lane l ^ 16 at the same index. This script replays that
per-lane arithmetic in float64, lane by lane, and compares it with autograd through the plain
formula (RMSNorm with weight, then x * cos + rotate_half(x) * sin). It exercises the layout
reasoning, not the CUDA code: kernels/fused_ops_test.cc's QkNormRopeMatchesReference does that
on a GPU.

  python3 tools/qk_rope_chunk_emulation.py      # exits 1 if any difference exceeds 1e-12
"""
import sys

import torch

WARP = 32
HALF_WARP = 16


def reference(x, w, eps, cos, sin):
    y = x
    if w is not None:
        y = w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))
    half = x.shape[-1] // 2
    rotated = torch.cat([-y[..., half:], y[..., :half]], -1)
    return y * cos[None, :, None, :] + rotated * sin[None, :, None, :]


def lanes_forward(x, w, eps, cos, sin):
    b, t, h, d = x.shape
    c = d // WARP
    rows, out = x.reshape(-1, d), torch.empty(b * t * h, d, dtype=x.dtype)
    for row in range(rows.shape[0]):
        pos = (row // h) % t
        v = rows[row].clone()
        if w is not None:
            v = w * (v * (v.pow(2).sum() / d + eps) ** -0.5)
        for lane in range(WARP):
            sign = -1.0 if lane < HALF_WARP else 1.0
            for k in range(c):
                j, partner = lane * c + k, (lane ^ HALF_WARP) * c + k
                out[row, j] = v[j] * cos[pos, j] + sign * v[partner] * sin[pos, j]
    return out.reshape(b, t, h, d)


def lanes_backward(grad, x, w, eps, cos, sin):
    b, t, h, d = x.shape
    c = d // WARP
    rows, grads = x.reshape(-1, d), grad.reshape(-1, d)
    dx, dw = torch.empty_like(rows), torch.zeros(d, dtype=x.dtype)
    for row in range(rows.shape[0]):
        pos = (row // h) % t
        dy = torch.empty(d, dtype=x.dtype)
        for lane in range(WARP):
            sign = 1.0 if lane < HALF_WARP else -1.0
            for k in range(c):
                j, partner = lane * c + k, (lane ^ HALF_WARP) * c + k
                dy[j] = grads[row, j] * cos[pos, j] + sign * grads[row, partner] * sin[pos, partner]
        if w is None:
            dx[row] = dy
            continue
        r = (rows[row].pow(2).mean() + eps) ** -0.5
        n = rows[row] * r
        dot = (dy * w * n).sum() / d
        dw += dy * n
        dx[row] = r * (dy * w - n * dot)
    return dx.reshape(b, t, h, d), dw


def main():
    torch.manual_seed(0)
    worst = 0.0
    for d in (64, 96, 128, 256):
        b, t, h = 2, 5, 3
        x = torch.randn(b, t, h, d, dtype=torch.float64)
        inv = 1.0 / torch.pow(10000.0, torch.arange(0, d, 2, dtype=torch.float64) / d)
        freqs = torch.outer(torch.arange(t, dtype=torch.float64), inv)
        emb = torch.cat([freqs, freqs], -1)
        cos, sin = emb.cos(), emb.sin()
        for with_norm in (True, False):
            w = torch.rand(d, dtype=torch.float64) + 0.5 if with_norm else None
            grad = torch.randn(b, t, h, d, dtype=torch.float64)  # in the output's row order
            xr = x.clone().requires_grad_()
            wr = w.clone().requires_grad_() if with_norm else None
            reference(xr, wr, 1e-6, cos, sin).backward(grad)
            expected = reference(x, w, 1e-6, cos, sin)
            diffs = [(lanes_forward(x, w, 1e-6, cos, sin) - expected).abs().max()]
            dx, dw = lanes_backward(grad, x, w, 1e-6, cos, sin)
            diffs.append((dx - xr.grad).abs().max())
            if with_norm:
                diffs.append((dw - wr.grad).abs().max())
            largest = max(float(v) for v in diffs)
            worst = max(worst, largest)
            print(f"head_dim {d}, norm {with_norm}: largest difference {largest:.2e}")
    print(f"worst {worst:.2e}")
    return 0 if worst <= 1e-12 else 1


if __name__ == "__main__":
    sys.exit(main())
