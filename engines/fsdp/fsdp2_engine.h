// FSDP2: every wrapped unit and the root are sharded per parameter along dim 0
// (sharding/fully_shard.h); the optimizer steps the local chunks directly, so parameters,
// gradients and optimizer state all take 1/N of the memory on each of N shard ranks.
//
// PrepareForInference shards the model (or adopts the shards of a model FullyShard-ed at load
// time) without an optimizer or gradient buffers, so evaluate() and predict() work before any
// train(); a later PrepareForTraining builds the optimizer on those same shards.
//
//   CT_ASSIGN_OR_RETURN(auto engine, Fsdp2Engine::Create(config, precision, device, mesh));
//   CT_RETURN_IF_ERROR(engine->PrepareForTraining(model, factory));
#ifndef CPPTRAIN_ENGINES_FSDP_FSDP2_ENGINE_H_
#define CPPTRAIN_ENGINES_FSDP_FSDP2_ENGINE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engines/fsdp/sharded_engine.h"
#include "proto/engines.pb.h"
#include "sharding/fully_shard.h"

namespace cpptrain {

// FullyShard options from the fsdp config and the training arguments' precision: param_dtype
// defaults to bf16/fp16 when those are on; reduce_dtype defaults to fp32 under mixed
// precision (accurate sums, as torchtitan does) and to param_dtype otherwise.
FullyShardOptions FullyShardOptionsFromConfig(const proto::FsdpConfig& config,
                                              MixedPrecision precision, c10::Device device);

// One line per setting where `config` (null: no fsdp block) and `precision` ask for other
// sharding than `sharded` has, e.g. "fsdp.dp_replicate_size is 2 but the model's mesh has 1
// replica(s)". Empty when they agree.
std::vector<std::string> DisagreementsWithShardedModel(const proto::FsdpConfig* config,
                                                       MixedPrecision precision,
                                                       const FullyShardedModel& sharded);

class Fsdp2Engine : public ShardedEngine {
 public:
  static absl::StatusOr<std::unique_ptr<Fsdp2Engine>> Create(const proto::FsdpConfig& config,
                                                             MixedPrecision precision,
                                                             c10::Device device, ShardMesh mesh);
  // An engine for a model FullyShard-ed at load time: its mesh, device and options. `config`
  // is the job's fsdp block (null without one): every field it sets must agree with the
  // model's sharding (DisagreementsWithShardedModel), or this is an error naming each;
  // activation_checkpointing is applied to the model. Without a block, bf16/fp16 must match
  // the model's param_dtype.
  static absl::StatusOr<std::unique_ptr<Fsdp2Engine>> ForShardedModel(
      const TrainableModel& model, const proto::FsdpConfig* config, MixedPrecision precision);

  std::string name() const override { return "fsdp2"; }

  // Null before PrepareForInference/PrepareForTraining.
  FullyShardedModel* sharded() const { return sharded_; }

 private:
  absl::StatusOr<ShardingCore*> ShardModel(TrainableModel& model) override;

  Fsdp2Engine(const proto::FsdpConfig& config, MixedPrecision precision, c10::Device device,
              ShardMesh mesh, FullyShardOptions options);

  proto::FsdpConfig config_;
  FullyShardOptions options_;
  FullyShardedModel* sharded_ = nullptr;
};

}  // namespace cpptrain

#endif  // CPPTRAIN_ENGINES_FSDP_FSDP2_ENGINE_H_
