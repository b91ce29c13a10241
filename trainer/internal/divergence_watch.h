// Notices a training run whose loss or gradient norm stopped being finite, without making the
// host wait for the device on every step: each step's values are folded into a device tensor
// (the first step each went bad, and how), and the ranks read and agree on it only where the
// host reads the step's results anyway (logging, evaluation) and before anything is saved.
// A NaN or infinite loss or gradient norm on a step the optimizer applied is fatal: the update
// has put the same into the weights (clipping scales every gradient by max_norm / norm), so
// every later step and checkpoint would be NaN. A step the engine skipped (an fp16 overflow
// under the loss scaler) changed nothing and is the scaler's business. The loss is computed
// before the update, so it lags: a step whose loss was finite can still leave NaN weights
// (an infinite gradient without clipping). So each check also looks at the weights
// themselves (this rank's part of them), which is what keeps a NaN checkpoint from being saved.
//
//   DivergenceWatch watch;                       // per training run
//   watch.Record(step, loss, grad_norm);         // after each applied step; no host sync
//   watch.RecordParameters(step, params);        // where the host waits anyway
//   CT_RETURN_IF_ERROR(watch.Check(group));       // collective: the same verdict on every rank
#ifndef CPPTRAIN_TRAINER_INTERNAL_DIVERGENCE_WATCH_H_
#define CPPTRAIN_TRAINER_INTERNAL_DIVERGENCE_WATCH_H_

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "sharding/host_group.h"

namespace cpptrain {
namespace trainer_internal {

class DivergenceWatch {
 public:
  // Folds in one applied optimizer step: `loss` is this rank's loss (a one-element tensor),
  // `grad_norm` the global gradient norm or undefined without clipping. Queues a few tiny
  // kernels on the values' device; waits for nothing.
  void Record(int64_t step, const torch::Tensor& loss, const torch::Tensor& grad_norm);

  // Looks for a NaN or infinite value in `params` (this rank's part of the weights, in the same
  // order on every rank) after `step`: one pass over them and one host sync.
  void RecordParameters(int64_t step,
                        const std::vector<std::pair<std::string, torch::Tensor>>& params);

  // Collective over `group` (every rank calls it at the same point): waits for the recorded
  // steps, shares every rank's record (one AllReduceSum of 6 x world_size doubles) and returns
  // the same verdict on every rank: OK, or FailedPrecondition naming the first step whose loss
  // (and on which ranks) or gradient norm was NaN or infinite, and the first parameter found
  // non-finite (on which ranks, after which step). The loss is each rank's own, so
  // one rank alone may see it; sharing the records keeps the ranks from deciding differently.
  absl::Status Check(HostGroup& group) const;

  // Forgets every recorded step (a new training run).
  void Reset() {
    first_bad_ = torch::Tensor();
    weights_step_ = 0;
    weights_index_ = 0;
    names_.clear();
  }

 private:
  // [first step with a non-finite loss, its kind, the same for the gradient norm]; a step of
  // 0 is none. Kinds: 1 NaN, 2 +inf, 3 -inf.
  torch::Tensor first_bad_;
  // The first check that found a non-finite parameter (0: none) and which one, of names_.
  int64_t weights_step_ = 0;
  int64_t weights_index_ = 0;
  std::vector<std::string> names_;
};

}  // namespace trainer_internal
}  // namespace cpptrain

#endif  // CPPTRAIN_TRAINER_INTERNAL_DIVERGENCE_WATCH_H_
