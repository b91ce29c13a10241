#include "base/torch_compat.h"

#include <cmath>
#include <optional>

#include <ATen/autocast_mode.h>
#include <torch/optim/optimizer.h>
#include <torch/version.h>

#ifdef CPPTRAIN_HAS_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace cpptrain {

#ifdef CPPTRAIN_HAS_CUDA
int64_t PeakAllocatedBytes(const at::Device& device) {
  if (!device.is_cuda()) return -1;
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
  return stats.allocated_bytes[0].peak;  // StatType::AGGREGATE
}

int64_t AllocatedBytes(const at::Device& device) {
  if (!device.is_cuda()) return -1;
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
  return stats.allocated_bytes[0].current;  // StatType::AGGREGATE
}

void ResetPeakMemory(const at::Device& device) {
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
}

void SynchronizeDevice(const at::Device& device) {
  if (device.is_cuda()) c10::cuda::device_synchronize();
}
#else
int64_t PeakAllocatedBytes(const at::Device&) { return -1; }
int64_t AllocatedBytes(const at::Device&) { return -1; }
void ResetPeakMemory(const at::Device&) {}
void SynchronizeDevice(const at::Device&) {}
#endif

at::Tensor SlidingWindowMask(int64_t t, int64_t window, const at::Device& device) {
  const at::Tensor positions = at::arange(t, at::TensorOptions().dtype(at::kLong).device(device));
  const at::Tensor distance = positions.unsqueeze(1) - positions.unsqueeze(0);  // t - s
  at::Tensor allowed = distance.ge(0);
  if (window > 0) allowed = allowed.logical_and(distance.lt(window));
  return allowed;
}

namespace {

#if TORCH_VERSION_MAJOR >= 2
void* OptimizerStateKey(const at::Tensor& param) { return param.unsafeGetTensorImpl(); }
#else
std::string OptimizerStateKey(const at::Tensor& param) {
  return c10::guts::to_string(param.unsafeGetTensorImpl());
}
#endif

// The sliding-window causal mask [T, T], or options.mask [B, 1, T, T] within the window.
at::Tensor AllowedKeys(const at::Tensor& q, const AttentionOptions& options) {
  if (!options.mask.defined()) return SlidingWindowMask(q.size(2), options.window, q.device());
  if (options.window <= 0 || options.window >= q.size(2)) return options.mask;
  return options.mask.logical_and(SlidingWindowMask(q.size(2), options.window, q.device()));
}

}  // namespace

torch::optim::OptimizerParamState* FindOptimizerParamState(torch::optim::Optimizer& optimizer,
                                                           const at::Tensor& param) {
  auto it = optimizer.state().find(OptimizerStateKey(param));
  return it == optimizer.state().end() ? nullptr : it->second.get();
}

void SetOptimizerParamState(torch::optim::Optimizer& optimizer, const at::Tensor& param,
                            std::unique_ptr<torch::optim::OptimizerParamState> state) {
  optimizer.state()[OptimizerStateKey(param)] = std::move(state);
}

at::Tensor AutocastComputeCopy(const at::Tensor& t) {
  // Autocast's own rule: floating tensors other than fp64 are cast.
  if (!t.defined() || !t.is_floating_point() || t.scalar_type() == at::kDouble) return t;
  const at::DeviceType device = t.device().type();
  return AutocastEnabled(device) ? t.to(AutocastDtype(device)) : t;
}

#if TORCH_VERSION_MAJOR >= 2

AutocastGuard::AutocastGuard(at::DeviceType device_type, at::ScalarType dtype)
    : device_type_(device_type),
      previous_enabled_(AutocastEnabled(device_type)),
      previous_dtype_(AutocastDtype(device_type)) {
  at::autocast::set_autocast_enabled(device_type_, true);
  at::autocast::set_autocast_dtype(device_type_, dtype);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_type_, previous_enabled_);
  at::autocast::set_autocast_dtype(device_type_, previous_dtype_);
}

bool AutocastEnabled(at::DeviceType device_type) {
  return at::autocast::is_autocast_enabled(device_type);
}

bool FusedAdamWStep(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                    const std::vector<at::Tensor>& exp_avgs,
                    const std::vector<at::Tensor>& exp_avg_sqs,
                    const std::vector<at::Tensor>& steps, double lr, double beta1, double beta2,
                    double weight_decay, double eps, const at::Tensor& grad_scale,
                    const at::Tensor& device_lr) {
  if (params.empty()) return true;
  at::_foreach_add_(steps, 1);
  const auto scale =
      grad_scale.defined() ? c10::optional<at::Tensor>(grad_scale) : c10::nullopt;
  if (device_lr.defined()) {
    at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps,
                      device_lr, beta1, beta2, weight_decay, eps, /*amsgrad=*/false,
                      /*maximize=*/false, scale);
  } else {
    at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, lr,
                      beta1, beta2, weight_decay, eps, /*amsgrad=*/false, /*maximize=*/false,
                      scale);
  }
  return true;
}

