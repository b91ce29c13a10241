#include "engines/wrapping_optimizer.h"

#include <utility>
#include <vector>

namespace cpptrain {
namespace {

std::vector<torch::optim::OptimizerParamGroup> SameGroups(torch::optim::Optimizer& inner) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (auto& group : inner.param_groups()) {
    groups.emplace_back(group.params(), group.options().clone());
  }
  return groups;
}

}  // namespace

WrappingOptimizer::WrappingOptimizer(std::unique_ptr<torch::optim::Optimizer> inner)
    : torch::optim::Optimizer(SameGroups(*inner), inner->defaults().clone()),
      inner_(std::move(inner)) {}

torch::Tensor WrappingOptimizer::step(LossClosure closure) {
  CopyOptionsToInner();
  return inner_->step(std::move(closure));
}

void WrappingOptimizer::CopyOptionsToInner() {
  auto& inner_groups = inner_->param_groups();
  for (size_t i = 0; i < inner_groups.size() && i < param_groups_.size(); ++i) {
    inner_groups[i].set_options(param_groups_[i].options().clone());
  }
}

}  // namespace cpptrain
