// The interface an optimizer implements when its per-parameter state is not in
// torch::optim::Optimizer::state() (a fused kernel's own buffers, or an engine's optimizer that
// steps pieces of the model's parameters): the checkpointer (checkpoint/optimizer_state.h) asks
// it first. It lives here, below engines/ and checkpoint/, so an engine can implement it and the
// checkpointer can call it without either including the other.
//
//   class MyOptimizer : public torch::optim::Optimizer, public CheckpointableOptimizer { ... };
//   std::map<std::string, at::Tensor> state = optimizer.ExportState(param);  // exp_avg, ...
//
// An optimizer that wraps another which steps other tensors in place of the model's parameters
// (the fp32 masters of bf16 working copies, same shapes) implements StepsStandIns instead: the
// checkpointer reads and writes a parameter's state as the inner optimizer's state of its
// stand-in, whatever kind of optimizer that is.
//
//   StepsStandIns::StandIn s = wrapper.StandInFor(param);  // s.optimizer null: not trained
#ifndef CPPTRAIN_MODULE_CHECKPOINTABLE_OPTIMIZER_H_
#define CPPTRAIN_MODULE_CHECKPOINTABLE_OPTIMIZER_H_

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace torch::optim {
class Optimizer;
}

namespace cpptrain {

class CheckpointableOptimizer {
 public:
  virtual ~CheckpointableOptimizer() = default;
  // The state of model parameter `param`, each tensor shaped like the parameter or a scalar;
  // empty before the first step.
  virtual std::map<std::string, at::Tensor> ExportState(const at::Tensor& param) = 0;
  virtual absl::Status ImportState(const at::Tensor& param,
                                   const std::map<std::string, at::Tensor>& state) = 0;
  // The names ExportState(param) gives, from this rank alone: an optimizer whose ExportState is
  // collective (ZeRO's gathers every state tensor) overrides it, so that a caller may ask on
  // one rank, e.g. inside its own read loop.
  virtual std::vector<std::string> StateNames(const at::Tensor& param) {
    std::vector<std::string> names;
    for (const auto& [name, value] : ExportState(param)) names.push_back(name);
    return names;
  }
  // An optimizer whose ExportState is collective (`collective`, the same on every rank)
  // gathers through device memory: `bytes` of it on `device`. A save allocates them on every
  // rank before its first export, agreed on (sharding/agreed_buffer.h), and lends them with
  // UseExportScratch until it ends (an undefined tensor takes them back), so that no rank runs
  // out of device memory between two gathers while the others wait in one.
  struct ExportScratch {
    bool collective = false;
    int64_t bytes = 0;
    c10::Device device = c10::kCPU;
  };
  virtual ExportScratch ExportScratchNeeded() { return {}; }
  virtual void UseExportScratch(const at::Tensor& scratch) {}
};

class StepsStandIns {
 public:
  struct StandIn {
    torch::optim::Optimizer* optimizer = nullptr;  // holds the state; null when not trained
    at::Tensor tensor;                             // the one it steps for the parameter
  };
  virtual ~StepsStandIns() = default;
  virtual StandIn StandInFor(const at::Tensor& param) = 0;
};

}  // namespace cpptrain

#endif  // CPPTRAIN_MODULE_CHECKPOINTABLE_OPTIMIZER_H_
