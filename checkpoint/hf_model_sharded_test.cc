// LoadHfWeights into a FullyShard-ed DecoderLM, ranks as threads over Gloo: each rank's chunks
// are the rows of the checkpoint's tensors it owns, the gathered parameters are the whole
// tensors, and the sharded model gives transformers' logits.
#include <ATen/ATen.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
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
#include "models/row_init.h"
#include "sharding/fully_shard.h"
#include "sharding/gloo_communicator.h"
#include "sharding/testing/multi_rank.h"

namespace cpptrain {
namespace {

using multi_rank::Check;
using multi_rank::RunRanksAsThreads;

constexpr auto kTimeout = std::chrono::seconds(60);

struct Case {
  std::string dir_name;
  int world;
};

class HfShardedLoadTest : public ::testing::TestWithParam<Case> {};

// Shards models[rank] on each of models.size() ranks (threads over Gloo, FullyShard's
// defaults) and checks that every gathered parameter equals `want` and that each rank's
// parameter storage is exactly its padded chunks: no rank ever holds a whole tensor.
absl::Status ShardAndCompare(const std::vector<std::shared_ptr<DecoderLM>>& models,
                             const std::map<std::string, at::Tensor>& want) {
  const int world = static_cast<int>(models.size());
  return RunRanksAsThreads(world, [&](int rank, auto store) -> absl::Status {
    CT_ASSIGN_OR_RETURN(std::unique_ptr<GlooCommunicator> comm,
                        GlooCommunicator::Create(store, rank, world, kTimeout));
    DecoderLM& model = *models[rank];
    CT_ASSIGN_OR_RETURN(
        FullyShardedModel * sharded,
        FullyShard(model, ShardMesh{std::shared_ptr<Communicator>(std::move(comm)), nullptr}, {}));
    int64_t held = 0;
    for (const auto& item : model.named_parameters()) {
      const std::string& name = item.key();
      CT_RETURN_IF_ERROR(Check(sharded->Find(item.value()) != nullptr, "no ShardInfo for " + name));
      CT_RETURN_IF_ERROR(Check(!IsDeferred(item.value()), name + " is still deferred"));
      held += static_cast<int64_t>(item.value().storage().nbytes());
      CT_ASSIGN_OR_RETURN(at::Tensor gathered, sharded->GatherFull(item.value()));
      CT_RETURN_IF_ERROR(
          Check(at::equal(gathered, want.at(name)), absl::StrCat("rank ", rank, ": ", name,
                                                                 " differs from the reference")));
    }
    return Check(held == sharded->shard_bytes(),
                 absl::StrCat("rank ", rank, " holds ", held, " bytes, its chunks are ",
                              sharded->shard_bytes()));
  });
}

std::map<std::string, at::Tensor> Copies(const DecoderLM& model) {
  std::map<std::string, at::Tensor> out;
  for (const auto& item : model.named_parameters()) out[item.key()] = item.value().detach().clone();
  return out;
}

proto::DecoderConfig OddVocabulary() {
  proto::DecoderConfig config = NamedDecoderConfig("tiny").value();
  config.set_vocab_size(301);  // not a multiple of any world size or of the 64-row blocks
  return config;
}

class DeferredInitTest : public ::testing::TestWithParam<int> {};

// Every rank built deferred: each initializes its own rows, and the gathered model equals the
// same seed's row-seeded model built whole.
TEST_P(DeferredInitTest, ShardsEqualTheWholeRowSeededModel) {
  std::vector<std::shared_ptr<DecoderLM>> models;
  for (int rank = 0; rank < GetParam(); ++rank) {
    models.push_back(BuildDecoder(OddVocabulary(), {DecoderInit::Mode::kDeferred, 5}).value());
  }
  const auto whole = BuildDecoder(OddVocabulary(), {DecoderInit::Mode::kRowSeeded, 5}).value();
  const absl::Status s = ShardAndCompare(models, Copies(*whole));
  EXPECT_TRUE(s.ok()) << s;
}

// Only rank 0 builds (or loads) the model; the others are deferred and receive their chunks of
// rank 0's values, nothing more (sync_module_states: a scatter per tensor).
TEST_P(DeferredInitTest, OnlyRankZeroHoldsTheWholeModel) {
  at::manual_seed(41);
  std::vector<std::shared_ptr<DecoderLM>> models = {BuildDecoder(OddVocabulary()).value()};
  const std::map<std::string, at::Tensor> want = Copies(*models[0]);
  for (int rank = 1; rank < GetParam(); ++rank) {
    models.push_back(BuildDecoder(OddVocabulary(), {DecoderInit::Mode::kDeferred, 99}).value());
  }
  const absl::Status s = ShardAndCompare(models, want);
  EXPECT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(Worlds, DeferredInitTest, ::testing::Values(1, 2, 3, 4));

TEST_P(HfShardedLoadTest, EachRankLoadsItsRows) {
  const std::string dir = TestdataPath(GetParam().dir_name);
  const int world = GetParam().world;
  auto config = DecoderConfigFromHfConfig(dir + "/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  // Built before the rank threads start: the global generator is not for concurrent use.
  std::vector<std::shared_ptr<DecoderLM>> models;
  for (int rank = 0; rank < world; ++rank) models.push_back(BuildDecoder(*config).value());
  auto files = SafetensorsModelDir::Open(dir);
  ASSERT_TRUE(files.ok()) << files.status();
  auto expected = SafetensorsFile::Open(dir + "/expected_logits.safetensors");
  ASSERT_TRUE(expected.ok()) << expected.status();
  const at::Tensor input_ids = (*expected)->GetCopy("input_ids").value();
  const at::Tensor want_logits = (*expected)->GetCopy("logits").value();

  absl::Status s = RunRanksAsThreads(world, [&](int rank, auto store) -> absl::Status {
    CT_ASSIGN_OR_RETURN(std::unique_ptr<GlooCommunicator> comm,
                        GlooCommunicator::Create(store, rank, world, kTimeout));
    DecoderLM& model = *models[rank];
    FullyShardOptions options;
    options.sync_module_states = false;
    CT_ASSIGN_OR_RETURN(
        FullyShardedModel * sharded,
        FullyShard(model, ShardMesh{std::shared_ptr<Communicator>(std::move(comm)), nullptr},
                   options));
    {
      // Whatever the chunks hold now must not survive the load.
      at::NoGradGuard no_grad;
      for (const auto& item : model.named_parameters()) item.value().fill_(-7);
    }
    CT_RETURN_IF_ERROR(LoadHfWeights(dir, model));

    int uneven = 0;
    for (const auto& item : model.named_parameters()) {
      const std::string& name = item.key();
      const ShardInfo* info = sharded->Find(item.value());
      CT_RETURN_IF_ERROR(Check(info != nullptr, "no ShardInfo for " + name));
      CT_ASSIGN_OR_RETURN(at::Tensor whole, (*files)->Get(name));
      whole = whole.to(at::kFloat);
      const at::Tensor rows = whole.narrow(0, info->row_begin, info->local_rows);
      CT_RETURN_IF_ERROR(
          Check(item.value().sizes() == rows.sizes() && item.value().equal(rows),
                absl::StrCat("rank ", rank, ": the chunk of ", name, " is not rows [",
                             info->row_begin, ", ", info->row_begin + info->local_rows, ")")));
      if (info->local_rows != info->chunk_rows) ++uneven;
      CT_ASSIGN_OR_RETURN(at::Tensor gathered, sharded->GatherFull(item.value()));
      CT_RETURN_IF_ERROR(Check(gathered.equal(whole), "GatherFull of " + name));
    }
    // With 3 ranks the last one holds shorter chunks (64 rows: 22, 22, 20).
    if (world == 3 && rank == 2) CT_RETURN_IF_ERROR(Check(uneven > 0, "no uneven chunk"));

    at::NoGradGuard no_grad;
    CT_RETURN_IF_ERROR(sharded->BeginForward());
    const at::Tensor logits = model.Logits(input_ids);
    CT_RETURN_IF_ERROR(sharded->EndForward());
    const double max_diff = (logits - want_logits).abs().max().item<double>();
    return Check(max_diff < 1e-5,
                 absl::StrCat("rank ", rank, ": logits differ from transformers' by ", max_diff));
  });
  EXPECT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(Directories, HfShardedLoadTest,
                         ::testing::Values(Case{"hf_llama_tiny", 2}, Case{"hf_qwen3_tiny", 3},
                                           Case{"hf_qwen2_tiny", 3},
                                           Case{"hf_llama_mlp_bias_tiny", 3},
                                           Case{"hf_mistral_tiny", 2},
                                           // qkv_proj's 64 and gate_up_proj's 128 rows split
                                           // across ranks, q/k/v boundaries inside a chunk.
                                           Case{"hf_phi3_tiny", 3},
                                           Case{"hf_gemma2_tiny", 3},
                                           Case{"hf_gemma3_tiny", 2}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return absl::StrCat(info.param.dir_name, "_", info.param.world,
                                               "_ranks");
                         });

}  // namespace
}  // namespace cpptrain
