#include "engines/fsdp/fsdp1_engine.h"

#include <c10/core/Device.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status.h"
#include "engines/fsdp/internal/fsdp_options.h"

namespace cpptrain {
namespace {

bool KeepsParametersAfterForward(proto::FsdpConfig::ShardingStrategy strategy) {
  return strategy == proto::FsdpConfig::SHARD_GRAD_OP ||
         strategy == proto::FsdpConfig::HYBRID_SHARD_ZERO2 ||
         strategy == proto::FsdpConfig::NO_SHARD;
}

}  // namespace

FlatShardOptions FlatShardOptionsFromConfig(const proto::FsdpConfig& config,
                                            MixedPrecision precision, c10::Device device) {
  FlatShardOptions options;
  options.device = device;
  options.wrap = fsdp_options::WrapPolicyOf(config);
  options.reshard_after_forward = !KeepsParametersAfterForward(config.sharding_strategy());
  options.param_dtype = fsdp_options::ParamDtype(config, precision);
  options.reduce_dtype = fsdp_options::ReduceDtype(config, precision);
  if (config.has_buffer_dtype()) {
    options.buffer_dtype = fsdp_options::ToScalarType(config.buffer_dtype());
  }
  options.cast_forward_inputs = config.cast_forward_inputs();
  options.offload_params = config.offload_params();
  options.sync_module_states = config.sync_module_states();
  options.forward_prefetch = config.forward_prefetch();
  switch (config.backward_prefetch()) {
    case proto::FsdpConfig::BACKWARD_PRE:
      options.backward_prefetch = CoreOptions::BackwardPrefetch::kPre;
      break;
    case proto::FsdpConfig::BACKWARD_POST:
      options.backward_prefetch = CoreOptions::BackwardPrefetch::kPost;
      break;
    case proto::FsdpConfig::NO_PREFETCH:
      options.backward_prefetch = CoreOptions::BackwardPrefetch::kNone;
      break;
  }
  return options;
}

std::pair<int, int> Fsdp1MeshShape(const proto::FsdpConfig& config, int world_size,
                                   int local_world_size) {
  switch (config.sharding_strategy()) {
    case proto::FsdpConfig::NO_SHARD:
      return {world_size, 1};
    case proto::FsdpConfig::HYBRID_SHARD:
    case proto::FsdpConfig::HYBRID_SHARD_ZERO2: {
      int replicas = config.dp_replicate_size();
      if (replicas <= 1) replicas = std::max(1, world_size / std::max(1, local_world_size));
      return {replicas, world_size / replicas};
    }
    case proto::FsdpConfig::FULL_SHARD:
    case proto::FsdpConfig::SHARD_GRAD_OP:
      break;
  }
  return {1, world_size};
}

absl::StatusOr<std::unique_ptr<Fsdp1Engine>> Fsdp1Engine::Create(const proto::FsdpConfig& config,
                                                                 MixedPrecision precision,
                                                                 c10::Device device,
                                                                 ShardMesh mesh) {
  if (mesh.shard == nullptr) return absl::InvalidArgumentError("Fsdp1Engine needs a communicator");
  if (config.version() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fsdp.version is ", config.version(), " but this is the FSDP1 engine: set fsdp.version=1"));
  }
  if (precision == MixedPrecision::kFp16 && !device.is_cuda()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fp16 is true but the FSDP engine runs on ", device.str(),
        ", where LibTorch has no fp16 autocast: use bf16 on the CPU, or CUDA devices"));
  }
  const int replicas = mesh.replicate ? mesh.replicate->size() : 1;
  if (config.sharding_strategy() == proto::FsdpConfig::NO_SHARD && mesh.shard->size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fsdp.sharding_strategy=NO_SHARD needs a mesh of one shard rank per replica, but the "
        "shard communicator spans ",
        mesh.shard->size(), " ranks: build the mesh with Fsdp1MeshShape"));
  }
  FlatShardOptions options = FlatShardOptionsFromConfig(config, precision, device);
  CT_LOG_RANK0(INFO) << "FSDP1: "
                     << proto::FsdpConfig::ShardingStrategy_Name(config.sharding_strategy())
                     << " over " << replicas << " x " << mesh.shard->size() << " ranks";
  return std::unique_ptr<Fsdp1Engine>(
      new Fsdp1Engine(config, precision, device, std::move(mesh), std::move(options)));
}

Fsdp1Engine::Fsdp1Engine(const proto::FsdpConfig& config, MixedPrecision precision,
                         c10::Device device, ShardMesh mesh, FlatShardOptions options)
    : ShardedEngine(device, precision, std::move(mesh)),
      config_(config),
      options_(std::move(options)) {}

absl::StatusOr<ShardingCore*> Fsdp1Engine::ShardModel(TrainableModel& model) {
  // Recomputation runs inside each unit's hooks, so it can be switched on after sharding too.
  if (config_.activation_checkpointing()) model.SetGradientCheckpointing(true);
  FlatShardedModel* flat = FlatShardedOf(model);
  if (flat != nullptr) {
    // Flat-sharded at load time: adopt its flat parameters as they are.
    if (flat->mesh().world_size() != mesh_.world_size() ||
        flat->mesh().shard->size() != mesh_.shard->size() || flat->device() != device_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the model was flat-sharded over ", flat->mesh().shard->size(), " shard ranks (world ",
          flat->mesh().world_size(), ", ", flat->device().str(), ") but the FSDP1 engine spans ",
          mesh_.shard->size(), " (world ", mesh_.world_size(), ", ", device_.str(),
          "): shard it over the same ranks and device, or leave it unsharded"));
    }
    CT_LOG_RANK0(INFO) << "FSDP1: adopting the flat parameters of a model sharded at load time";
  } else if (model.sharding() != nullptr) {
    return absl::InvalidArgumentError(
        "the model was sharded at load time per parameter (FullyShard, FSDP2) but fsdp.version "
        "is 1: set fsdp.version=2, or load the model unsharded");
  } else {
    CT_ASSIGN_OR_RETURN(flat, FlatShard(model, mesh_, options_));
  }
  flat_ = flat;
  return flat;
}

}  // namespace cpptrain
