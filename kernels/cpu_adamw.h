// AdamW on fp32 host buffers: the optimizer step of ZeRO-Offload (master weights and moments in
// host memory) and of FusedAdamW's CPU path. Multithreaded over chunks with LibTorch's
// intra-op pool, vectorized (AVX2/FMA where the CPU has it, chosen at run time).
//
//   kernels::AdamWHyper h;  // lr, beta1, beta2, eps, weight_decay
//   h.lr = 1e-4;
//   h.weight_decay = 0.01;
//   kernels::CpuAdamWStep({param, grad, exp_avg, exp_avg_sq, n}, h, /*step=*/t);
//
// Per element it does what torch::optim::AdamW::step does on fp32 CPU tensors, in the same
// order and with the same roundings: bitwise equal to LibTorch 1.13's; against 2.x's the moments
// are bitwise equal and a step's parameters a few ulp of the update apart, where its addcdiv_
// forms the update in another order (up to 3 ulp against PyTorch 2.15's C++ AdamW here;
// kernels/cpu_adamw_test.cc allows 4 on 2.x):
//   p *= 1 - lr*wd                          (only when wd != 0)
//   m  = fma(g, 1-b1, m*b1)                 (add_(g, alpha): ATen's vectorized fmadd)
//   v  = fma((1-b2)*g, g, v*b2)             (addcmul_: contracted by ATen's build)
//   d  = sqrt(v) / sqrt(1-b2^t) + eps
//   p += (-(lr / (1-b1^t)) * m) / d         (addcdiv_)
// Scalars are formed in double and rounded to float once, as ATen does with a Scalar. The file
// is compiled with -ffp-contract=off so only these two fmas are fused.
#ifndef CPPTRAIN_KERNELS_CPU_ADAMW_H_
#define CPPTRAIN_KERNELS_CPU_ADAMW_H_

#include <cstdint>

namespace cpptrain {
namespace kernels {

struct AdamWHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  // Each gradient is read as g * grad_scale, rounded to float first (what clipping with
  // g.mul_(grad_scale) before the step would store); 1 reads it as it is.
  double grad_scale = 1.0;
};

// One parameter's buffers, n floats each, not overlapping. `grad` is read, the rest updated.
// With `param_bf16` (n bfloat16 bits, as c10::BFloat16 stores them), the updated parameter is
// also written there rounded to nearest even (what param.to(kBFloat16) gives), in the same pass:
// ZeRO-Offload's bf16 working copy, with no second pass over the masters.
struct AdamWSpans {
  float* param;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  int64_t n;
  uint16_t* param_bf16 = nullptr;
};

// The same with bfloat16 gradients (raw bits, as c10::BFloat16 stores them): each is widened to
// fp32 exactly, then the fp32 arithmetic above.
struct AdamWSpansBf16Grad {
  float* param;
  const uint16_t* grad;
  float* exp_avg;
  float* exp_avg_sq;
  int64_t n;
  uint16_t* param_bf16 = nullptr;
};

// One AdamW step; `step` is the step count after this update (1 on the first call).
void CpuAdamWStep(const AdamWSpans& spans, const AdamWHyper& hyper, int64_t step);
void CpuAdamWStep(const AdamWSpansBf16Grad& spans, const AdamWHyper& hyper, int64_t step);

// Whether the vectorized AVX2/FMA body runs on this CPU (else a portable loop, same results).
bool CpuAdamWVectorized();

// The sum of x[i]^2 over n floats, on the intra-op threads, accumulated in double (for the
// gradient norm of a host gradient buffer: one read of it).
double CpuSumOfSquares(const float* x, int64_t n);

// How many intra-op threads a step over n elements runs on: min(at::get_num_threads(), its
// chunks of 65536 elements), or 1 where the file was built without OpenMP (LibTorch's
// at::parallel_for is then a plain loop: the bug this reports).
int CpuAdamWThreads(int64_t n);

}  // namespace kernels
}  // namespace cpptrain

#endif  // CPPTRAIN_KERNELS_CPU_ADAMW_H_
