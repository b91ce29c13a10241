// FSDP1: each wrapped unit's parameters (and the root's) are one flat parameter sharded evenly
// over the shard group (sharding/flat_shard.h); the optimizer steps each original parameter's
// 1-d piece of it, so parameters, gradients and optimizer state take 1/N of the memory on each
// of N shard ranks. Selected by `fsdp { version: 1 }` with Hugging Face's sharding_strategy:
//   FULL_SHARD           shard over all ranks, free each unit's parameters after its forward
//   SHARD_GRAD_OP        shard over all ranks, keep them gathered from forward to backward
//   NO_SHARD             every rank holds everything; gradients are all-reduced (like DDP)
//   HYBRID_SHARD         shard inside a replica group of dp_shard_size ranks, replicate over
//                        dp_replicate_size groups (gradients all-reduced over replicas)
//   HYBRID_SHARD_ZERO2   HYBRID_SHARD that keeps parameters gathered like SHARD_GRAD_OP
//                        (Hugging Face's `_HYBRID_SHARD_ZERO2`)
// PrepareForInference shards the model without an optimizer or gradients, so evaluate() and
// predict() work before any train(); a later PrepareForTraining builds the optimizer on the
// same shards.
//
//   CT_ASSIGN_OR_RETURN(ShardMesh mesh, Fsdp1MeshFromEnvironment(config, timeout, use_cpu));
//   CT_ASSIGN_OR_RETURN(auto engine, Fsdp1Engine::Create(config, precision, device, mesh));
//   CT_RETURN_IF_ERROR(engine->PrepareForTraining(model, factory));
#ifndef CPPTRAIN_ENGINES_FSDP_FSDP1_ENGINE_H_
#define CPPTRAIN_ENGINES_FSDP_FSDP1_ENGINE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engines/fsdp/sharded_engine.h"
#include "proto/engines.pb.h"
#include "sharding/flat_shard.h"

namespace cpptrain {

// FlatShard options from the fsdp config and the training arguments' precision (param_dtype
// defaults to bf16/fp16 when those are on; reduce_dtype to fp32 under mixed precision).
FlatShardOptions FlatShardOptionsFromConfig(const proto::FsdpConfig& config,
                                            MixedPrecision precision, c10::Device device);

// The mesh shape sharding_strategy asks for: {replicas, shard ranks}. NO_SHARD: {world, 1};
// HYBRID_*: {dp_replicate_size, world / dp_replicate_size}, where an unset dp_replicate_size
// means one replica per host (world / local_world_size); otherwise {1, world}.
std::pair<int, int> Fsdp1MeshShape(const proto::FsdpConfig& config, int world_size,
                                   int local_world_size);

class Fsdp1Engine : public ShardedEngine {
 public:
  // Errors: fsdp.version is not 1; fp16 off CUDA; a mesh whose shape is not the one
  // sharding_strategy asks for (Fsdp1MeshShape).
  static absl::StatusOr<std::unique_ptr<Fsdp1Engine>> Create(const proto::FsdpConfig& config,
                                                             MixedPrecision precision,
                                                             c10::Device device, ShardMesh mesh);

  std::string name() const override { return "fsdp1"; }

  // Null before PrepareForInference/PrepareForTraining.
  FlatShardedModel* flat() const { return flat_; }

 private:
  absl::StatusOr<ShardingCore*> ShardModel(TrainableModel& model) override;

  Fsdp1Engine(const proto::FsdpConfig& config, MixedPrecision precision, c10::Device device,
              ShardMesh mesh, FlatShardOptions options);

  proto::FsdpConfig config_;
  FlatShardOptions options_;
  FlatShardedModel* flat_ = nullptr;
};

}  // namespace cpptrain

#endif  // CPPTRAIN_ENGINES_FSDP_FSDP1_ENGINE_H_
