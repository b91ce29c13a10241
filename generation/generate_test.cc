#include "generation/generate.h"

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "models/configs.h"
#include "models/decoder.h"

namespace cpptrain {
namespace {

// Tiny shapes of three families: Qwen3 (QK-norm), Mistral (window 3, shorter than the 4-token
// prompts plus 12 new tokens) and Gemma 2 (soft-capping, alternating windows).
std::vector<std::pair<std::string, proto::DecoderConfig>> Variants() {
  std::vector<std::pair<std::string, proto::DecoderConfig>> variants;
  proto::DecoderConfig config = NamedDecoderConfig("tiny").value();
  variants.emplace_back("qwen3", config);
  config.set_model_type("mistral");
  config.set_qk_norm(false);
  config.set_sliding_window(3);
  variants.emplace_back("mistral", config);
  config.set_model_type("gemma2");
  config.set_hidden_act("gelu_pytorch_tanh");
  config.set_norm_unit_offset(true);
  config.set_scale_embeddings(true);
  config.set_sandwich_norms(true);
  config.set_query_pre_attn_scalar(16);
  config.set_attn_logit_softcapping(2);
  config.set_final_logit_softcapping(3);
  config.add_layer_types("sliding_attention");
  config.add_layer_types("full_attention");
  variants.emplace_back("gemma2", config);
  return variants;
}

std::shared_ptr<DecoderLM> Build(const proto::DecoderConfig& config, uint64_t seed = 1) {
  auto model = BuildDecoder(config, {DecoderInit::Mode::kRowSeeded, seed});
  EXPECT_TRUE(model.ok()) << model.status();
  return *model;
}

// Greedy without a cache: the whole sequence through Logits at every step.
std::vector<int64_t> UncachedGreedy(DecoderLM& model, std::vector<int64_t> tokens, int64_t n) {
  at::NoGradGuard no_grad;
  std::vector<int64_t> out;
  for (int64_t i = 0; i < n; ++i) {
    const at::Tensor ids = at::tensor(tokens, at::kLong).reshape({1, -1});
    out.push_back(model.Logits(ids)[0][-1].argmax().item<int64_t>());
    tokens.push_back(out.back());
  }
  return out;
}

const std::vector<std::vector<int64_t>> kPrompts = {
    {3, 17, 42, 8}, {1, 5, 9, 13, 2, 7}, {60, 2, 33, 4}, {7}};

TEST(GenerateTest, GreedyWithTheCacheEqualsTheUncachedLoop) {
  for (const auto& [variant, config] : Variants()) {
    auto model = Build(config);
    GenerationConfig options;
    options.max_new_tokens = 12;
    for (const auto& prompt : kPrompts) {
      auto tokens = Generate(*model, prompt, options);
      ASSERT_TRUE(tokens.ok()) << tokens.status();
      EXPECT_EQ(*tokens, UncachedGreedy(*model, prompt, 12)) << variant;
    }
  }
}

TEST(GenerateTest, BatchGivesEachPromptItsOwnCompletion) {
  for (const bool sample : {false, true}) {
    auto model = Build(Variants()[1].second);
    GenerationConfig options;
    options.max_new_tokens = 10;
    options.do_sample = sample;
    options.sampling.top_k = 1;  // sampled, yet deterministic: each row must equal greedy
    auto batch = GenerateBatch(*model, kPrompts, options);
    ASSERT_TRUE(batch.ok()) << batch.status();
    ASSERT_EQ(batch->size(), kPrompts.size());
    for (size_t i = 0; i < kPrompts.size(); ++i) {
      EXPECT_EQ((*batch)[i], UncachedGreedy(*model, kPrompts[i], 10)) << i;
    }
  }
}

TEST(GenerateTest, StopIdsEndASequenceAndStayInIt) {
  auto model = Build(Variants()[0].second);
  GenerationConfig options;
  options.max_new_tokens = 12;
  const std::vector<int64_t> free = Generate(*model, kPrompts[0], options).value();
  ASSERT_EQ(free.size(), 12u);
  options.stop_ids = {free[4]};
  const std::vector<int64_t> stopped = Generate(*model, kPrompts[0], options).value();
  const auto first = std::find(free.begin(), free.end(), free[4]);
  EXPECT_EQ(stopped, std::vector<int64_t>(free.begin(), first + 1));
  // In a batch the other rows go on.
  auto batch = GenerateBatch(*model, {kPrompts[0], kPrompts[2]}, options).value();
  EXPECT_EQ(batch[0], stopped);
  GenerationConfig no_stop = options;
  no_stop.stop_ids.clear();
  const std::vector<int64_t> other = Generate(*model, kPrompts[2], no_stop).value();
  const auto stop = std::find(other.begin(), other.end(), free[4]);
  EXPECT_EQ(batch[1], std::vector<int64_t>(other.begin(),
                                           stop == other.end() ? other.end() : stop + 1));
  options.max_new_tokens = 0;
  EXPECT_TRUE(Generate(*model, kPrompts[0], options).value().empty());
}

TEST(GenerateTest, SamplingIsReproducibleFromTheSeed) {
  auto model = Build(Variants()[2].second);
  GenerationConfig options;
  options.max_new_tokens = 16;
  options.do_sample = true;
  options.sampling.temperature = 1.5;  // flatten the tiny model's distribution
  options.seed = 42;
  const auto a = GenerateBatch(*model, kPrompts, options).value();
  const auto b = GenerateBatch(*model, kPrompts, options).value();
  EXPECT_EQ(a, b);
  options.seed = 43;
  const auto c = GenerateBatch(*model, kPrompts, options).value();
  EXPECT_NE(a, c);
  options.sampling.top_k = 1;
  options.sampling.temperature = 0.8;
  GenerationConfig greedy;
  greedy.max_new_tokens = 16;
  EXPECT_EQ(GenerateBatch(*model, kPrompts, options).value(),
            GenerateBatch(*model, kPrompts, greedy).value());
}

TEST(GenerateTest, ErrorsSayWhatToChange) {
  auto model = Build(Variants()[0].second);
  GenerationConfig options;
  EXPECT_NE(Generate(*model, {}, options).status().message().find("prompt 0 is empty"),
            std::string::npos);
  EXPECT_NE(Generate(*model, {3, 64}, options).status().message().find("token id 64"),
            std::string::npos);
  options.max_new_tokens = -1;
  EXPECT_NE(Generate(*model, {3}, options).status().message().find("max_new_tokens is -1"),
            std::string::npos);
  options.max_new_tokens = 4;
  options.do_sample = true;
  options.sampling.top_p = 0;
  EXPECT_NE(Generate(*model, {3}, options).status().message().find("top_p is 0"),
            std::string::npos);
}

TEST(GenerateTest, LeavesATrainingModelInTrainingMode) {
  auto model = Build(Variants()[0].second);
  model->train();
  ASSERT_TRUE(Generate(*model, {3, 4}, {}).ok());
  EXPECT_TRUE(model->is_training());
  model->eval();
  ASSERT_TRUE(Generate(*model, {3, 4}, {}).ok());
  EXPECT_FALSE(model->is_training());
}

}  // namespace
}  // namespace cpptrain
