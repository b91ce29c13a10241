// FSDP1 and FSDP2 engines with ranks as threads (Gloo over a HashStore) on a llama-type
// decoder: fsdp.transformer_layer_cls_to_wrap as Hugging Face writes it ("LlamaDecoderLayer")
// gives each layer its own group, like the project's "DecoderLayer"; a made-up class name
// ends PrepareForInference with an error listing the classes that exist (before: one group,
// the whole model, and no word of it).
#include <c10/core/Device.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/status.h"
#include "engines/fsdp/fsdp1_engine.h"
#include "engines/fsdp/fsdp2_engine.h"
#include "models/configs.h"
#include "sharding/gloo_communicator.h"
#include "sharding/testing/multi_rank.h"

namespace cpptrain {
namespace {

using multi_rank::RunRanksAsThreads;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int kWorld = 2;
constexpr int kLayers = 2;

// The number of shard groups each rank's engine made, or its error from PrepareForInference.
std::vector<absl::StatusOr<int>> GroupsWith(int version, const std::string& cls) {
  proto::FsdpConfig config;
  config.set_version(version);
  config.add_transformer_layer_cls_to_wrap(cls);
  proto::DecoderConfig decoder = *NamedDecoderConfig("demo");  // llama: no qk_norm
  decoder.set_num_hidden_layers(kLayers);
  std::vector<std::shared_ptr<DecoderLM>> models;
  for (int r = 0; r < kWorld; ++r) models.push_back(*BuildDecoder(decoder));
  std::vector<absl::StatusOr<int>> out(kWorld, absl::UnknownError("not run"));
  absl::Status s = RunRanksAsThreads(kWorld, [&](int rank, auto store) -> absl::Status {
    CT_ASSIGN_OR_RETURN(std::unique_ptr<GlooCommunicator> comm,
                        GlooCommunicator::Create(store, rank, kWorld, std::chrono::seconds(30)));
    ShardMesh mesh{std::shared_ptr<Communicator>(std::move(comm)), nullptr};
    const c10::Device cpu(c10::kCPU);
    if (version == 1) {
      CT_ASSIGN_OR_RETURN(auto engine,
                          Fsdp1Engine::Create(config, MixedPrecision::kNone, cpu, mesh));
      absl::Status prepared = engine->PrepareForInference(models[rank]);
      out[rank] = prepared.ok() ? absl::StatusOr<int>(engine->flat()->num_groups()) : prepared;
    } else {
      CT_ASSIGN_OR_RETURN(auto engine,
                          Fsdp2Engine::Create(config, MixedPrecision::kNone, cpu, mesh));
      absl::Status prepared = engine->PrepareForInference(models[rank]);
      out[rank] = prepared.ok() ? absl::StatusOr<int>(engine->sharded()->num_groups()) : prepared;
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

TEST(FsdpWrapTest, HuggingFacesLayerClassWrapsEachLayer) {
  for (int version : {1, 2}) {
    for (const char* cls : {"LlamaDecoderLayer", "DecoderLayer"}) {
      for (const absl::StatusOr<int>& groups : GroupsWith(version, cls)) {
        ASSERT_TRUE(groups.ok()) << "fsdp" << version << " " << cls << ": " << groups.status();
        EXPECT_EQ(*groups, kLayers + 1) << "fsdp" << version << " " << cls << ": layers + root";
      }
    }
  }
}

TEST(FsdpWrapTest, AClassNameThatMatchesNoModuleIsAnError) {
  for (int version : {1, 2}) {
    for (const absl::StatusOr<int>& groups : GroupsWith(version, "MadeUpLayer")) {
      ASSERT_FALSE(groups.ok()) << "fsdp" << version << ": " << *groups << " groups";
      EXPECT_THAT(std::string(groups.status().message()),
                  AllOf(HasSubstr("fsdp.transformer_layer_cls_to_wrap names \"MadeUpLayer\""),
                        HasSubstr("DecoderLayer (also LlamaDecoderLayer)")));
    }
  }
}

}  // namespace
}  // namespace cpptrain
