#include "engines/zero/zero3_engine.h"

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status.h"
#include "engines/zero/zero_engine.h"

namespace cpptrain {

FlatShardOptions Zero3FlatShardOptions(const proto::ZeroConfig& config, MixedPrecision precision,
                                       c10::Device device) {
  FlatShardOptions options;
  options.device = device;
  options.wrap.kind = WrapPolicy::Kind::kSize;
  options.wrap.min_num_params = config.stage3_param_persistence_threshold();
  if (config.stage3_param_persistence_threshold() <= 0) {
    options.wrap.kind = WrapPolicy::Kind::kTransformer;  // every layer its own group
  }
  options.reshard_after_forward = true;
  if (precision == MixedPrecision::kBf16) options.param_dtype = at::kBFloat16;
  if (precision == MixedPrecision::kFp16) options.param_dtype = at::kHalf;
  if (precision != MixedPrecision::kNone) options.reduce_dtype = at::kFloat;
  options.offload_params = config.offload_param_device() == proto::ZeroConfig::CPU ||
                           config.offload_optimizer_device() == proto::ZeroConfig::CPU;
  options.sync_module_states = true;
  const bool prefetch = config.stage3_prefetch_bucket_size() > 0;
  options.forward_prefetch = prefetch;
  options.backward_prefetch =
      prefetch ? CoreOptions::BackwardPrefetch::kPre : CoreOptions::BackwardPrefetch::kNone;
  return options;
}

absl::StatusOr<std::unique_ptr<Zero3Engine>> Zero3Engine::Create(const proto::ZeroConfig& config,
                                                                 MixedPrecision precision,
                                                                 c10::Device device,
                                                                 ShardMesh mesh) {
  if (mesh.shard == nullptr) return absl::InvalidArgumentError("Zero3Engine needs a communicator");
  if (config.stage() != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "zero.stage is ", config.stage(),
        " but this is the ZeRO-3 engine: set zero.stage=3 (stages 1 and 2 are ZeroEngine)"));
  }
  if (precision == MixedPrecision::kFp16 && !device.is_cuda()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fp16 is true but the ZeRO engine runs on ", device.str(),
        ", where LibTorch has no fp16 autocast: use bf16 on the CPU, or CUDA devices"));
  }
  return std::unique_ptr<Zero3Engine>(new Zero3Engine(config, precision, device, std::move(mesh)));
}

Zero3Engine::Zero3Engine(const proto::ZeroConfig& config, MixedPrecision precision,
                         c10::Device device, ShardMesh mesh)
    : ShardedEngine(device, precision, std::move(mesh)), config_(config) {
  if (scaler_) scaler_.emplace(ZeroLossScalerOptions(config_));
}

void Zero3Engine::SetGradientSync(bool /*enabled*/) { ShardedEngine::SetGradientSync(true); }

void Zero3Engine::ResetOptimizer() {
  ShardedEngine::ResetOptimizer();
  if (scaler_) scaler_.emplace(ZeroLossScalerOptions(config_));
}

absl::StatusOr<ShardingCore*> Zero3Engine::ShardModel(TrainableModel& model) {
  if (model.sharding() != nullptr) {
    return absl::InvalidArgumentError(
        "the model was sharded at load time, but zero.stage=3 shards it itself: load it "
        "unsharded, or configure the engine it was sharded for (fsdp { version: 1 or 2 })");
  }
  CT_ASSIGN_OR_RETURN(
      FlatShardedModel * flat,
      FlatShard(model, mesh_, Zero3FlatShardOptions(config_, precision_, device_)));
  CT_LOG_RANK0(INFO) << "ZeRO stage 3: " << flat->num_groups() << " flat parameter groups over "
                     << mesh_.shard->size() << " ranks";
  flat_ = flat;
  return flat;
}

}  // namespace cpptrain
