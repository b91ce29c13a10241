#include "engines/grad_utils.h"

#include <ATen/ATen.h>

namespace cpptrain {

std::vector<at::Tensor> Gradients(const torch::optim::Optimizer& optimizer) {
  std::vector<at::Tensor> grads;
  for (const auto& group : optimizer.param_groups()) {
    for (const at::Tensor& param : group.params()) {
      if (param.grad().defined()) grads.push_back(param.grad());
    }
  }
  return grads;
}

at::Tensor GlobalNorm(const std::vector<at::Tensor>& grads) {
  if (grads.empty()) return at::zeros({}, at::kFloat);
  // One multi-tensor kernel for the per-gradient norms instead of one reduction each.
  std::vector<at::Tensor> norms = at::_foreach_norm(grads, 2);
  return at::stack(norms).to(at::kFloat).pow(2).sum().sqrt();
}

void ClipByNorm(const std::vector<at::Tensor>& grads, double norm, double max_norm) {
  const double coefficient = max_norm / (norm + 1e-6);
  if (coefficient >= 1.0 || grads.empty()) return;
  at::_foreach_mul_(grads, coefficient);
}

void ClearGradients(torch::optim::Optimizer& optimizer) {
  for (auto& group : optimizer.param_groups()) {
    for (at::Tensor& param : group.params()) {
      if (param.grad().defined()) param.mutable_grad().reset();
    }
  }
}

}  // namespace cpptrain
