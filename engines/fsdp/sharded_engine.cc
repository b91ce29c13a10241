#include "engines/fsdp/sharded_engine.h"

#include <torch/types.h>

#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "engines/grad_utils.h"
#include "engines/gradient_scaling.h"
#include "engines/host_collectives.h"

namespace cpptrain {
namespace {

// Gathers the root around the forward (the model's Forward need not pass through the root's
// hook), then frees what a backward will not need; autocast inside.
class CoreForwardScope : public ForwardScope {
 public:
  CoreForwardScope(ShardingCore* core, std::unique_ptr<ForwardScope> autocast, absl::Status* error)
      : core_(core), autocast_(std::move(autocast)), error_(error) {
    absl::Status begun = core_->BeginForward();
    TORCH_CHECK(begun.ok(), "FSDP: ", begun.ToString());
  }
  ~CoreForwardScope() override {
    absl::Status ended = core_->EndForward();
    if (!ended.ok() && error_->ok()) *error_ = ended;
  }

 private:
  ShardingCore* core_;
  std::unique_ptr<ForwardScope> autocast_;
  absl::Status* error_;
};

}  // namespace

ShardedEngine::ShardedEngine(c10::Device device, MixedPrecision precision, ShardMesh mesh)
    : LocalEngine(device, precision),
      mesh_(std::move(mesh)),
      rank_((mesh_.replicate ? mesh_.replicate->rank() * mesh_.shard->size() : 0) +
            mesh_.shard->rank()) {}

absl::Status ShardedEngine::PrepareForInference(std::shared_ptr<TrainableModel> model) {
  if (model_ == model) return absl::OkStatus();
  if (model_ != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the ", name(), " engine already holds another model's shards: use one engine per model"));
  }
  CT_ASSIGN_OR_RETURN(core_, ShardModel(*model));
  model_ = std::move(model);
  return absl::OkStatus();
}

absl::Status ShardedEngine::PrepareForTraining(std::shared_ptr<TrainableModel> model,
                                               const OptimizerFactory& factory) {
  CT_RETURN_IF_ERROR(LocalEngine::PrepareForTraining(std::move(model), factory));
  auto* scaling = dynamic_cast<ScalesGradientsInStep*>(optimizer_.get());
  core_->HoldBf16Gradients(scaling != nullptr && scaling->ReadsBf16Gradients());
  return absl::OkStatus();
}

std::unique_ptr<ForwardScope> ShardedEngine::EnterForward() {
  TORCH_CHECK(core_ != nullptr, "FSDP: EnterForward before PrepareForInference");
  return std::make_unique<CoreForwardScope>(core_, LocalEngine::EnterForward(), &forward_error_);
}

absl::Status ShardedEngine::Backward(const torch::Tensor& loss) {
  if (core_ == nullptr) return absl::FailedPreconditionError("Backward before PrepareForTraining");
  absl::Status status = std::move(forward_error_);
  forward_error_ = absl::OkStatus();
  if (status.ok()) status = core_->BeginBackward();
  if (status.ok()) status = LocalEngine::Backward(loss);
  // Always finish: it waits for every collective this rank issued and reports hook errors
  // (which name the collective) ahead of the autograd exception that carried them.
  absl::Status finished = core_->FinishBackward();
  if (!finished.ok()) return finished;
  return status;
}

void ShardedEngine::SetGradientSync(bool enabled) {
  if (core_ != nullptr) core_->SetGradientSync(enabled);
}

absl::StatusOr<torch::Tensor> ShardedEngine::ClipGradNorm(double max_norm) {
  if (optimizer_ == nullptr) {
    return absl::FailedPreconditionError("ClipGradNorm before PrepareForTraining");
  }
  CT_RETURN_IF_ERROR(UnscaleOnce());
  std::vector<torch::Tensor> grads = Gradients(*optimizer_);
  // Each rank holds disjoint parts: the squares add up over the shard group. Replicas hold
  // the same parts, so the replicate dimension is not summed.
  CT_ASSIGN_OR_RETURN(at::Tensor squares, CatchTorch([&] {
                        at::Tensor norm = GlobalNorm(grads).to(at::kFloat);
                        return (norm * norm).reshape({1}).to(device_);
                      }));
  CT_ASSIGN_OR_RETURN(std::unique_ptr<Work> work, mesh_.shard->AllReduce(squares, ReduceOp::kSum));
  CT_RETURN_IF_ERROR(work->Wait());  // the current stream waits; the host does not
  return CatchTorch([&] {
    // The square root in double, as the host's std::sqrt of the fp32 sum.
    torch::Tensor norm = squares.reshape({}).to(at::kDouble).sqrt();
    // The fused step scales the local parts as it reads them: no pass of its own over them.
    if (max_norm > 0) ClipOrDefer(grads, ClipCoefficient(norm, max_norm));
    return norm;
  });
}

absl::StatusOr<bool> ShardedEngine::OptimizerStep() {
  // The optimizer steps local parts: no group may still hold its full parameters.
  if (core_ != nullptr) CT_RETURN_IF_ERROR(core_->ReshardAll());
  return LocalEngine::OptimizerStep();
}

void ShardedEngine::ZeroGrad() {
  if (core_ != nullptr) {
    core_->DiscardGradients();
    // A failed step may have left groups gathered; their errors were reported already.
    const absl::Status resharded = core_->ReshardAll();
    if (!resharded.ok()) LOG(WARNING) << "FSDP: resharding after a failed step: " << resharded;
  }
  LocalEngine::ZeroGrad();
}

absl::StatusOr<bool> ShardedEngine::AllRanksFinite(bool local_finite) {
  return AllRanksFiniteOver({mesh_.shard.get(), mesh_.replicate.get()}, device_, local_finite);
}

absl::StatusOr<torch::Tensor> ShardedEngine::AllReduceSum(const torch::Tensor& values) {
  return AllReduceSumOver({mesh_.shard.get(), mesh_.replicate.get()}, device_, values);
}

// Rank = replicate coordinate * shard size + shard coordinate: the shard group is the inner
// dimension.
absl::StatusOr<torch::Tensor> ShardedEngine::AllGather(const torch::Tensor& values) {
  return AllGatherOver({mesh_.shard.get(), mesh_.replicate.get()}, device_, values);
}

}  // namespace cpptrain
