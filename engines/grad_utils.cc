#include "engines/grad_utils.h"

#include <map>
#include <string>
#include <unordered_set>

#include <ATen/ATen.h>
#include <torch/version.h>

#include "base/torch_compat.h"

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

namespace {

// Each tensor's L2 norm as an fp32 value: one multi-tensor kernel per dtype instead of one
// reduction each; a bf16 tensor's norm is not rounded to bf16 (LibTorch >= 2.4 takes the dtype,
// older ones reduce each tensor in fp32).
void AppendFp32Norms(const std::vector<at::Tensor>& same_dtype, std::vector<at::Tensor>& norms) {
  if (same_dtype.empty()) return;
  if (same_dtype[0].scalar_type() == at::kFloat || same_dtype[0].scalar_type() == at::kDouble) {
    for (const at::Tensor& n : at::_foreach_norm(same_dtype, 2)) norms.push_back(n.to(at::kFloat));
    return;
  }
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  for (const at::Tensor& n : at::_foreach_norm(same_dtype, 2, at::kFloat)) norms.push_back(n);
#else
  for (const at::Tensor& t : same_dtype) {
    norms.push_back(at::linalg_vector_norm(t, 2, c10::nullopt, false, at::kFloat));
  }
#endif
}

}  // namespace

at::Tensor GlobalNorm(const std::vector<at::Tensor>& grads) {
  if (grads.empty()) return at::zeros({}, at::kFloat);
  std::map<at::ScalarType, std::vector<at::Tensor>> by_dtype;
  for (const at::Tensor& g : grads) by_dtype[g.scalar_type()].push_back(g);
  std::vector<at::Tensor> norms;
  for (const auto& [dtype, same] : by_dtype) AppendFp32Norms(same, norms);
  return at::stack(norms).pow(2).sum().sqrt();
}

double ClipCoefficient(double norm, double max_norm) { return max_norm / (norm + 1e-6); }

void ClipByNorm(const std::vector<at::Tensor>& grads, double norm, double max_norm) {
  const double coefficient = ClipCoefficient(norm, max_norm);
  if (coefficient >= 1.0 || grads.empty()) return;
  at::_foreach_mul_(grads, coefficient);
}

at::Tensor ClipCoefficient(const at::Tensor& norm, double max_norm) {
  const at::Tensor norm64 = norm.reshape({}).to(at::kDouble);
  // A division of two tensors, so the quotient is rounded once as max_norm / (norm + 1e-6) is
  // on the host (dividing a Scalar by a tensor multiplies by the reciprocal).
  return at::full({}, max_norm, norm64.options()).div(norm64 + 1e-6).clamp_max(1.0);
}

void ScaleGradients(const std::vector<at::Tensor>& grads, const at::Tensor& coefficient) {
  if (grads.empty()) return;
  if (coefficient.device().is_cpu() && grads[0].device().is_cpu()) {
    const double value = coefficient.item<double>();
    if (value < 1.0) at::_foreach_mul_(grads, value);
    return;
  }
  std::map<std::pair<std::string, at::ScalarType>, std::vector<at::Tensor>> groups;
  for (const at::Tensor& g : grads) groups[{g.device().str(), g.scalar_type()}].push_back(g);
  for (const auto& [key, tensors] : groups) {
    const at::ScalarType dtype = key.second;
    if (dtype == at::kFloat || dtype == at::kDouble) {
      MultiplyByDeviceScalar(tensors, coefficient);  // the coefficient in the gradients' dtype
      continue;
    }
    // fp16/bf16: the product in fp32 and rounded once, as a multiply by a host scalar computes
    // it (the multi-tensor kernel would round the coefficient to the gradients' dtype first).
    const at::Tensor coefficient32 = coefficient.to(tensors[0].device(), at::kFloat);
    for (const at::Tensor& g : tensors) g.copy_(g.to(at::kFloat).mul_(coefficient32));
  }
}

void ClearGradients(torch::optim::Optimizer& optimizer) {
  for (auto& group : optimizer.param_groups()) {
    for (at::Tensor& param : group.params()) {
      if (param.grad().defined()) param.mutable_grad().reset();
    }
  }
}

}  // namespace cpptrain
