// The interface an optimizer implements when its per-parameter state is not in
// torch::optim::Optimizer::state() (a fused kernel's own buffers, or an engine's optimizer that
// steps pieces of the model's parameters): the checkpointer (checkpoint/optimizer_state.h) asks
// it first. It lives here, below engines/ and checkpoint/, so an engine can implement it and the
// checkpointer can call it without either including the other.
//
//   class MyOptimizer : public torch::optim::Optimizer, public CheckpointableOptimizer { ... };
//   std::map<std::string, at::Tensor> state = optimizer.ExportState(param);  // exp_avg, ...
#ifndef CPPTRAIN_MODULE_CHECKPOINTABLE_OPTIMIZER_H_
#define CPPTRAIN_MODULE_CHECKPOINTABLE_OPTIMIZER_H_

#include <ATen/core/Tensor.h>

#include <map>
#include <string>

#include "absl/status/status.h"

namespace cpptrain {

class CheckpointableOptimizer {
 public:
  virtual ~CheckpointableOptimizer() = default;
  // The state of model parameter `param`, each tensor shaped like the parameter or a scalar;
  // empty before the first step.
  virtual std::map<std::string, at::Tensor> ExportState(const at::Tensor& param) = 0;
  virtual absl::Status ImportState(const at::Tensor& param,
                                   const std::map<std::string, at::Tensor>& state) = 0;
};

}  // namespace cpptrain

#endif  // CPPTRAIN_MODULE_CHECKPOINTABLE_OPTIMIZER_H_
