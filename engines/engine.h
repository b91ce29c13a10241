// The seam between the Trainer and distribution. The Trainer owns the loop; an Engine owns
// everything about where parameters live: wrapping or sharding the model, placing it on its
// device, building the optimizer over the parameters it owns, backward (loss scaling),
// gradient synchronization, clipping and the optimizer step. The Trainer never asks which
// engine it has.
//
//   std::unique_ptr<Engine> engine = ...;                 // from engines/engine_factory.h
//   CT_RETURN_IF_ERROR(engine->PrepareForTraining(model, optimizer_factory));
//   {
//     std::unique_ptr<ForwardScope> scope = engine->EnterForward();   // autocast
//     loss = ComputeLoss(*model, batch, num_items);
//   }
//   CT_RETURN_IF_ERROR(engine->Backward(loss));
//   CT_ASSIGN_OR_RETURN(torch::Tensor norm, engine->ClipGradNorm(1.0));   // on the device
//   CT_ASSIGN_OR_RETURN(bool stepped, engine->OptimizerStep());
//   engine->ZeroGrad();
#ifndef CPPTRAIN_ENGINES_ENGINE_H_
#define CPPTRAIN_ENGINES_ENGINE_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/optim/optimizer.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engines/loss_scaler.h"
#include "module/trainable_model.h"
#include "sharding/host_group.h"

namespace cpptrain {

using NamedParameters = std::vector<std::pair<std::string, torch::Tensor>>;

// Builds the optimizer over exactly the parameters an engine owns (replicas, local shards or
// flat shards), with their model names so it can form parameter groups.
using OptimizerFactory = std::function<absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>>(
    const NamedParameters& params)>;

// Held while the forward (and loss) runs; an engine uses it for autocast.
class ForwardScope {
 public:
  virtual ~ForwardScope() = default;
};

class Engine : public HostGroup {
 public:
  virtual ~Engine() = default;

  virtual std::string name() const = 0;
  virtual c10::Device device() const = 0;

  // Places (and wraps or shards) the model for inference: no optimizer, no gradients kept.
  // Calling it again, or PrepareForTraining after it, reuses what it did.
  virtual absl::Status PrepareForInference(std::shared_ptr<TrainableModel> model) = 0;

  // Places (and wraps or shards) the model and builds the optimizer with `factory`.
  virtual absl::Status PrepareForTraining(std::shared_ptr<TrainableModel> model,
                                          const OptimizerFactory& factory) = 0;

  virtual std::unique_ptr<ForwardScope> EnterForward() = 0;

  // Backward of `loss` (scaled when the engine uses a loss scaler).
  virtual absl::Status Backward(const torch::Tensor& loss) = 0;

  // Off for the non-final micro-batches of an accumulation: no gradient communication.
  virtual void SetGradientSync(bool enabled) = 0;

  // The global L2 norm of all gradients (over every rank's part), before clipping, as a
  // one-element floating tensor, on the engine's device where it was computed there: the host
  // does not wait for it (read it when it is needed, e.g. to log it). When max_norm > 0,
  // gradients are scaled so their norm is at most max_norm, by the next OptimizerStep at the
  // latest: engines whose optimizer can scale the gradients as it reads them hand it the
  // coefficient (engines/gradient_scaling.h), so until then their gradients read unclipped.
  virtual absl::StatusOr<torch::Tensor> ClipGradNorm(double max_norm) = 0;

  // Applies the optimizer. Returns false when the step was skipped on every rank (for
  // example an fp16 overflow).
  virtual absl::StatusOr<bool> OptimizerStep() = 0;

  // Sets every gradient to none and drops whatever a step left behind: gradients of unsynced
  // micro-batches, reductions in flight and gathered parameters of a step that failed. Nothing
  // of one step reaches the next.
  virtual void ZeroGrad() = 0;

  // Drops the optimizer and its state (and the fp16 loss scale); the next PrepareForTraining
  // builds a new one over the same parameters. For starting training again
  // (auto_find_batch_size after running out of memory).
  virtual void ResetOptimizer() = 0;

  // Null before PrepareForTraining.
  virtual torch::optim::Optimizer* optimizer() = 0;

  // The fp16 dynamic loss scaler, for checkpoints; null without one.
  virtual LossScaler* loss_scaler() { return nullptr; }

  // Around reading or writing the model's parameters from outside a step (checkpoints, exports):
  // between the two calls the parameters hold the values the optimizer steps, at full precision,
  // and whatever is written into them becomes those values at RestoreWorkingWeights. Engines
  // whose parameters are lower-precision working copies of fp32 masters (ZeRO stages 1 and 2
  // under bf16) swap them; for the others both calls do nothing. Collective: every rank calls
  // both, and RestoreWorkingWeights after every successful ExposeMasterWeights.
  virtual absl::Status ExposeMasterWeights() { return absl::OkStatus(); }
  virtual absl::Status RestoreWorkingWeights() { return absl::OkStatus(); }

  // rank(), world_size(), AllReduceSum, AllGather and Barrier: sharding/host_group.h.
};

}  // namespace cpptrain

#endif  // CPPTRAIN_ENGINES_ENGINE_H_
