// The decoder's memory-bound steps as fused CUDA kernels with their own backward, each beside
// the eager LibTorch reference it must match (fp32 within 1e-5, bf16 within 1e-2 relative;
// kernels/fused_ops_test.cc checks it on the GPU).
//
//   at::Tensor y = kernels::RmsNorm(x, weight, eps, at::kBFloat16, /*fused=*/true);
//   at::Tensor q = kernels::QkNormRope(q_bthd, q_norm_weight, eps, cos, sin, at::kBFloat16, true);
//   at::Tensor h = kernels::SwiGlu(gate, up, true);
//
// With `fused` false, or where a kernel does not apply (the CPU, a build without the CUDA
// kernels, dtypes other than fp32/bf16, rows longer than the kernels take), each function
// returns its reference, whose dtype follows LibTorch's promotion (out_dtype is then ignored).
#ifndef CPPTRAIN_KERNELS_FUSED_OPS_H_
#define CPPTRAIN_KERNELS_FUSED_OPS_H_

#include <ATen/ATen.h>

#include <tuple>
#include <utility>

namespace cpptrain {
namespace kernels {

// Whether this build compiled the CUDA kernels (CMake with nvcc on a CUDA LibTorch).
bool CudaKernelsBuilt();

// weight * (x * rsqrt(mean(x^2, -1) + eps)), the normalized value rounded to x's dtype before
// the product, as Hugging Face's Llama/Qwen3 RMSNorm does.
at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps,
                   at::ScalarType out_dtype, bool fused);
at::Tensor RmsNormReference(const at::Tensor& x, const at::Tensor& weight, double eps);

// RmsNorm(x, ...) and x again, for a pre-norm residual block that normalizes x and adds to it:
// {y, x_again}. Use x_again for the residual add: the gradients of y and x_again then reach one
// backward, which adds x_again's into the norm's dx in the kernel (one pass over x's size less
// than autograd summing x's two gradients). Where the kernel does not apply, or x needs no
// gradient: {RmsNorm(x, ...), x}.
std::pair<at::Tensor, at::Tensor> RmsNormAndResidual(const at::Tensor& x,
                                                     const at::Tensor& weight, double eps,
                                                     at::ScalarType out_dtype, bool fused);

// silu(gate) * up.
at::Tensor SwiGlu(const at::Tensor& gate, const at::Tensor& up, bool fused);
at::Tensor SwiGluReference(const at::Tensor& gate, const at::Tensor& up);

// gelu(gate, "tanh") * up (Gemma's GeGLU, hidden_act gelu_pytorch_tanh); the kernel computes
// in fp32 and rounds once, where the reference rounds the activation first.
at::Tensor GeGlu(const at::Tensor& gate, const at::Tensor& up, bool fused);
at::Tensor GeGluReference(const at::Tensor& gate, const at::Tensor& up);

// GeGlu with gelu_tanh, else SwiGlu.
at::Tensor Gated(const at::Tensor& gate, const at::Tensor& up, bool gelu_tanh, bool fused);

// SwiGlu's (GeGlu's with gelu_tanh) backward for a caller that kept gate and up but not the
// product (models/gated_down.h): {dgate, dup, product}, with product = act(gate) * up as the
// forward computed it. gate, up and dout: contiguous [rows, cols] of one dtype. The kernel
// writes dgate and dup side by side in one [rows, 2 * cols] buffer (so the gate/up
// projection's input gradient is one matmul: models/split_linear.h) and the product over dout,
// which the caller must not need again. The reference computes what autograd would through
// SwiGluReference (GeGluReference), leaving dout as it was.
struct GatedGradients {
  at::Tensor dgate, dup, product;
};
GatedGradients GatedBackwardRecomputing(const at::Tensor& gate, const at::Tensor& up,
                                        const at::Tensor& dout, bool gelu_tanh, bool fused);
GatedGradients GatedBackwardRecomputingReference(const at::Tensor& gate, const at::Tensor& up,
                                                 const at::Tensor& dout, bool gelu_tanh);

// x + delta in x's dtype (the residual stream keeps its dtype; delta's gradient comes back in
// delta's). The reference is eager promotion: x + delta.
at::Tensor ResidualAdd(const at::Tensor& x, const at::Tensor& delta, bool fused);

// x * cos + rotate_half(x) * sin over the last dim (x: [..., T, D]; cos, sin: [T, D] fp32).
at::Tensor ApplyRotaryReference(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// Per-head RMSNorm (skipped when `weight` is undefined) and the rotary embedding, from
// x [B, T, H, D] to [B, H, T, D] in out_dtype. The kernel's result keeps x's memory order (a
// [B, H, T, D] tensor with [B, T, H, D] strides), as the reference's does and as q and k are
// in transformers: scaled_dot_product_attention reads it as it is.
at::Tensor QkNormRope(const at::Tensor& x, const at::Tensor& weight, double eps,
                      const at::Tensor& cos, const at::Tensor& sin, at::ScalarType out_dtype,
                      bool fused);
at::Tensor QkNormRopeReference(const at::Tensor& x, const at::Tensor& weight, double eps,
                               const at::Tensor& cos, const at::Tensor& sin,
                               at::ScalarType out_dtype);

// {QkNormRope(q, q_weight, ...), QkNormRope(k, k_weight, ...), v} for q [B, T, Hq, D], k
// [B, T, Hkv, D] and v [B, Hkv, T, D] of one dtype. Where the kernels take q and k and all three
// want a gradient, one backward writes the gradients of q, k and v side by side in one
// [B, T, (Hq + 2 Hkv) D] buffer (v's copied there), so a SplitLinear that projected q, k and v
// computes its input's gradient as one matmul. Elsewhere: the two QkNormRope calls and v as it is.
std::tuple<at::Tensor, at::Tensor, at::Tensor> QkvNormRope(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& q_weight,
    const at::Tensor& k_weight, double eps, const at::Tensor& cos, const at::Tensor& sin,
    at::ScalarType out_dtype, bool fused);

// Gemma 2's attention probabilities from square scores [B, H, T, T] (q k^T, unscaled; other
// shapes are refused): softmax over the causal keys (within `window` when window > 0) of
// softcap * tanh(scores * scale / softcap) in fp32, in the scores' dtype. The reference is
// transformers' eager order (each step in the scores' dtype, the softmax in fp32); the kernel
// (CUDA, fp32 or bf16, contiguous) computes each row in fp32 and rounds once, saving the scores
// and probs for backward.
at::Tensor SoftcapSoftmax(const at::Tensor& scores, double scale, double softcap, int64_t window,
                          bool fused);
at::Tensor SoftcapSoftmaxReference(const at::Tensor& scores, double scale, double softcap,
                                   int64_t window);

// Per-row cross-entropy of logits [rows, vocab] (contiguous fp32 or bf16 on CUDA) against
// targets [rows], of softcap * tanh(logits / softcap) where softcap > 0: the fp32 [rows] losses
// (0 where ignored), and with write_grad the logits overwritten by the gradient with respect to
// them (softmax - onehot(target), times the cap's slope; zero rows where ignored), in one
// kernel. Undefined where the kernel does not apply (the CPU, builds without the kernels): the
// caller then computes it with ATen.
at::Tensor CrossEntropyRowsInPlace(at::Tensor& logits, const at::Tensor& targets,
                                   int64_t ignore_index, bool write_grad, double softcap = 0.0);

// x (contiguous fp32 on CUDA) times `scale` (one fp32 value on x's device, read there: no host
// sync), computed in fp32 and rounded once to out_dtype (fp32 or bf16), into a new tensor: the
// values of at::mul_out(out, x, scale) in one vectorized pass (mul_out into bf16 moved about
// 1.3 TB/s on an H100). Undefined where the kernel does not apply (the CPU, builds without the
// kernels, other dtypes): the caller then uses at::mul_out.
at::Tensor ScaledCopy(const at::Tensor& x, const at::Tensor& scale, at::ScalarType out_dtype);

}  // namespace kernels
}  // namespace cpptrain

#endif  // CPPTRAIN_KERNELS_FUSED_OPS_H_
