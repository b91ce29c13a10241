// ZeRO stage 3: parameters, gradients and optimizer state all partitioned. Built on FSDP1's
// flat sharding (sharding/flat_shard.h, FULL_SHARD semantics) through ShardedEngine, with
// DeepSpeed's keys mapped onto it:
//   stage3_param_persistence_threshold  units (decoder layers) holding fewer parameters are
//       not wrapped: their parameters join the root group, gathered once around the whole
//       forward and backward instead of per unit (DeepSpeed keeps such parameters
//       unpartitioned; here they are still sharded between steps). 0 wraps every layer.
//   stage3_prefetch_bucket_size         0 turns prefetching off (forward and backward);
//       otherwise the next unit is gathered ahead (one unit ahead: the size is not a limit).
//   offload_param_device CPU, offload_optimizer_device CPU  FlatShard's offload_params: flat
//       shards, their gradients and the optimizer state stay in host memory (CUDA only; on
//       the CPU nothing moves). Either key turns on the same thing.
//   stage3_max_live_parameters, stage3_max_reuse_distance, stage3_gather_16bit_weights_on_
//       model_save, overlap_comm, contiguous_gradients, round_robin_gradients,
//       reduce_bucket_size, allgather_bucket_size: accepted, no effect (one collective per unit
//       already; checkpoints are sharded and every engine reads them).
// bf16/fp16 gather in that dtype (param_dtype) and reduce in fp32, as FSDP1 does under mixed
// precision. Every micro-batch is reduce-scattered, also under gradient accumulation
// (DeepSpeed's way; FSDP's no_sync is not taken). Checkpoints are FSDP1's: rows split over the
// ranks, read by every engine.
//
//   CT_ASSIGN_OR_RETURN(auto engine, Zero3Engine::Create(config, precision, device, mesh));
//   CT_RETURN_IF_ERROR(engine->PrepareForTraining(model, factory));
#ifndef CPPTRAIN_ENGINES_ZERO_ZERO3_ENGINE_H_
#define CPPTRAIN_ENGINES_ZERO_ZERO3_ENGINE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engines/fsdp/sharded_engine.h"
#include "proto/engines.pb.h"
#include "sharding/flat_shard.h"

namespace cpptrain {

// FlatShard options for a ZeRO-3 config and the training arguments' precision.
FlatShardOptions Zero3FlatShardOptions(const proto::ZeroConfig& config, MixedPrecision precision,
                                       c10::Device device);

class Zero3Engine : public ShardedEngine {
 public:
  // Errors: zero.stage is not 3, fp16 off CUDA.
  static absl::StatusOr<std::unique_ptr<Zero3Engine>> Create(const proto::ZeroConfig& config,
                                                             MixedPrecision precision,
                                                             c10::Device device, ShardMesh mesh);

  std::string name() const override { return "zero3"; }
  void ResetOptimizer() override;
  // Ignores `enabled`: as DeepSpeed's stage 3 does, every micro-batch's gradients are
  // reduce-scattered and added into the partitioned gradients, so under accumulation no rank
  // keeps a full fp32 gradient of a unit between micro-batches (FSDP's no_sync keeps one: 4
  // bytes per parameter per rank). Costs one reduce-scatter per unit per micro-batch.
  void SetGradientSync(bool enabled) override;

  // Null before PrepareForInference/PrepareForTraining.
  FlatShardedModel* flat() const { return flat_; }

 private:
  absl::StatusOr<ShardingCore*> ShardModel(TrainableModel& model) override;

  Zero3Engine(const proto::ZeroConfig& config, MixedPrecision precision, c10::Device device,
              ShardMesh mesh);

  proto::ZeroConfig config_;
  FlatShardedModel* flat_ = nullptr;
};

}  // namespace cpptrain

#endif  // CPPTRAIN_ENGINES_ZERO_ZERO3_ENGINE_H_
