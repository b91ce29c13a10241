// Every difference between LibTorch 1.13 (Debian, CPU) and LibTorch 2.x (GPU hosts) that the
// project depends on lives here, behind functions with one meaning on both.
//
//   cpptrain::AutocastGuard guard(torch::kCPU, torch::kBFloat16);   // autocast on in scope
//   torch::Tensor out = cpptrain::CausalAttention(q, k, v);        // [B, H, T, D]
#ifndef CPPTRAIN_BASE_TORCH_COMPAT_H_
#define CPPTRAIN_BASE_TORCH_COMPAT_H_

#include <memory>
#include <vector>

#include <ATen/ATen.h>

namespace torch {
namespace optim {
class Optimizer;
class OptimizerParamState;
}  // namespace optim
}  // namespace torch

namespace cpptrain {

// The per-parameter state a torch::optim optimizer keeps for `param` (its state() map is keyed
// by a string in 1.13 and by the TensorImpl pointer in 2.x); null when there is none yet.
torch::optim::OptimizerParamState* FindOptimizerParamState(torch::optim::Optimizer& optimizer,
                                                           const at::Tensor& param);
void SetOptimizerParamState(torch::optim::Optimizer& optimizer, const at::Tensor& param,
                            std::unique_ptr<torch::optim::OptimizerParamState> state);

// Turns autocast on for `device_type` with `dtype` for the guard's lifetime and restores the
// previous state after (the autocast cache is cleared when the outermost guard ends).
class AutocastGuard {
 public:
  AutocastGuard(at::DeviceType device_type, at::ScalarType dtype);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  at::DeviceType device_type_;
  bool previous_enabled_;
  at::ScalarType previous_dtype_;
};

// Whether autocast is on for `device_type`, and its low-precision dtype.
bool AutocastEnabled(at::DeviceType device_type);
at::ScalarType AutocastDtype(at::DeviceType device_type);
// `t` in the dtype at::linear computes with under autocast: the autocast dtype for a floating
// tensor other than fp64 while autocast is on for its device, else `t` itself (also when
// undefined).
at::Tensor AutocastComputeCopy(const at::Tensor& t);

// Peak bytes the caching allocator handed out on a CUDA `device` since the process started
// (or the last ResetPeakMemory); -1 for other devices or builds without CUDA.
int64_t PeakAllocatedBytes(const at::Device& device);
void ResetPeakMemory(const at::Device& device);
// Bytes the caching allocator has handed out on a CUDA `device` and not yet had back; -1 for
// other devices or builds without CUDA.
int64_t AllocatedBytes(const at::Device& device);
// Blocks until `device` has finished all queued work (no-op on the CPU).
void SynchronizeDevice(const at::Device& device);

// One fused AdamW step over same-device tensor lists (PyTorch's _fused_adamw_: decoupled
// weight decay, bias correction from `steps`, which are float32 scalars on the parameters'
// device and are incremented here). Returns false, doing nothing, where this LibTorch has no
// fused kernel (1.13): the caller then steps per parameter. A defined `grad_scale` (one fp32
// element on the parameters' device) divides every gradient as the kernel reads it, and the
// kernel writes the divided gradient back. A defined `device_lr` (one fp32 element on the
// parameters' device) replaces `lr`: the kernel reads it as it runs, so a CUDA graph of the step
// replays with whatever it holds then.
bool FusedAdamWStep(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                    const std::vector<at::Tensor>& exp_avgs,
                    const std::vector<at::Tensor>& exp_avg_sqs,
                    const std::vector<at::Tensor>& steps, double lr, double beta1, double beta2,
                    double weight_decay, double eps, const at::Tensor& grad_scale = {},
                    const at::Tensor& device_lr = {});

// Whether FusedAdamWStep can read its learning rate from the device (2.x; not 1.13).
bool HasFusedAdamWWithDeviceLr();

// Multiplies every tensor of `tensors` (one device, one dtype) in place by `scalar`, a 0-dim
// tensor on that device, without reading it on the host: one multi-tensor kernel in 2.x, which
// takes the scalar in the tensors' dtype (so it is rounded to it first); a mul_ each in 1.13.
void MultiplyByDeviceScalar(const std::vector<at::Tensor>& tensors, const at::Tensor& scalar);

// What CausalAttention may add to plain causal attention.
struct AttentionOptions {
  // > 0: query t attends to keys t - window < s <= t only (Mistral's sliding window, the mask of
  // transformers' sliding_window_overlay); 0: to every key s <= t.
  int64_t window = 0;
  // Dropout on the attention probabilities (softmax output), each kept one scaled by
  // 1 / (1 - dropout), drawn from the default generator; 0 in eval mode.
  double dropout = 0;
  // Defined: bool [B, 1, T, T], true where query t may attend to key s, replacing the causal
  // mask (packed examples: PackedCausalMask in models/decoder_layer.h); the window still
  // applies on top of it.
  at::Tensor mask;
  // > 0: the scores' scale in place of 1 / sqrt(head_dim) (Gemma's query_pre_attn_scalar^-0.5).
  double scale = 0;
};

// [T, T] booleans, true where query t may attend to key s: s <= t and, with a window > 0,
// s > t - window (the mask CausalAttention builds for a window; kernels' references share it).
at::Tensor SlidingWindowMask(int64_t t, int64_t window, const at::Device& device);

// Causal self-attention. q: [B, H, T, D]; k, v: [B, Hkv, T, D] with H a multiple of Hkv
// (grouped-query attention). Returns [B, H, T, D]. Uses the fused kernel where LibTorch has
// one (2.x), a reference implementation otherwise. A window shorter than T is a boolean mask
// for scaled_dot_product_attention in 2.x (its flash and cuDNN kernels take no window: the
// memory-efficient or math kernel runs that call, with the keys and values expanded to every
// head), and a banded mask in the reference. A defined options.mask goes the same way as a
// window (a boolean mask: memory-efficient or math kernel in 2.x, never flash or cuDNN).
at::Tensor CausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const AttentionOptions& options = {});

}  // namespace cpptrain

#endif  // CPPTRAIN_BASE_TORCH_COMPAT_H_
