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

bool MasterOptimizer::ScaleGradientsInNextStep(const at::Tensor& scale) {
  auto* scaling = dynamic_cast<ScalesGradientsInStep*>(inner_.get());
  return scaling != nullptr ? scaling->ScaleGradientsInNextStep(scale) : !scale.defined();
}

bool MasterOptimizer::ReadsBf16Gradients() {
  auto* scaling = dynamic_cast<ScalesGradientsInStep*>(inner_.get());
  return scaling != nullptr && scaling->ReadsBf16Gradients();
}

std::string MasterOptimizer::StepCaptureBlocker() {
  auto* capturable = dynamic_cast<CapturableOptimizer*>(inner_.get());
  if (capturable == nullptr) {
    return "the optimizer has no capturable step (fused AdamW on CUDA parameters has)";
  }
  return capturable->StepCaptureBlocker();
}

void MasterOptimizer::UseDeviceHyperparameters() {
  if (auto* capturable = dynamic_cast<CapturableOptimizer*>(inner_.get())) {
    capturable->UseDeviceHyperparameters();
  }
}

void MasterOptimizer::LoadDeviceHyperparameters() {
  // The options the Trainer set on this wrapper reach the inner optimizer at step(); a replay
  // runs no step(), so they go over here.
  CopyOptionsToInner();
  if (auto* capturable = dynamic_cast<CapturableOptimizer*>(inner_.get())) {
    capturable->LoadDeviceHyperparameters();
  }
}

}  // namespace cpptrain
