// FullyShard with ranks as threads (Gloo over a HashStore): shard layout and metadata, full
// values gathered back, gradients equal to the unsharded model's summed over ranks (with and
// without synchronization on every backward), units freed after their forward, and the
// errors for misuse.
#include "sharding/fully_shard.h"

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <map>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/torch_status.h"
#include "module/testing/tied_blocks.h"
#include "sharding/testing/multi_rank.h"
#include "tests/sharding/shard_test_setup.h"

namespace cpptrain {
namespace {

using multi_rank::RunRanksAsThreads;
using shard_test::Check;
using shard_test::Decoder;
using shard_test::Mesh;
using shard_test::Replicas;
using shard_test::RunPasses;

Batch TokenBatch() {
  Batch batch;
  batch.inputs = torch::arange(1, 25, torch::kLong).remainder(60).add(1).view({2, 12});
  batch.labels = batch.inputs.clone();
  return batch;
}

TEST(FullyShardTest, ShardsAreDimZeroChunksAndGatherBack) {
  constexpr int kWorld = 3;
  auto models = Replicas(kWorld, 2);
  torch::manual_seed(3);
  auto reference = Decoder(2);
  absl::Status s = RunRanksAsThreads(kWorld, [&](int rank, auto store) -> absl::Status {
    CT_ASSIGN_OR_RETURN(ShardMesh mesh, Mesh(rank, kWorld, store));
    DecoderLM& model = *models[rank];
    CT_ASSIGN_OR_RETURN(FullyShardedModel * sharded, FullyShard(model, mesh, {}));
    CT_RETURN_IF_ERROR(Check(sharded->num_groups() == 3, "2 layers + root"));
    CT_RETURN_IF_ERROR(Check(FullyShardedOf(model) == sharded, "the model carries its shards"));
    const auto full = reference->named_parameters();
    for (const auto& item : model.named_parameters()) {
      const ShardInfo* info = sharded->Find(item.value());
      CT_RETURN_IF_ERROR(Check(info != nullptr, "no ShardInfo for " + item.key()));
      const torch::Tensor& whole = full[item.key()];
      const int64_t rows = whole.size(0);
      const int64_t chunk = (rows + kWorld - 1) / kWorld;
      const int64_t begin = std::min(rows, rank * chunk);
      const int64_t local = std::min(chunk, rows - begin);
      CT_RETURN_IF_ERROR(Check(info->name == item.key() && info->chunk_rows == chunk &&
                                   info->row_begin == begin && info->local_rows == local &&
                                   info->global_shape == whole.sizes().vec(),
                               "metadata of " + item.key()));
      CT_RETURN_IF_ERROR(
          Check(item.value().size(0) == local && item.value().equal(whole.narrow(0, begin, local)),
                "the registered parameter is not rank's chunk: " + item.key()));
      CT_ASSIGN_OR_RETURN(torch::Tensor gathered, sharded->GatherFull(item.value()));
      CT_RETURN_IF_ERROR(Check(gathered.equal(whole), "GatherFull of " + item.key()));
    }
    // q_norm has 8 rows: chunks of 3, 3 and 2 rows.
    const ShardInfo* q_norm =
        sharded->Find(model.named_parameters()["model.layers.0.self_attn.q_norm.weight"]);
    CT_RETURN_IF_ERROR(Check(q_norm->local_rows == (rank == 2 ? 2 : 3), "uneven chunks"));
    auto again = FullyShard(model, mesh, {});
    CT_RETURN_IF_ERROR(
        Check(!again.ok() && again.status().message().find("already sharded") != std::string::npos,
              "sharding twice must be an error"));
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

// Logits of the unsharded model on `batch`, for comparison.
torch::Tensor ReferenceLogits(int layers, const Batch& batch) {
  torch::manual_seed(3);
  auto model = Decoder(layers);
  torch::NoGradGuard no_grad;
  return model->Forward(batch);
}

// Gradients of the unsharded model on the same batch, for comparison.
std::map<std::string, torch::Tensor> ReferenceGradients(int layers, const Batch& batch) {
  torch::manual_seed(3);
  auto model = Decoder(layers);
  torch::Tensor loss = model->LossSum(model->Forward(batch), batch);
  loss.backward();
  std::map<std::string, torch::Tensor> grads;
  for (const auto& item : model->named_parameters()) grads[item.key()] = item.value().grad();
  return grads;
}

// On one rank (`world` 1) nothing is gathered or reduce-scattered: the shards are copied into
// the full buffers, so without resharding the peak is the shards and every full buffer.
void ExpectSummedGradients(bool reshard_after_forward, bool checkpointing, int world = 2) {
  constexpr int kLayers = 3;
  const Batch batch = TokenBatch();
  const auto reference = ReferenceGradients(kLayers, batch);
  auto models = Replicas(world, kLayers);
  absl::Status s = RunRanksAsThreads(world, [&](int rank, auto store) -> absl::Status {
    CT_ASSIGN_OR_RETURN(ShardMesh mesh, Mesh(rank, world, store));
    DecoderLM& model = *models[rank];
    model.SetGradientCheckpointing(checkpointing);
    FullyShardOptions options;
    options.reshard_after_forward = reshard_after_forward;
    CT_ASSIGN_OR_RETURN(FullyShardedModel * sharded, FullyShard(model, mesh, options));
    // Three backwards: two without synchronization, then one with it. Each rank sees the same
    // batch, so every chunk's gradient is 3 passes x the ranks x the reference.
    std::vector<int64_t> peaks;  // parameter storage per pass: freed every time, so equal
    for (int pass = 0; pass < 3; ++pass) {
      sharded->SetGradientSync(pass == 2);
      if (pass > 0) peaks.push_back(sharded->peak_parameter_bytes());
      sharded->ResetPeakUnsharded();
      CT_RETURN_IF_ERROR(sharded->BeginForward());
      torch::Tensor loss = model.LossSum(model.Forward(batch), batch);
      CT_RETURN_IF_ERROR(sharded->EndForward());
      if (reshard_after_forward) {
        // Root, the layer running and the one prefetched at most.
        CT_RETURN_IF_ERROR(Check(sharded->peak_unsharded() <= 3, "too many groups unsharded"));
      }
      CT_RETURN_IF_ERROR(sharded->BeginBackward());
      CT_RETURN_IF_ERROR(CatchTorch([&] { loss.backward(); }));
      CT_RETURN_IF_ERROR(sharded->FinishBackward());
    }
    peaks.push_back(sharded->peak_parameter_bytes());
    CT_RETURN_IF_ERROR(
        Check(peaks[0] > sharded->shard_bytes() && peaks[0] == peaks[1] && peaks[1] == peaks[2],
              "peak parameter storage differs between passes"));
    if (world == 1 && !reshard_after_forward) {
      int64_t full = 0;
      for (int64_t bytes : sharded->GroupFullBytes()) full += bytes;
      CT_RETURN_IF_ERROR(Check(peaks[2] == sharded->shard_bytes() + full,
                               "one rank held a gather buffer beside the full parameters"));
    }
    for (const auto& item : model.named_parameters()) {
      const ShardInfo* info = sharded->Find(item.value());
      const torch::Tensor& grad = item.value().grad();
      CT_RETURN_IF_ERROR(Check(grad.defined() && grad.sizes() == item.value().sizes(),
                               "gradient of " + item.key() + " is not chunk-shaped"));
      const torch::Tensor expected =
          reference.at(item.key()).narrow(0, info->row_begin, info->local_rows) * (3 * world);
      CT_RETURN_IF_ERROR(Check(torch::allclose(grad, expected, 1e-4, 1e-6),
                               "gradient of " + item.key() + " differs"));
      CT_RETURN_IF_ERROR(
          Check(item.value().sizes()[0] == info->local_rows, item.key() + " was left unsharded"));
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(FullyShardTest, GradientsAreSummedChunksReshardingAfterForward) {
  ExpectSummedGradients(/*reshard_after_forward=*/true, /*checkpointing=*/false);
}

TEST(FullyShardTest, GradientsAreSummedChunksKeepingParametersAfterForward) {
  ExpectSummedGradients(/*reshard_after_forward=*/false, /*checkpointing=*/false);
}

TEST(FullyShardTest, RecomputationGathersAgainInBackward) {
  ExpectSummedGradients(/*reshard_after_forward=*/true, /*checkpointing=*/true);
}

TEST(FullyShardTest, OneRankCopiesShardsIntoPlaceWithoutCollectives) {
  ExpectSummedGradients(/*reshard_after_forward=*/false, /*checkpointing=*/false, /*world=*/1);
}

TEST(FullyShardTest, OneRankGathersAgainForRecomputation) {
  ExpectSummedGradients(/*reshard_after_forward=*/true, /*checkpointing=*/true, /*world=*/1);
}

// ShardTestSetup's one-rank bf16 checks on the per-parameter layout.
TEST(FullyShardTest, OneRankHandsEachBf16GradientToItsLocalPart) {
  absl::Status s = shard_test::ExpectOneRankHandsBf16Gradients(
      shard_test::WithBf16Compute<FullyShardOptions>(
          [](DecoderLM& model, ShardMesh mesh, const FullyShardOptions& options) {
            return FullyShard(model, std::move(mesh), options);
          }),
      TokenBatch());
  EXPECT_TRUE(s.ok()) << s;
}

// A reduce_dtype narrower than the gradients still rounds them on one rank, as the reduction
// over several would (the full gradients are not handed over as they are there).
TEST(FullyShardTest, OneRankStillRoundsToANarrowerReduceDtype) {
  const Batch batch = TokenBatch();
  auto models = Replicas(1, 2);
  absl::Status s = RunRanksAsThreads(1, [&](int rank, auto store) -> absl::Status {
    CT_ASSIGN_OR_RETURN(ShardMesh mesh, Mesh(rank, 1, store));
    FullyShardOptions options;
    options.reduce_dtype = at::kBFloat16;  // fp32 parameters and gradients
    CT_ASSIGN_OR_RETURN(FullyShardedModel * sharded, FullyShard(*models[0], mesh, options));
    CT_RETURN_IF_ERROR(RunPasses(*models[0], *sharded, batch, {true}));
    for (const auto& item : models[0]->named_parameters()) {
      const torch::Tensor& grad = item.value().grad();
      CT_RETURN_IF_ERROR(Check(grad.scalar_type() == at::kFloat &&
                                   torch::equal(grad, grad.to(at::kBFloat16).to(at::kFloat)) &&
                                   grad.abs().sum().item<double>() > 0,
                               "gradient of " + item.key() + " is not rounded to bf16"));
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(FullyShardTest, InferenceFreesEveryUnitAfterItsForward) {
  constexpr int kWorld = 2;
  auto models = Replicas(kWorld, 4);
  const Batch batch = TokenBatch();
  const torch::Tensor expected = ReferenceLogits(4, batch);
  absl::Status s = RunRanksAsThreads(kWorld, [&](int rank, auto store) -> absl::Status {
    CT_ASSIGN_OR_RETURN(ShardMesh mesh, Mesh(rank, kWorld, store));
    DecoderLM& model = *models[rank];
    CT_ASSIGN_OR_RETURN(FullyShardedModel * sharded, FullyShard(model, mesh, {}));
    torch::NoGradGuard no_grad;
    for (int pass = 0; pass < 2; ++pass) {
      CT_RETURN_IF_ERROR(sharded->BeginForward());
      torch::Tensor logits = model.Forward(batch);
      CT_RETURN_IF_ERROR(sharded->EndForward());
      CT_RETURN_IF_ERROR(Check(torch::allclose(logits, expected, 1e-5, 1e-6), "logits differ"));
    }
    CT_RETURN_IF_ERROR(Check(sharded->peak_unsharded() <= 3 && sharded->num_groups() == 5,
                             "inference held more than root + 2 units"));
    for (const auto& [param, info] : sharded->Shards()) {
      CT_RETURN_IF_ERROR(Check(param.size(0) == info->local_rows && !param.grad().defined(),
                               info->name + " is not back to its chunk"));
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(FullyShardTest, ExplicitPrefetchGathersTheListedUnitsEarly) {
  constexpr int kWorld = 2;
  auto models = Replicas(kWorld, 4);
  const Batch batch = TokenBatch();
  const torch::Tensor expected = ReferenceLogits(4, batch);
  absl::Status s = RunRanksAsThreads(kWorld, [&](int rank, auto store) -> absl::Status {
    CT_ASSIGN_OR_RETURN(ShardMesh mesh, Mesh(rank, kWorld, store));
    DecoderLM& model = *models[rank];
    CT_ASSIGN_OR_RETURN(FullyShardedModel * sharded, FullyShard(model, mesh, {}));
    const auto& layers = model.layers();
    // The root gathers three layers at once, before the first forward recorded any order.
    CT_RETURN_IF_ERROR(
        sharded->SetForwardPrefetch(model, {layers[0].get(), layers[1].get(), layers[2].get()}));
    auto bad = sharded->SetForwardPrefetch(*layers[0], {nullptr});
    CT_RETURN_IF_ERROR(Check(!bad.ok(), "a null target must be an error"));
    torch::NoGradGuard no_grad;
    CT_RETURN_IF_ERROR(sharded->BeginForward());
    CT_RETURN_IF_ERROR(Check(sharded->peak_unsharded() == 4, "root + 3 prefetched layers"));
    torch::Tensor logits = model.Forward(batch);
    CT_RETURN_IF_ERROR(sharded->EndForward());
    return Check(torch::allclose(logits, expected, 1e-5, 1e-6), "logits differ");
  });
  EXPECT_TRUE(s.ok()) << s;
}

// Two units that share one tensor; the forward passes its input through.
class TiedAcrossUnits : public TrainableModel {
 public:
  TiedAcrossUnits() : TrainableModel("TiedAcrossUnits") {
    a_ = register_module("a", std::make_shared<Unit>("Block"));
    b_ = register_module("b", std::make_shared<Unit>("Block"));
    torch::Tensor shared = a_->register_parameter("w", torch::ones({4, 2}));
    b_->register_parameter("w", shared);
  }
  torch::Tensor Forward(const Batch& batch) override { return batch.inputs; }
  torch::Tensor LossSum(const torch::Tensor& logits, const Batch&) const override {
    return logits.sum();
  }
  int64_t CountLossTargets(const Batch&) const override { return 1; }
  std::vector<std::string> LayerUnitClasses() const override { return {"Block"}; }

 private:
  std::shared_ptr<Unit> a_, b_;
};

// A tensor tied across two wrapped units is sharded with the root, which is gathered around
// the whole pass: each rank's chunk gradient is its rows of the unsharded model's gradient
// summed over both ranks' inputs (each use of the tie contributing once).
TEST(FullyShardTest, TiedWeightsAcrossUnitsShardWithTheRoot) {
  constexpr int kWorld = 2;
  testing::TiedBlocks reference(/*seed=*/1);
  for (int r = 0; r < kWorld; ++r) {
    const Batch batch = testing::TiedBlocks::Inputs(3, 10 + r);
    reference.LossSum(reference.Forward(batch), batch).backward();
  }
  const auto want = reference.named_parameters();
  std::vector<std::shared_ptr<testing::TiedBlocks>> models;
  for (int r = 0; r < kWorld; ++r) models.push_back(std::make_shared<testing::TiedBlocks>(1));
  absl::Status s = RunRanksAsThreads(kWorld, [&](int rank, auto store) -> absl::Status {
    CT_ASSIGN_OR_RETURN(ShardMesh mesh, Mesh(rank, kWorld, store));
    testing::TiedBlocks& model = *models[rank];
    CT_ASSIGN_OR_RETURN(FullyShardedModel * sharded, FullyShard(model, mesh, {}));
    CT_RETURN_IF_ERROR(Check(sharded->num_groups() == 3, "units a and b plus the root"));
    const Batch batch = testing::TiedBlocks::Inputs(3, 10 + rank);
    CT_RETURN_IF_ERROR(CatchTorch([&] { model.LossSum(model.Forward(batch), batch).backward(); }));
    CT_RETURN_IF_ERROR(sharded->FinishBackward());
    for (const auto& item : model.named_parameters()) {
      const ShardInfo* info = sharded->Find(item.value());
      CT_RETURN_IF_ERROR(Check(info != nullptr, "no ShardInfo for " + item.key()));
      const torch::Tensor rows =
          want[item.key()].grad().narrow(0, info->row_begin, info->local_rows);
      CT_RETURN_IF_ERROR(Check(torch::allclose(item.value().grad(), rows, 1e-5, 1e-6),
                               "gradient of " + item.key() + " on rank " + std::to_string(rank)));
    }
    const ShardInfo* tied = sharded->Find(model.named_parameters()["b.w"]);
    return Check(tied->name == "a.w", "the tie keeps its first name, saw " + tied->name);
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(FullyShardTest, DeviceFollowsTheCommunicatorAndAMismatchIsAnError) {
  TiedAcrossUnits model;
  absl::Status s = RunRanksAsThreads(1, [&](int rank, auto store) -> absl::Status {
    CT_ASSIGN_OR_RETURN(ShardMesh mesh, Mesh(rank, 1, store));
    FullyShardOptions options;
    options.wrap.kind = WrapPolicy::Kind::kNone;
    options.device = c10::Device(c10::kCUDA, 0);
    auto refused = FullyShard(model, mesh, options);
    const std::string message(refused.status().message());
    CT_RETURN_IF_ERROR(Check(!refused.ok() &&
                                 message.find("device is cuda:0") != std::string::npos &&
                                 message.find("gloo communicator serves cpu") != std::string::npos,
                             message));
    options.device.reset();  // unset: the Gloo communicator's CPU
    CT_ASSIGN_OR_RETURN(FullyShardedModel * sharded, FullyShard(model, mesh, options));
    return Check(sharded->device() == c10::Device(c10::kCPU), sharded->device().str());
  });
  EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace cpptrain
