#include "engines/loss_scaler.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace cpptrain {

LossScaler::LossScaler(LossScalerOptions options)
    : options_(options), scale_(options.initial_scale), hysteresis_left_(options.hysteresis) {}

bool LossScaler::UnscaleAndCheck(const std::vector<at::Tensor>& grads) const {
  const double inverse = 1.0 / scale_;
  std::vector<at::Tensor> non_finite_counts;
  for (const at::Tensor& grad : grads) {
    if (!grad.defined()) continue;
    grad.mul_(inverse);
    non_finite_counts.push_back(grad.isfinite().logical_not().sum());
  }
  if (non_finite_counts.empty()) return true;
  return at::stack(non_finite_counts).sum().item<int64_t>() == 0;
}

void LossScaler::Update(bool finite) {
  if (!finite) {
    if (--hysteresis_left_ <= 0) {
      scale_ = std::max(scale_ * options_.backoff_factor, options_.min_scale);
      hysteresis_left_ = 1;  // once used up, every further overflow backs off (DeepSpeed)
    }
    clean_steps_ = 0;
    return;
  }
  if (++clean_steps_ >= options_.growth_interval) {
    scale_ *= options_.growth_factor;
    clean_steps_ = 0;
    hysteresis_left_ = options_.hysteresis;
  }
}

void LossScaler::Restore(double scale, int64_t clean_steps) {
  scale_ = scale;
  clean_steps_ = clean_steps;
}

}  // namespace cpptrain
