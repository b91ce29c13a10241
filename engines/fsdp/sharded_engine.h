// ShardedEngine: what the engines built on the sharding core (sharding/sharding_core.h) do
// alike once the model is sharded: the forward scope that gathers the root, backward that
// always finishes (waits for every collective), gradient sync on or off, clipping over the
// shard group, stepping only resharded parameters, and the host collectives over the mesh.
// FSDP1 (fsdp1_engine.h), FSDP2 (fsdp2_engine.h) and ZeRO-3 (engines/zero/zero3_engine.h)
// differ in how they shard: each implements ShardModel, returning the core it built or adopted.
//
//   class Fsdp2Engine : public ShardedEngine {
//     absl::StatusOr<ShardingCore*> ShardModel(TrainableModel& m) override { ... FullyShard ... }
//   };
#ifndef CPPTRAIN_ENGINES_FSDP_SHARDED_ENGINE_H_
#define CPPTRAIN_ENGINES_FSDP_SHARDED_ENGINE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "engines/local/local_engine.h"
#include "sharding/sharding_core.h"

namespace cpptrain {

class ShardedEngine : public LocalEngine {
 public:
  int rank() const override { return rank_; }
  int world_size() const override { return mesh_.world_size(); }

  // Shards the model (ShardModel) without an optimizer or gradients, so evaluate() and
  // predict() work before any train(); again with the same model it does nothing, with
  // another it is an error (one engine per model).
  absl::Status PrepareForInference(std::shared_ptr<TrainableModel> model) final;
  // Builds the optimizer over the local parts; one that reads bf16 gradients of fp32
  // parameters gets them as they are on one shard rank (ShardingCore::HoldBf16Gradients).
  absl::Status PrepareForTraining(std::shared_ptr<TrainableModel> model,
                                  const OptimizerFactory& factory) override;
  std::unique_ptr<ForwardScope> EnterForward() override;
  absl::Status Backward(const torch::Tensor& loss) override;
  void SetGradientSync(bool enabled) override;
  absl::StatusOr<torch::Tensor> ClipGradNorm(double max_norm) override;
  // Not captured yet (engines/step_capture.h).
  std::string EngineCaptureBlocker() override {
    return "FSDP gathers and frees each unit's parameters with host-side bookkeeping a "
           "graph would not replay";
  }
  absl::StatusOr<bool> OptimizerStep() override;
  // Clears .grad and what unsynced passes accumulated (nothing carries into the next step).
  void ZeroGrad() override;
  absl::StatusOr<torch::Tensor> AllReduceSum(const torch::Tensor& values) override;
  absl::StatusOr<torch::Tensor> AllGather(const torch::Tensor& values) override;
  absl::StatusOr<bool> AllRanksFinite(bool local_finite) override;

  const ShardMesh& mesh() const { return mesh_; }

 protected:
  ShardedEngine(c10::Device device, MixedPrecision precision, ShardMesh mesh);
  // Called once, by PrepareForInference: shards `model` over mesh_ (or adopts the shards it
  // was given at load time) and returns the core that holds them.
  virtual absl::StatusOr<ShardingCore*> ShardModel(TrainableModel& model) = 0;
  // Null before the model is prepared.
  ShardingCore* core() const { return core_; }

  ShardMesh mesh_;

 private:
  int rank_;
  ShardingCore* core_ = nullptr;
  absl::Status forward_error_;  // from the end of a forward scope, reported by Backward
};

}  // namespace cpptrain

#endif  // CPPTRAIN_ENGINES_FSDP_SHARDED_ENGINE_H_
