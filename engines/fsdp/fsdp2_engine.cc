#include "engines/fsdp/fsdp2_engine.h"

#include <torch/torch.h>

#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "engines/grad_utils.h"
#include "engines/host_collectives.h"

namespace cpptrain {
namespace {

at::ScalarType ToScalarType(proto::DType dtype) {
  switch (dtype) {
    case proto::BF16:
      return at::kBFloat16;
    case proto::FP16:
      return at::kHalf;
    case proto::FP32:
      break;
  }
  return at::kFloat;
}

// Gathers the root around the forward (the model's Forward need not pass through the root's
// hook), then frees what a backward will not need; autocast inside.
class FsdpForwardScope : public ForwardScope {
 public:
  FsdpForwardScope(FullyShardedModel* sharded, std::unique_ptr<ForwardScope> autocast,
                   absl::Status* error)
      : sharded_(sharded), autocast_(std::move(autocast)), error_(error) {
    absl::Status begun = sharded_->BeginForward();
    TORCH_CHECK(begun.ok(), "FSDP: ", begun.ToString());
  }
  ~FsdpForwardScope() override {
    absl::Status ended = sharded_->EndForward();
    if (!ended.ok() && error_->ok()) *error_ = ended;
  }

 private:
  FullyShardedModel* sharded_;
  std::unique_ptr<ForwardScope> autocast_;
  absl::Status* error_;
};

}  // namespace

FullyShardOptions FullyShardOptionsFromConfig(const proto::FsdpConfig& config,
                                              MixedPrecision precision, c10::Device device) {
  FullyShardOptions options;
  options.device = device;
  switch (config.auto_wrap_policy()) {
    case proto::FsdpConfig::TRANSFORMER_BASED_WRAP:
      options.wrap.kind = WrapPolicy::Kind::kTransformer;
      options.wrap.classes.assign(config.transformer_layer_cls_to_wrap().begin(),
                                  config.transformer_layer_cls_to_wrap().end());
      break;
    case proto::FsdpConfig::SIZE_BASED_WRAP:
      options.wrap.kind = WrapPolicy::Kind::kSize;
      options.wrap.min_num_params = config.min_num_params();
      break;
    case proto::FsdpConfig::NO_WRAP:
      options.wrap.kind = WrapPolicy::Kind::kNone;
      break;
  }
  if (config.has_reshard_after_forward()) {
    options.reshard_after_forward = config.reshard_after_forward();
  }
  if (config.has_param_dtype()) {
    options.param_dtype = ToScalarType(config.param_dtype());
  } else if (precision == MixedPrecision::kBf16) {
    options.param_dtype = at::kBFloat16;
  } else if (precision == MixedPrecision::kFp16) {
    options.param_dtype = at::kHalf;
  }
  if (config.has_reduce_dtype()) {
    options.reduce_dtype = ToScalarType(config.reduce_dtype());
  } else if (precision != MixedPrecision::kNone) {
    options.reduce_dtype = at::kFloat;
  }
  if (config.has_output_dtype()) options.output_dtype = ToScalarType(config.output_dtype());
  options.cast_forward_inputs = config.cast_forward_inputs();
  options.offload_params = config.offload_params();
  options.sync_module_states = config.sync_module_states();
  options.backward_prefetch = config.backward_prefetch() != proto::FsdpConfig::NO_PREFETCH;
  return options;
}

absl::StatusOr<std::unique_ptr<Fsdp2Engine>> Fsdp2Engine::Create(const proto::FsdpConfig& config,
                                                                 MixedPrecision precision,
                                                                 c10::Device device,
                                                                 ShardMesh mesh) {
  if (mesh.shard == nullptr) return absl::InvalidArgumentError("Fsdp2Engine needs a communicator");
  if (config.version() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fsdp.version is ", config.version(), " but this is the FSDP2 engine: set fsdp.version=2"));
  }
  if (precision == MixedPrecision::kFp16 && !device.is_cuda()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fp16 is true but the FSDP engine runs on ", device.str(),
        ", where LibTorch has no fp16 autocast: use bf16 on the CPU, or CUDA devices"));
  }
  FullyShardOptions options = FullyShardOptionsFromConfig(config, precision, device);
  return std::unique_ptr<Fsdp2Engine>(
      new Fsdp2Engine(config, precision, device, std::move(mesh), std::move(options)));
}

absl::StatusOr<std::unique_ptr<Fsdp2Engine>> Fsdp2Engine::ForShardedModel(
    const TrainableModel& model, MixedPrecision precision) {
  FullyShardedModel* sharded = FullyShardedOf(model);
  if (sharded == nullptr) {
    return absl::InvalidArgumentError("Fsdp2Engine::ForShardedModel: the model is not sharded");
  }
  proto::FsdpConfig config;
  config.set_version(2);
  const FullyShardOptions& options = sharded->options();
  if (precision == MixedPrecision::kFp16 && !sharded->device().is_cuda()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fp16 is true but the sharded model lives on ", sharded->device().str(),
        ", where LibTorch has no fp16 autocast: use bf16 on the CPU, or CUDA devices"));
  }
  return std::unique_ptr<Fsdp2Engine>(
      new Fsdp2Engine(config, precision, sharded->device(), sharded->mesh(), options));
}

