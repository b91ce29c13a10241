#include "engines/testing/engine_testing.h"

#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <memory>

#include "module/testing/tied_blocks.h"

namespace cpptrain {
namespace testing {

OptimizerFactory SgdFactory(double lr, int* count) {
  return [lr, count](const NamedParameters& params)
             -> absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> {
    std::vector<torch::Tensor> tensors;
    for (const auto& item : params) tensors.push_back(item.second);
    if (count != nullptr) *count = static_cast<int>(tensors.size());
    return std::unique_ptr<torch::optim::Optimizer>(
        std::make_unique<torch::optim::SGD>(tensors, torch::optim::SGDOptions(lr)));
  };
}

SgdReference TiedBlocksSgdStep(const std::vector<Batch>& batches, double lr, double max_norm,
                               bool tied) {
  TiedBlocks model(/*seed=*/1, tied);
  for (const Batch& batch : batches) model.LossSum(model.Forward(batch), batch).backward();
  // parameters() lists the tied tensor twice; the update and the norm take it once.
  std::vector<torch::Tensor> unique;
  for (const torch::Tensor& p : model.parameters()) {
    bool seen = false;
    for (const torch::Tensor& u : unique) seen = seen || u.is_same(p);
    if (!seen) unique.push_back(p);
  }
  double squares = 0;
  for (const torch::Tensor& p : unique) squares += p.grad().square().sum().item<double>();
  SgdReference out;
  out.norm = std::sqrt(squares);
  const double scale = max_norm > 0 ? std::min(1.0, max_norm / (out.norm + 1e-6)) : 1.0;
  torch::NoGradGuard no_grad;
  for (torch::Tensor& p : unique) p.sub_(p.grad() * (lr * scale));
  for (const auto& item : model.named_parameters()) out.params[item.key()] = item.value().clone();
  return out;
}

}  // namespace testing
}  // namespace cpptrain
