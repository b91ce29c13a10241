// LoadHfWeights into a FlatShard-ed DecoderLM (FSDP1's and ZeRO-3's flat parameters), ranks as
// threads over Gloo, as fsdp.cpu_ram_efficient_loading and zero.zero3_init_flag load a model:
// built deferred on every rank, flat-sharded (each rank allocates its pieces only), then each
// rank reads the rows covering its pieces. Each piece is its elements of the checkpoint's
// flattened tensor, the gathered parameters are the whole tensors, each rank's parameter
// storage is its flat shards and nothing more, and the sharded model gives transformers' logits.
// Before any load, the deferred pieces equal the whole row-seeded model.
#include <ATen/ATen.h>

#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "checkpoint/hf_model.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/test_dirs.h"
#include "gtest/gtest.h"
#include "models/configs.h"
#include "models/decoder.h"
#include "sharding/flat_shard.h"
#include "sharding/gloo_communicator.h"
#include "sharding/testing/multi_rank.h"

namespace cpptrain {
namespace {

using multi_rank::Check;
using multi_rank::RunRanksAsThreads;

struct Case {
  std::string dir_name;
  int world;
};

class HfFlatShardedLoadTest : public ::testing::TestWithParam<Case> {};

// The rank's pieces against the file's tensors, and the bytes of parameter storage it holds.
absl::Status CheckPieces(int rank, DecoderLM& model, FlatShardedModel& flat,
                         const SafetensorsModelDir& files) {
  std::set<const void*> storages;
  int64_t held = 0;
  for (const auto& item : model.named_parameters()) {
    const std::string& name = item.key();
    const ShardInfo* piece = flat.FindPiece(item.value());
    CT_RETURN_IF_ERROR(Check(piece != nullptr, "no piece for " + name));
    CT_ASSIGN_OR_RETURN(at::Tensor whole, files.Get(name));
    whole = whole.to(at::kFloat);
    const at::Tensor mine = whole.reshape({-1}).narrow(0, piece->element_begin, piece->local_numel);
    CT_RETURN_IF_ERROR(Check(item.value().equal(mine),
                             absl::StrCat("rank ", rank, ": the piece of ", name,
                                          " is not elements [", piece->element_begin, ", +",
                                          piece->local_numel, ") of the file's tensor")));
    CT_ASSIGN_OR_RETURN(at::Tensor gathered, flat.GatherFull(item.value()));
    CT_RETURN_IF_ERROR(Check(gathered.equal(whole), "GatherFull of " + name));
    const c10::StorageImpl* storage = item.value().storage().unsafeGetStorageImpl();
    if (storages.insert(storage).second) held += static_cast<int64_t>(storage->nbytes());
  }
  return Check(held == flat.shard_bytes(), absl::StrCat("rank ", rank, " holds ", held,
                                                        " bytes of parameters, its flat shards are ",
                                                        flat.shard_bytes()));
}

TEST_P(HfFlatShardedLoadTest, EachRankLoadsItsPieces) {
  const std::string dir = TestdataPath(GetParam().dir_name);
  const int world = GetParam().world;
  auto config = DecoderConfigFromHfConfig(dir + "/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  std::vector<std::shared_ptr<DecoderLM>> models;
  for (int rank = 0; rank < world; ++rank) {
    models.push_back(BuildDecoder(*config, {DecoderInit::Mode::kDeferred, 0}).value());
  }
  auto files = SafetensorsModelDir::Open(dir);
  ASSERT_TRUE(files.ok()) << files.status();
  auto expected = SafetensorsFile::Open(dir + "/expected_logits.safetensors");
  ASSERT_TRUE(expected.ok()) << expected.status();
  const at::Tensor input_ids = (*expected)->GetCopy("input_ids").value();
  const at::Tensor want_logits = (*expected)->GetCopy("logits").value();

  absl::Status s = RunRanksAsThreads(world, [&](int rank, auto store) -> absl::Status {
    CT_ASSIGN_OR_RETURN(std::unique_ptr<GlooCommunicator> comm,
                        GlooCommunicator::Create(store, rank, world, std::chrono::seconds(60)));
    DecoderLM& model = *models[rank];
    FlatShardOptions options;  // every decoder layer a group, sync_module_states as engines do
    CT_ASSIGN_OR_RETURN(
        FlatShardedModel * flat,
        FlatShard(model, ShardMesh{std::shared_ptr<Communicator>(std::move(comm)), nullptr},
                  options));
    CT_RETURN_IF_ERROR(Check(flat->num_groups() == config->num_hidden_layers() + 1,
                             "one group per layer and the root"));
    {
      // Whatever the pieces hold now must not survive the load.
      at::NoGradGuard no_grad;
      for (const auto& item : model.named_parameters()) item.value().fill_(-7);
    }
    CT_RETURN_IF_ERROR(LoadHfWeights(dir, model));
    CT_RETURN_IF_ERROR(CheckPieces(rank, model, *flat, **files));

    at::NoGradGuard no_grad;
    CT_RETURN_IF_ERROR(flat->BeginForward());
    const at::Tensor logits = model.Logits(input_ids);
    CT_RETURN_IF_ERROR(flat->EndForward());
    const double max_diff = (logits - want_logits).abs().max().item<double>();
    return Check(max_diff < 1e-5,
                 absl::StrCat("rank ", rank, ": logits differ from transformers' by ", max_diff));
  });
  EXPECT_TRUE(s.ok()) << s;
}

class DeferredFlatInitTest : public ::testing::TestWithParam<int> {};

// Every rank built deferred and flat-sharded (as the efficient loads do before reading): each
// initializes its own pieces, in blocks of rows (the embedding's piece spans several 8 MiB
// blocks here), and the gathered model equals the same seed's row-seeded model built whole.
TEST_P(DeferredFlatInitTest, PiecesEqualTheWholeRowSeededModel) {
  const int world = GetParam();
  proto::DecoderConfig config = NamedDecoderConfig("tiny").value();
  config.set_vocab_size(12289);  // divides by no world size; a 25 MB embedding
  config.set_hidden_size(512);
  std::vector<std::shared_ptr<DecoderLM>> models;
  for (int rank = 0; rank < world; ++rank) {
    models.push_back(BuildDecoder(config, {DecoderInit::Mode::kDeferred, 5}).value());
  }
  const auto whole = BuildDecoder(config, {DecoderInit::Mode::kRowSeeded, 5}).value();
  absl::Status s = RunRanksAsThreads(world, [&](int rank, auto store) -> absl::Status {
    CT_ASSIGN_OR_RETURN(std::unique_ptr<GlooCommunicator> comm,
                        GlooCommunicator::Create(store, rank, world, std::chrono::seconds(60)));
    DecoderLM& model = *models[rank];
    CT_ASSIGN_OR_RETURN(
        FlatShardedModel * flat,
        FlatShard(model, ShardMesh{std::shared_ptr<Communicator>(std::move(comm)), nullptr}, {}));
    const auto want = whole->named_parameters();
    for (const auto& item : model.named_parameters()) {
      CT_ASSIGN_OR_RETURN(at::Tensor gathered, flat->GatherFull(item.value()));
      CT_RETURN_IF_ERROR(Check(gathered.equal(want[item.key()]),
                               absl::StrCat("rank ", rank, ": ", item.key(),
                                            " differs from the whole row-seeded model")));
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(Worlds, DeferredFlatInitTest, ::testing::Values(1, 2, 3));

INSTANTIATE_TEST_SUITE_P(Directories, HfFlatShardedLoadTest,
                         ::testing::Values(Case{"hf_llama_tiny", 2}, Case{"hf_qwen3_tiny", 3},
                                           Case{"hf_qwen2_tiny", 4},
                                           Case{"hf_llama_mlp_bias_tiny", 3}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return absl::StrCat(info.param.dir_name, "_", info.param.world,
                                               "_ranks");
                         });

}  // namespace
}  // namespace cpptrain
