// An optimizer's per-parameter state as named tensors, for checkpoints: AdamW/Adam give
// exp_avg, exp_avg_sq (shaped like the parameter, so they shard with it) and step (a float64
// scalar); SGD with momentum gives momentum_buffer. Import restores the same.
//
//   std::map<std::string, at::Tensor> state = ExportOptimizerState(*optimizer, param);
//   CT_RETURN_IF_ERROR(ImportOptimizerState(*optimizer, param, state));
#ifndef CPPTRAIN_CHECKPOINT_OPTIMIZER_STATE_H_
#define CPPTRAIN_CHECKPOINT_OPTIMIZER_STATE_H_

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "module/checkpointable_optimizer.h"

namespace cpptrain {

// Optimizers that keep state outside torch::optim::Optimizer::state() implement
// CheckpointableOptimizer (module/checkpointable_optimizer.h), and wrappers that step stand-ins
// for the parameters StepsStandIns; the functions below ask those first.

// Empty when the optimizer holds no state for `param` yet (before its first step).
std::map<std::string, at::Tensor> ExportOptimizerState(torch::optim::Optimizer& optimizer,
                                                       const at::Tensor& param);

// The names ExportOptimizerState gives, asked of this rank alone (never collective): safe
// where the ranks may not be in step, as inside one rank's own read loop.
std::vector<std::string> OptimizerStateNames(torch::optim::Optimizer& optimizer,
                                             const at::Tensor& param);

// Copies `state` (any device and dtype) into the optimizer's state for `param`. Errors: an
// optimizer type without checkpoint support, a missing or misshapen tensor.
absl::Status ImportOptimizerState(torch::optim::Optimizer& optimizer, const at::Tensor& param,
                                  const std::map<std::string, at::Tensor>& state);

// The same for torch::optim's AdamW, Adam and SGD only (what CheckpointableOptimizer
// implementations fall back to).
std::map<std::string, at::Tensor> ExportTorchOptimizerState(torch::optim::Optimizer& optimizer,
                                                            const at::Tensor& param);
absl::Status ImportTorchOptimizerState(torch::optim::Optimizer& optimizer, const at::Tensor& param,
                                       const std::map<std::string, at::Tensor>& state);

}  // namespace cpptrain

#endif  // CPPTRAIN_CHECKPOINT_OPTIMIZER_STATE_H_
