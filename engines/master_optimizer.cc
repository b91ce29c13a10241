#include "engines/master_optimizer.h"

#include <utility>

namespace cpptrain {

MasterOptimizer::MasterOptimizer(std::unique_ptr<torch::optim::Optimizer> inner,
                                 const std::vector<std::pair<at::Tensor, at::Tensor>>& masters)
    : WrappingOptimizer(std::move(inner)) {
  for (const auto& [param, master] : masters) master_of_[param.unsafeGetTensorImpl()] = master;
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