bool HasFusedAdamWWithDeviceLr() { return true; }

at::ScalarType AutocastDtype(at::DeviceType device_type) {
  return at::autocast::get_autocast_dtype(device_type);
}

void MultiplyByDeviceScalar(const std::vector<at::Tensor>& tensors, const at::Tensor& scalar) {
  if (tensors.empty()) return;
  at::_foreach_mul_(tensors, scalar.to(tensors[0].device(), tensors[0].scalar_type()));
}

at::Tensor CausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const AttentionOptions& options) {
  const int64_t groups = q.size(1) / k.size(1);
  const std::optional<double> scale =
      options.scale > 0 ? std::optional<double>(options.scale) : std::nullopt;
  if (options.mask.defined() || (options.window > 0 && options.window < q.size(2))) {
    // The kernels that take a mask do not all take grouped keys: expand them.
    const at::Tensor key = groups == 1 ? k : k.repeat_interleave(groups, 1);
    const at::Tensor value = groups == 1 ? v : v.repeat_interleave(groups, 1);
    return at::scaled_dot_product_attention(q, key, value, AllowedKeys(q, options),
                                            options.dropout, /*is_causal=*/false, scale);
  }
  // Grouped keys and values go in as they are: cuDNN's flash attention on Hopper reads them
  // per group (tools/sdpa_gqa_check.py on an H200: forward + backward 0.78 ms instead of
  // 1.00 ms with them expanded to every head, qwen3-0.6b's attention at micro-batch 4).
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, options.dropout,
                                          /*is_causal=*/true, scale,
                                          /*enable_gqa=*/groups != 1);
}

#else  // LibTorch 1.13

AutocastGuard::AutocastGuard(at::DeviceType device_type, at::ScalarType dtype)
    : device_type_(device_type),
      previous_enabled_(AutocastEnabled(device_type)),
      previous_dtype_(AutocastDtype(device_type)) {
  if (device_type_ == at::kCPU) {
    at::autocast::set_cpu_enabled(true);
    at::autocast::set_autocast_cpu_dtype(dtype);
  } else {
    at::autocast::set_enabled(true);
    at::autocast::set_autocast_gpu_dtype(dtype);
  }
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  if (device_type_ == at::kCPU) {
    at::autocast::set_cpu_enabled(previous_enabled_);
    at::autocast::set_autocast_cpu_dtype(previous_dtype_);
  } else {
    at::autocast::set_enabled(previous_enabled_);
    at::autocast::set_autocast_gpu_dtype(previous_dtype_);
  }
}

bool AutocastEnabled(at::DeviceType device_type) {
  return device_type == at::kCPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
}

bool FusedAdamWStep(const std::vector<at::Tensor>&, const std::vector<at::Tensor>&,
                    const std::vector<at::Tensor>&, const std::vector<at::Tensor>&,
                    const std::vector<at::Tensor>&, double, double, double, double, double,
                    const at::Tensor&, const at::Tensor&) {
  return false;
}

bool HasFusedAdamWWithDeviceLr() { return false; }

at::ScalarType AutocastDtype(at::DeviceType device_type) {
  return device_type == at::kCPU ? at::autocast::get_autocast_cpu_dtype()
                                 : at::autocast::get_autocast_gpu_dtype();
}

void MultiplyByDeviceScalar(const std::vector<at::Tensor>& tensors, const at::Tensor& scalar) {
  for (const at::Tensor& t : tensors) t.mul_(scalar.to(t.device(), t.scalar_type()));
}

at::Tensor CausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const AttentionOptions& options) {
  const int64_t groups = q.size(1) / k.size(1);
  at::Tensor key = groups == 1 ? k : k.repeat_interleave(groups, 1);
  at::Tensor value = groups == 1 ? v : v.repeat_interleave(groups, 1);
  const at::Tensor products = at::matmul(q, key.transpose(-2, -1));
  at::Tensor scores = options.scale > 0 ? products * options.scale
                                        : products / std::sqrt(double(q.size(-1)));
  scores = scores.masked_fill(AllowedKeys(q, options).logical_not(),
                              -std::numeric_limits<float>::infinity());
  at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(q.scalar_type());
  // Where transformers' eager attention drops: the probabilities, before they weigh the values.
  if (options.dropout > 0) probs = at::dropout(probs, options.dropout, /*train=*/true);
  return at::matmul(probs, value);
}

#endif

}  // namespace cpptrain
