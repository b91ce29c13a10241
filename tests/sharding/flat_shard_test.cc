// FlatShard with ranks as threads (Gloo over a HashStore): the flat layout (aligned starts,
// padding to a multiple of the shard size, pieces that partition every parameter), full
// values gathered back, gradients equal to the unsharded model's summed over ranks, weights
// tied inside one unit and across units, one rank handing bf16 gradients to fp32 pieces, and
// the errors for misuse.
#include "sharding/flat_shard.h"

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

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

Batch TokenBatch(int rank) {
  Batch batch;
  batch.inputs =
      torch::arange(1 + rank, 25 + rank, torch::kLong).remainder(60).add(1).view({2, 12});
  batch.labels = batch.inputs.clone();
  return batch;
}

TEST(FlatShardTest, PiecesPartitionEachParameterAndGatherBack) {
  constexpr int kWorld = 3;
  auto models = Replicas(kWorld, 2);
  torch::manual_seed(3);
  auto reference = Decoder(2);
  std::vector<std::map<std::string, std::pair<int64_t, int64_t>>> pieces(kWorld);
  absl::Status s = RunRanksAsThreads(kWorld, [&](int rank, auto store) -> absl::Status {
    CT_ASSIGN_OR_RETURN(ShardMesh mesh, Mesh(rank, kWorld, store));
    DecoderLM& model = *models[rank];
    CT_ASSIGN_OR_RETURN(FlatShardedModel * flat, FlatShard(model, mesh, {}));
    CT_RETURN_IF_ERROR(Check(flat->num_groups() == 3, "2 layers + root"));
    CT_RETURN_IF_ERROR(Check(FlatShardedOf(model) == flat, "the model carries its flat shards"));
    for (const auto& [used, padded] : flat->FlatSizes()) {
      CT_RETURN_IF_ERROR(Check(padded % kWorld == 0 && padded >= used && padded - used < 64,
                               "padded to a multiple of the world, little waste"));
    }
    const auto full = reference->named_parameters();
    for (const auto& item : model.named_parameters()) {
      const ShardInfo* piece = flat->FindPiece(item.value());
      CT_RETURN_IF_ERROR(Check(piece != nullptr, "no piece for " + item.key()));
      CT_RETURN_IF_ERROR(
          Check(item.value().dim() == 1 && item.value().numel() == piece->local_numel,
                item.key() + ": at rest a 1-d piece"));
      const at::Tensor want = full[item.key()].detach().reshape({-1});
      CT_RETURN_IF_ERROR(Check(
          item.value().detach().equal(want.narrow(0, piece->element_begin, piece->local_numel)),
          item.key() + ": the piece holds the parameter's elements"));
      pieces[rank][item.key()] = {piece->element_begin, piece->local_numel};
      CT_ASSIGN_OR_RETURN(at::Tensor gathered, flat->GatherFull(item.value()));
      CT_RETURN_IF_ERROR(
          Check(gathered.equal(full[item.key()].detach()), item.key() + " gathered"));
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  // Every parameter's elements are covered once, in rank order.
  for (const auto& item : reference->named_parameters()) {
    int64_t next = 0;
    for (int r = 0; r < kWorld; ++r) {
      const auto [begin, numel] = pieces[r].at(item.key());
      if (numel == 0) continue;
      EXPECT_EQ(begin, next) << item.key() << " rank " << r;
      next = begin + numel;
    }
    EXPECT_EQ(next, item.value().numel()) << item.key();
  }
}

// One rank copies its shard into place and hands each full gradient to its piece (reshaped to
// it, nothing packed), with no collective: the same sum over one rank.
void ExpectGradientsSummedOverRanks(int world) {
  auto models = Replicas(world, 2);
  torch::manual_seed(3);
  auto reference = Decoder(2);
  // The reference: every rank's batch through one unsharded model, gradients summed.
  for (int r = 0; r < world; ++r) {
    const Batch batch = TokenBatch(r);
    reference->LossSum(reference->Forward(batch), batch).backward();
  }
  absl::Status s = RunRanksAsThreads(world, [&](int rank, auto store) -> absl::Status {
    CT_ASSIGN_OR_RETURN(ShardMesh mesh, Mesh(rank, world, store));
    DecoderLM& model = *models[rank];
    FlatShardOptions options;
    options.backward_prefetch = CoreOptions::BackwardPrefetch::kPost;
    CT_ASSIGN_OR_RETURN(FlatShardedModel * flat, FlatShard(model, mesh, options));
    const Batch batch = TokenBatch(rank);
    CT_RETURN_IF_ERROR(flat->BeginForward());
    at::Tensor loss = model.LossSum(model.Forward(batch), batch);
    CT_RETURN_IF_ERROR(flat->EndForward());
    CT_RETURN_IF_ERROR(flat->BeginBackward());
    CT_RETURN_IF_ERROR(CatchTorch([&] { loss.backward(); }));
    CT_RETURN_IF_ERROR(flat->FinishBackward());
    const auto full = reference->named_parameters();
    for (const auto& item : model.named_parameters()) {
      const ShardInfo* piece = flat->FindPiece(item.value());
      const at::Tensor want =
          full[item.key()].grad().reshape({-1}).narrow(0, piece->element_begin, piece->local_numel);
      const at::Tensor got = item.value().grad();
      CT_RETURN_IF_ERROR(Check(got.defined() && got.sizes() == want.sizes(),
                               item.key() + ": a gradient shaped like the piece"));
      CT_RETURN_IF_ERROR(Check(torch::allclose(got, want, 1e-5, 1e-6),
                               item.key() + ": gradient equals the sum over ranks"));
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(FlatShardTest, GradientsAreTheSumOverRanks) { ExpectGradientsSummedOverRanks(3); }

TEST(FlatShardTest, OneRankGathersAndReducesWithoutCollectives) {
  ExpectGradientsSummedOverRanks(1);
}

// ShardTestSetup's one-rank bf16 checks on the flat layout (FSDP1, ZeRO-3's).
TEST(FlatShardTest, OneRankHandsEachBf16GradientToItsPiece) {
  absl::Status s = shard_test::ExpectOneRankHandsBf16Gradients(
      shard_test::WithBf16Compute<FlatShardOptions>(
          [](DecoderLM& model, ShardMesh mesh, const FlatShardOptions& options) {
            return FlatShard(model, std::move(mesh), options);
          }),
      TokenBatch(0));
  EXPECT_TRUE(s.ok()) << s;
}

TEST(FlatShardTest, TiedAcrossUnitsGoesToTheRoot) {
  constexpr int kWorld = 2;
  std::vector<std::shared_ptr<testing::TiedBlocks>> models;
  for (int r = 0; r < kWorld; ++r) models.push_back(std::make_shared<testing::TiedBlocks>(1));
  absl::Status s = RunRanksAsThreads(kWorld, [&](int rank, auto store) -> absl::Status {
    CT_ASSIGN_OR_RETURN(ShardMesh mesh, Mesh(rank, kWorld, store));
    testing::TiedBlocks& model = *models[rank];
    const at::Tensor tied_before = model.named_parameters()["a.w"].detach().clone();
    CT_ASSIGN_OR_RETURN(FlatShardedModel * flat, FlatShard(model, mesh, {}));
    CT_ASSIGN_OR_RETURN(at::Tensor tied, flat->GatherFull(model.named_parameters()["b.w"]));
    CT_RETURN_IF_ERROR(Check(tied.equal(tied_before), "the tied weight gathers back whole"));
    CT_RETURN_IF_ERROR(Check(model.named_parameters()["a.w"].unsafeGetTensorImpl() ==
                                 model.named_parameters()["b.w"].unsafeGetTensorImpl(),
                             "still one tensor"));
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(FlatShardTest, Errors) {
  auto model = Decoder(1);
  ShardMesh none;
  auto no_comm = FlatShard(*model, none, {});
  EXPECT_FALSE(no_comm.ok());
  EXPECT_NE(no_comm.status().message().find("null"), std::string::npos) << no_comm.status();
  FlatShardOptions bad;
  bad.alignment_bytes = 0;
  auto unaligned = FlatShard(*model, none, bad);
  EXPECT_NE(unaligned.status().message().find("alignment_bytes is 0"), std::string::npos)
      << unaligned.status();
}

}  // namespace
}  // namespace cpptrain
