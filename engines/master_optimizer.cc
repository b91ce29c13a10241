#include "engines/master_optimizer.h"

#include <utility>

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

MasterOptimizer::MasterOptimizer(std::unique_ptr<torch::optim::Optimizer> inner,
                                 const std::vector<std::pair<at::Tensor, at::Tensor>>& masters)
    : torch::optim::Optimizer(SameGroups(*inner), inner->defaults().clone()),
      inner_(std::move(inner)) {
  for (const auto& [param, master] : masters) master_of_[param.unsafeGetTensorImpl()] = master;
}

torch::Tensor MasterOptimizer::step(LossClosure closure) {
  auto& inner_groups = inner_->param_groups();
  for (size_t i = 0; i < inner_groups.size() && i < param_groups_.size(); ++i) {
    inner_groups[i].set_options(param_groups_[i].options().clone());
  }
  return inner_->step(std::move(closure));
}

StepsStandIns::StandIn MasterOptimizer::StandInFor(const at::Tensor& param) {
  auto it = master_of_.find(param.unsafeGetTensorImpl());
  if (it == master_of_.end()) return {};
  return {inner_.get(), it->second};
}

bool MasterOptimizer::ScaleGradientsInNextStep(double scale) {
  auto* scaling = dynamic_cast<ScalesGradientsInStep*>(inner_.get());
  return scaling != nullptr ? scaling->ScaleGradientsInNextStep(scale) : scale == 1.0;
}

}  // namespace cpptrain
