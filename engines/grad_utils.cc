#include "engines/grad_utils.h"

#include <unordered_set>

#include <ATen/ATen.h>

namespace cpptrain {

std::vector<std::pair<std::string, at::Tensor>> UniqueTrainableParameters(
    const torch::nn::Module& model) {
  std::vector<std::pair<std::string, at::Tensor>> params;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) continue;
    if (seen.insert(item.value().unsafeGetTensorImpl()).second) {
      params.emplace_back(item.key(), item.value());
    }
  }
  return params;
}

std::vector<at::Tensor> Gradients(const torch::optim::Optimizer& optimizer) {
  std::vector<at::Tensor> grads;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& group : optimizer.param_groups()) {
    for (const at::Tensor& param : group.params()) {
      if (!param.grad().defined() || !seen.insert(param.unsafeGetTensorImpl()).second) continue;
      grads.push_back(param.grad());
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

double ClipCoefficient(double norm, double max_norm) { return max_norm / (norm + 1e-6); }

void ClipByNorm(const std::vector<at::Tensor>& grads, double norm, double max_norm) {
  const double coefficient = ClipCoefficient(norm, max_norm);
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