Fsdp2Engine::Fsdp2Engine(const proto::FsdpConfig& config, MixedPrecision precision,
                         c10::Device device, ShardMesh mesh, FullyShardOptions options)
    : LocalEngine(device, precision),
      config_(config),
      mesh_(std::move(mesh)),
      options_(std::move(options)),
      rank_((mesh_.replicate ? mesh_.replicate->rank() * mesh_.shard->size() : 0) +
            mesh_.shard->rank()) {}

absl::Status Fsdp2Engine::PrepareForInference(std::shared_ptr<TrainableModel> model) {
  if (model_ == model) return absl::OkStatus();
  if (model_ != nullptr) {
    return absl::FailedPreconditionError(
        "the FSDP engine already holds another model's shards: use one engine per model");
  }
  FullyShardedModel* sharded = FullyShardedOf(*model);
  if (sharded != nullptr) {
    // Sharded at load time: adopt its shards as they are.
    if (sharded->mesh().world_size() != mesh_.world_size() ||
        sharded->mesh().shard->size() != mesh_.shard->size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the model was sharded over ", sharded->mesh().shard->size(), " shard ranks (world ",
          sharded->mesh().world_size(), ") but the FSDP engine spans ", mesh_.shard->size(),
          " (world ", mesh_.world_size(),
          "): shard it over the same ranks, or leave it unsharded "
          "and let the engine shard it"));
    }
    if (sharded->device() != device_) {
      return absl::InvalidArgumentError(absl::StrCat("the model's shards live on ",
                                                     sharded->device().str(),
                                                     " but the FSDP engine runs on ", device_.str(),
                                                     ": shard it with device ", device_.str()));
    }
    CT_LOG_RANK0(INFO) << "FSDP2: adopting the shards of a model sharded at load time ("
                       << sharded->num_groups() << " groups)";
  } else {
    if (config_.activation_checkpointing()) model->SetGradientCheckpointing(true);
    CT_ASSIGN_OR_RETURN(sharded, FullyShard(*model, mesh_, options_));
  }
  sharded_ = sharded;
  model_ = std::move(model);
  return absl::OkStatus();
}

std::unique_ptr<ForwardScope> Fsdp2Engine::EnterForward() {
  TORCH_CHECK(sharded_ != nullptr, "FSDP: EnterForward before PrepareForInference");
  return std::make_unique<FsdpForwardScope>(sharded_, LocalEngine::EnterForward(), &forward_error_);
}

absl::Status Fsdp2Engine::Backward(const torch::Tensor& loss) {
  if (sharded_ == nullptr)
    return absl::FailedPreconditionError("Backward before PrepareForTraining");
  absl::Status status = std::move(forward_error_);
  forward_error_ = absl::OkStatus();
  if (status.ok()) status = sharded_->BeginBackward();
  if (status.ok()) status = LocalEngine::Backward(loss);
  // Always finish: it waits for every collective this rank issued and reports hook errors
  // (which name the collective) ahead of the autograd exception that carried them.
  absl::Status finished = sharded_->FinishBackward();
  if (!finished.ok()) return finished;
  return status;
}

void Fsdp2Engine::SetGradientSync(bool enabled) {
  if (sharded_ != nullptr) sharded_->SetGradientSync(enabled);
}

absl::StatusOr<double> Fsdp2Engine::ClipGradNorm(double max_norm) {
  if (optimizer_ == nullptr) {
    return absl::FailedPreconditionError("ClipGradNorm before PrepareForTraining");
  }
  CT_RETURN_IF_ERROR(UnscaleOnce());
  std::vector<torch::Tensor> grads = Gradients(*optimizer_);
  // Each rank holds disjoint chunks: the squares add up over the shard group. Replicas hold
  // the same chunks, so the replicate dimension is not summed.
  CT_ASSIGN_OR_RETURN(at::Tensor squares, CatchTorch([&] {
                        at::Tensor norm = GlobalNorm(grads).to(at::kFloat);
                        return (norm * norm).reshape({1}).to(device_);
                      }));
  CT_ASSIGN_OR_RETURN(std::unique_ptr<Work> work, mesh_.shard->AllReduce(squares, ReduceOp::kSum));
  CT_RETURN_IF_ERROR(work->Synchronize());
  return CatchTorch([&] {
    const double norm = std::sqrt(squares.cpu().item<double>());
    if (max_norm > 0) ClipByNorm(grads, norm, max_norm);
    return norm;
  });
}

absl::StatusOr<bool> Fsdp2Engine::OptimizerStep() {
  // The optimizer steps chunks: no group may still hold its full parameters.
  if (sharded_ != nullptr) CT_RETURN_IF_ERROR(sharded_->ReshardAll());
  return LocalEngine::OptimizerStep();
}

absl::StatusOr<bool> Fsdp2Engine::AllRanksFinite(bool local_finite) {
  return AllRanksFiniteOver({mesh_.shard.get(), mesh_.replicate.get()}, device_, local_finite);
}

absl::StatusOr<torch::Tensor> Fsdp2Engine::AllReduceSum(const torch::Tensor& values) {
  return AllReduceSumOver({mesh_.shard.get(), mesh_.replicate.get()}, device_, values);
}

// Rank = replicate coordinate * shard size + shard coordinate: the shard group is the inner
// dimension.
absl::StatusOr<torch::Tensor> Fsdp2Engine::AllGather(const torch::Tensor& values) {
  return AllGatherOver({mesh_.shard.get(), mesh_.replicate.get()}, device_, values);
}

}  // namespace cpptrain
