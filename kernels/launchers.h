// The CUDA kernels of kernels/fused_kernels_cuda.cu behind plain C++ signatures: raw device
// pointers, sizes and a cudaStream_t passed as void*, so the files that call them need neither
// CUDA nor LibTorch headers. Only CUDA builds (CMake with nvcc, CPPTRAIN_HAS_CUDA_KERNELS)
// define them; kernels/fused_ops.cc is the one caller, and it checks shapes, dtypes and
// contiguity first. Element types: kFloat32 or kBfloat16 as noted. Each returns null, or the
// text of the CUDA error the launch raised.
//
//   if (const char* error = LaunchRmsNormForward(rows, cols, x, ElementType::kBfloat16, weight,
//                                                ElementType::kFloat32, eps, y,
//                                                ElementType::kBfloat16, rstd, stream)) {...}
#ifndef CPPTRAIN_KERNELS_LAUNCHERS_H_
#define CPPTRAIN_KERNELS_LAUNCHERS_H_

#include <cstdint>

namespace cpptrain {
namespace kernels {

enum class ElementType { kFloat32, kBfloat16 };

// The largest row length the norm kernels take (a thread keeps at most 16 of a row's values in
// registers); longer rows use the eager reference.
constexpr int64_t kMaxNormCols = 8192;
// The largest head_dim of the rotary kernels (a warp stages one head in shared memory).
constexpr int64_t kMaxHeadDim = 512;

// y[r, :] = weight * x[r, :] * rstd[r], rstd[r] = 1 / sqrt(mean(x[r, :]^2) + eps) (fp32 math).
// x, y: [rows, cols] row-major; weight: [cols]; rstd: [rows] fp32 (written).
const char* LaunchRmsNormForward(int64_t rows, int64_t cols, const void* x, ElementType x_type,
                                 const void* weight, ElementType weight_type, double eps, void* y,
                                 ElementType y_type, float* rstd, void* stream);

// Floats of device scratch the backward launchers below need in `workspace` on the current
// device: their blocks' partial weight gradients, which a second kernel on the same stream sums
// into dweight (no atomics). cols is head_dim for QK-norm, and rows batch * seq * heads.
int64_t NormBackwardWorkspaceFloats(int64_t rows, int64_t cols);

// dx (x's type) and dweight (fp32 [cols], written, not accumulated into) from dy (y's type);
// where dresidual (x's type, [rows, cols]) is not null, dx is the norm's gradient plus it, added
// in fp32 before the one rounding. workspace: NormBackwardWorkspaceFloats(rows, cols) floats
// (workspace_floats), used until the stream reaches the end of this call's work.
const char* LaunchRmsNormBackward(int64_t rows, int64_t cols, const void* dy, ElementType dy_type,
                                  const void* x, ElementType x_type, const void* weight,
                                  ElementType weight_type, const float* rstd,
                                  const void* dresidual, void* dx, float* dweight,
                                  float* workspace, int64_t workspace_floats, void* stream);

// out = act(gate) * up, elementwise over n values of one type, computed in fp32 and rounded
// once; act is silu (SwiGLU), or GELU's tanh approximation with gelu_tanh (GeGLU).
const char* LaunchGatedForward(int64_t n, const void* gate, const void* up, void* out,
                               ElementType type, bool gelu_tanh, void* stream);
// dgate, dup from dout (all of the same type). gate, up and dout hold n / cols rows of cols
// values; row r of dgate and of dup starts at r * pitch (pitch == cols: laid out as gate;
// pitch == 2 * cols and dup == dgate + cols: side by side in one [rows, 2 * cols] buffer).
// product, unless null, gets the forward's out again (laid out as gate); it may be dout.
const char* LaunchGatedBackward(int64_t n, int64_t cols, int64_t pitch, const void* gate,
                                const void* up, const void* dout, void* dgate, void* dup,
                                void* product, ElementType type, bool gelu_tanh, void* stream);

// Qwen3's per-head RMSNorm (weight [head_dim]; skipped when weight is null) then the rotary
// embedding, from x [B, T, H, D] (row-major) to out in the same row order (QkNormRope views it
// as [B, H, T, D]). cos, sin: [T, D] fp32. rstd: [B*T*H] fp32 (written;
// unused without a weight).
const char* LaunchQkNormRopeForward(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                                    const void* x, ElementType x_type, const void* weight,
                                    ElementType weight_type, double eps, const float* cos,
                                    const float* sin, void* out, ElementType out_type, float* rstd,
                                    void* stream);
// dx [B, T, H, D] (x's type) and dweight (fp32 [head_dim], written; untouched without a
// weight) from dout in out's row order, [B, T, H, D] (out's type). Consecutive tokens' rows of dx
// lie dx_pitch values apart (heads * head_dim when dx is contiguous; more when dx is a block of
// columns of a wider buffer). workspace as for LaunchRmsNormBackward, with rows = batch * seq *
// heads and cols = head_dim (unused without a weight).
const char* LaunchQkNormRopeBackward(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                                     const void* dout, ElementType dout_type, const void* x,
                                     ElementType x_type, const void* weight,
                                     ElementType weight_type, const float* cos, const float* sin,
                                     const float* rstd, void* dx, int64_t dx_pitch,
                                     float* dweight, float* workspace, int64_t workspace_floats,
                                     void* stream);

// out = x + delta elementwise over n values (out has x's type).
const char* LaunchResidualAdd(int64_t n, const void* x, ElementType x_type, const void* delta,
                              ElementType delta_type, void* out, void* stream);

// out = x * *scale over n values (x fp32, scale one fp32 value on the device), computed in fp32
// and rounded once to out_type.
const char* LaunchScaledCopy(int64_t n, const float* x, const float* scale, void* out,
                             ElementType out_type, void* stream);

// Per-row cross-entropy of logits [rows, vocab] against targets [rows] (int64; ignore_index
// rows count 0), of softcap * tanh(logits / softcap) when softcap > 0: loss [rows] fp32
// (written). With write_grad the logits are overwritten by the loss's gradient with respect to
// them (softmax - onehot(target), times the cap's slope), zero rows where ignored.
const char* LaunchCrossEntropyRows(int64_t rows, int64_t vocab, void* logits, ElementType type,
                                   const int64_t* targets, int64_t ignore_index, float softcap,
                                   float* loss, bool write_grad, void* stream);

// Gemma 2's attention softmax over scores [rows, keys] (one dtype), the row's query at
// position row % queries: probs = softmax over the keys it attends to (causal; within `window`
// when window > 0) of softcap * tanh(scores * scale / softcap) (no cap when softcap <= 0), 0
// elsewhere, computed in fp32.
const char* LaunchSoftcapSoftmaxForward(int64_t rows, int64_t keys, int64_t queries,
                                        const void* scores, void* probs, ElementType type,
                                        float scale, float softcap, int64_t window,
                                        void* stream);
// dscores from dprobs, the forward's scores and probs.
const char* LaunchSoftcapSoftmaxBackward(int64_t rows, int64_t keys, int64_t queries,
                                         const void* scores, const void* probs,
                                         const void* dprobs, void* dscores, ElementType type,
                                         float scale, float softcap, int64_t window,
                                         void* stream);

// One tensor of an AdamW step: fp32 parameter and moments, a gradient of the launch's type, the
// step count this step uses (1 at the first; fp32, on the device) and, unless null, where the new
// value goes rounded to bf16 (numel values, contiguous).
struct AdamWTensor {
  float* param;
  const void* grad;
  float* exp_avg;
  float* exp_avg_sq;
  const float* step;
  void* bf16_copy;
  int64_t numel;
};
struct AdamWScalars {
  float lr;
  const float* device_lr;  // read instead of lr where set (a CUDA graph replays it)
  double beta1, beta2;
  float eps, weight_decay;
  const float* grad_coefficient;  // each gradient read as g * *grad_coefficient where set
};
// PyTorch's AdamW (decoupled weight decay, bias-corrected moments) over `count` tensors whose
// gradients are all of `grad_type`, in fp32 arithmetic, one read and one write of each value.
const char* LaunchAdamW(const AdamWTensor* tensors, int64_t count, ElementType grad_type,
                        const AdamWScalars& scalars, void* stream);

}  // namespace kernels
}  // namespace cpptrain

#endif  // CPPTRAIN_KERNELS_LAUNCHERS_H_
