// The architectures beyond Llama and Qwen3 against transformers: Qwen2 (q/k/v biases; tied and
// untied; use_sliding_window off and on), Qwen3 with a sliding window, Llama with mlp_bias, and
// Mistral (a sliding window shorter than the sequence). Directories written by tests/golden/gen_hf_arch_golden.py load
// into DecoderLM and give transformers' logits, loss and 20 AdamW steps; config.json fields map
// onto DecoderConfig and back; architectures the decoder does not implement are refused with
// the list of those it does.
#include <ATen/ATen.h>
#include <torch/optim/adamw.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iomanip>
#include <iostream>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/files.h"
#include "checkpoint/hf_config.h"
#include "checkpoint/hf_decoder_testing.h"
#include "checkpoint/hf_model.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/test_dirs.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "models/configs.h"
#include "models/decoder.h"
#include "models/rope_scaling.h"
#include "module/batch.h"

namespace cpptrain {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// What transformers computed on the directory (gen_hf_arch_golden.py).
struct Golden {
  at::Tensor input_ids;
  at::Tensor logits;
  double loss = 0;
  at::Tensor train_losses;
};

Golden ReadGolden(const std::string& dir) {
  auto file = SafetensorsFile::Open(dir + "/expected_logits.safetensors");
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return {};
  return {(*file)->GetCopy("input_ids").value(), (*file)->GetCopy("logits").value(),
          (*file)->GetCopy("loss").value().item<double>(),
          (*file)->GetCopy("train_losses").value()};
}

Batch LmBatch(const at::Tensor& input_ids) {
  Batch batch;
  batch.inputs = input_ids;
  batch.labels = input_ids;
  return batch;
}

// transformers' loss: the mean over the shifted targets.
at::Tensor MeanLoss(DecoderLM& model, const Batch& batch) {
  return model.LossSum(model.Forward(batch), batch) / model.CountLossTargets(batch);
}

// Logits within 1e-5, the loss within 1e-6 relative, and each of 20 AdamW steps' losses within
// 1e-5 of transformers'.
void ExpectTransformersParity(const std::string& name) {
  SCOPED_TRACE(name);
  const std::string dir = TestdataPath(name);
  auto loaded = LoadHfDecoderForTest(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  DecoderLM& model = **loaded;
  const Golden golden = ReadGolden(dir);
  ASSERT_TRUE(golden.logits.defined());
  const Batch batch = LmBatch(golden.input_ids);
  double logits_diff = 0, loss_relative_diff = 0, train_diff = 0;
  model.eval();
  {
    at::NoGradGuard no_grad;
    const at::Tensor logits = model.Logits(golden.input_ids);
    ASSERT_EQ(logits.sizes(), golden.logits.sizes());
    logits_diff = (logits - golden.logits).abs().max().item<double>();
    EXPECT_LT(logits_diff, 1e-5);
    EXPECT_GT(golden.logits.std().item<double>(), 0.1);  // far from zero and from each other
    const double loss = MeanLoss(model, batch).item<double>();
    loss_relative_diff = std::abs(loss - golden.loss) / std::abs(golden.loss);
    EXPECT_LT(loss_relative_diff, 1e-6)
        << "loss " << loss << ", transformers " << golden.loss;
  }

  model.train();
  torch::optim::AdamW adamw(model.parameters(), torch::optim::AdamWOptions(1e-2));
  const int64_t steps = golden.train_losses.numel();
  ASSERT_EQ(steps, 20);
  for (int64_t step = 0; step < steps; ++step) {
    adamw.zero_grad();
    const at::Tensor loss = MeanLoss(model, batch);
    loss.backward();
    adamw.step();
    const double want = golden.train_losses[step].item<double>();
    EXPECT_NEAR(loss.item<double>(), want, 1e-5) << "step " << step;
    train_diff = std::max(train_diff, std::abs(loss.item<double>() - want));
  }
  std::cout << name << ": logits max |diff| " << logits_diff << ", loss "
            << std::setprecision(9) << golden.loss << std::setprecision(6) << " relative diff "
            << loss_relative_diff << ", 20 steps' losses max |diff| " << train_diff << "\n";
  // The steps trained something: the last loss is far below the first.
  EXPECT_LT(golden.train_losses[steps - 1].item<double>(),
            0.5 * golden.train_losses[0].item<double>());
}

// The model of `name` built with `change` applied to its config and loaded without strictness
// gives logits further than 1e-3 from transformers': the feature `change` removes matters.
void ExpectFeatureMatters(const std::string& name,
                          const std::function<void(proto::DecoderConfig&)>& change) {
  const std::string dir = TestdataPath(name);
  auto config = DecoderConfigFromHfConfig(dir + "/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  change(*config);
  auto model = BuildDecoder(*config);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_TRUE(LoadHfWeights(dir, **model, {/*strict=*/false}).ok());
  const Golden golden = ReadGolden(dir);
  at::NoGradGuard no_grad;
  EXPECT_GT(((*model)->Logits(golden.input_ids) - golden.logits).abs().max().item<double>(), 1e-3)
      << name << ": the feature changes too little for the test to mean anything";
}

// ---------------------------------------------------------------------------------------------
// Qwen2

TEST(HfArchTest, Qwen2UntiedGivesTransformersResults) {
  auto config = DecoderConfigFromHfConfig(TestdataPath("hf_qwen2_tiny") + "/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(ResolvedModelType(*config), "qwen2");
  EXPECT_TRUE(config->qkv_bias());
  EXPECT_FALSE(config->attention_bias());
  EXPECT_FALSE(config->qk_norm());
  EXPECT_FALSE(config->tie_word_embeddings());
  EXPECT_FALSE(config->has_sliding_window());  // use_sliding_window: false
  EXPECT_EQ(config->rope_theta(), 1e6);
  auto model = BuildDecoder(*config).value();
  const auto params = model->named_parameters();
  EXPECT_TRUE(params.contains("model.layers.1.self_attn.k_proj.bias"));
  EXPECT_FALSE(params.contains("model.layers.1.self_attn.o_proj.bias"));
  EXPECT_FALSE(params.contains("model.layers.1.mlp.up_proj.bias"));
  ExpectTransformersParity("hf_qwen2_tiny");
  ExpectFeatureMatters("hf_qwen2_tiny", [](proto::DecoderConfig& c) {
    c.set_qkv_bias(false);
    c.set_model_type("llama");
  });
}

TEST(HfArchTest, Qwen2TiedGivesTransformersResults) {
  auto model = LoadHfDecoderForTest(TestdataPath("hf_qwen2_tied_tiny"));
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_TRUE((*model)->config().tie_word_embeddings());
  EXPECT_FALSE((*model)->named_parameters().contains("lm_head.weight"));
  ExpectTransformersParity("hf_qwen2_tied_tiny");
}

TEST(HfArchTest, Qwen2SlidingWindowInTheLastLayersGivesTransformersResults) {
  auto config = DecoderConfigFromHfConfig(TestdataPath("hf_qwen2_sliding_tiny") + "/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->sliding_window(), 4);
  EXPECT_EQ(config->first_sliding_layer(), 1);  // max_window_layers
  auto model = BuildDecoder(*config).value();
  EXPECT_EQ(model->layers()[0]->self_attn()->window(), 0);
  EXPECT_EQ(model->layers()[1]->self_attn()->window(), 4);
  ExpectTransformersParity("hf_qwen2_sliding_tiny");
  ExpectFeatureMatters("hf_qwen2_sliding_tiny", [](proto::DecoderConfig& c) {
    c.clear_sliding_window();
    c.clear_first_sliding_layer();
  });
}

TEST(HfArchTest, Qwen3SlidingWindowGivesTransformersResults) {
  auto config = DecoderConfigFromHfConfig(TestdataPath("hf_qwen3_sliding_tiny") + "/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(ResolvedModelType(*config), "qwen3");
  EXPECT_EQ(config->sliding_window(), 5);
  EXPECT_EQ(config->first_sliding_layer(), 1);
  ExpectTransformersParity("hf_qwen3_sliding_tiny");
  ExpectFeatureMatters("hf_qwen3_sliding_tiny", [](proto::DecoderConfig& c) {
    c.clear_sliding_window();
    c.clear_first_sliding_layer();
  });
}

// ---------------------------------------------------------------------------------------------
// Llama with mlp_bias, Mistral

TEST(HfArchTest, LlamaMlpBiasGivesTransformersResults) {
  auto config =
      DecoderConfigFromHfConfig(TestdataPath("hf_llama_mlp_bias_tiny") + "/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->mlp_bias());
  EXPECT_EQ(ResolvedModelType(*config), "llama");
  auto model = BuildDecoder(*config).value();
  for (const std::string proj : {"gate_proj", "up_proj", "down_proj"}) {
    EXPECT_TRUE(model->named_parameters().contains(
        absl::StrCat("model.layers.0.mlp.", proj, ".bias")));
  }
  ExpectTransformersParity("hf_llama_mlp_bias_tiny");
  ExpectFeatureMatters("hf_llama_mlp_bias_tiny",
                       [](proto::DecoderConfig& c) { c.set_mlp_bias(false); });
}

TEST(HfArchTest, MistralSlidingWindowShorterThanTheSequenceGivesTransformersResults) {
  auto config = DecoderConfigFromHfConfig(TestdataPath("hf_mistral_tiny") + "/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(ResolvedModelType(*config), "mistral");
  EXPECT_EQ(config->sliding_window(), 4);
  EXPECT_EQ(config->first_sliding_layer(), 0);
  EXPECT_EQ(ReadGolden(TestdataPath("hf_mistral_tiny")).input_ids.size(1), 12);  // > 4
  ExpectTransformersParity("hf_mistral_tiny");
  ExpectFeatureMatters("hf_mistral_tiny", [](proto::DecoderConfig& c) {
    c.clear_sliding_window();
    c.set_model_type("mistral");
  });
}

// ---------------------------------------------------------------------------------------------
// RoPE: yarn and longrope

// Each config.json of checkpoint/testdata/hf_rope_init gives transformers' inverse frequencies
// (for each sequence length the generator called the init function with; 0: without one, as
// the rotary embedding's constructor) and attention scaling, bit for bit.
TEST(HfArchRopeTest, YarnAndLongropeMatchTransformersRopeInit) {
  const std::string dir = TestdataPath("hf_rope_init");
  auto golden = SafetensorsFile::Open(dir + "/golden.safetensors");
  ASSERT_TRUE(golden.ok()) << golden.status();
  const std::vector<std::pair<std::string, std::vector<int64_t>>> cases = {
      {"qwen25_yarn_4x", {0}},
      {"llama_yarn_mscale", {0}},
      {"llama_yarn_attention_factor", {0}},
      {"llama_longrope", {0, 4096, 4097}},
      {"llama_longrope_factor", {5000}},
      {"phi3_su_4x", {0, 4097}},
  };
  for (const auto& [name, seq_lens] : cases) {
    SCOPED_TRACE(name);
    auto config = DecoderConfigFromHfConfig(absl::StrCat(dir, "/", name, ".json"));
    ASSERT_TRUE(config.ok()) << config.status();
    const double scaling = (*golden)->GetCopy(name + ".attention_scaling").value().item<double>();
    EXPECT_EQ(RopeAttentionScaling(*config), scaling);
    for (int64_t seq_len : seq_lens) {
      const std::string key =
          absl::StrCat(name, ".inv_freq.", seq_len == 0 ? "init" : absl::StrCat(seq_len));
      const at::Tensor want = (*golden)->GetCopy(key).value();
      const at::Tensor got =
          RopeInverseFrequencies(*config, ResolvedHeadDim(*config), seq_len, at::kCPU);
      ASSERT_EQ(got.sizes(), want.sizes()) << key;
      EXPECT_TRUE(at::equal(got, want))
          << key << ": max |diff| " << (got - want).abs().max().item<double>();
    }
  }
}

TEST(HfArchRopeTest, Qwen25YarnInRopeScalingIsRead) {
  auto config = DecoderConfigFromHfConfig(TestdataPath("hf_rope_init") + "/qwen25_yarn_4x.json");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->rope_scaling().rope_type(), "yarn");
  EXPECT_EQ(config->rope_scaling().factor(), 4);
  EXPECT_EQ(config->rope_scaling().original_max_position_embeddings(), 32768);
  EXPECT_FALSE(config->rope_scaling().has_attention_factor());
}

TEST(HfArchTest, YarnGivesTransformersResults) {
  auto config = DecoderConfigFromHfConfig(TestdataPath("hf_rope_yarn_tiny") + "/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->rope_scaling().rope_type(), "yarn");
  ExpectTransformersParity("hf_rope_yarn_tiny");
  ExpectFeatureMatters("hf_rope_yarn_tiny",
                       [](proto::DecoderConfig& c) { c.clear_rope_scaling(); });
  // The attention factor alone matters too.
  ExpectFeatureMatters("hf_rope_yarn_tiny", [](proto::DecoderConfig& c) {
    c.mutable_rope_scaling()->set_attention_factor(1.0);
  });
}

TEST(HfArchTest, LongropeBeyondThePretrainingLengthGivesTransformersResults) {
  auto config = DecoderConfigFromHfConfig(TestdataPath("hf_rope_longrope_tiny") + "/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->rope_scaling().rope_type(), "longrope");
  EXPECT_EQ(config->rope_scaling().original_max_position_embeddings(), 8);  // < 12 tokens
  EXPECT_EQ(config->rope_scaling().long_factor_size(), 4);
  ExpectTransformersParity("hf_rope_longrope_tiny");
  ExpectFeatureMatters("hf_rope_longrope_tiny", [](proto::DecoderConfig& c) {
    // The short factors where transformers uses the long ones.
    c.mutable_rope_scaling()->set_original_max_position_embeddings(12);
  });
}

// ---------------------------------------------------------------------------------------------
// Phi-3

TEST(HfArchTest, Phi3GivesTransformersResults) {
  auto config = DecoderConfigFromHfConfig(TestdataPath("hf_phi3_tiny") + "/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(ResolvedModelType(*config), "phi3");
  EXPECT_TRUE(config->fused_projections());
  EXPECT_EQ(config->sliding_window(), 6);  // every layer, shorter than the 12 tokens
  EXPECT_EQ(config->first_sliding_layer(), 0);
  EXPECT_EQ(config->rope_scaling().rope_type(), "longrope");
  EXPECT_EQ(config->rope_scaling().original_max_position_embeddings(), 8);
  auto model = BuildDecoder(*config).value();
  const auto params = model->named_parameters();
  EXPECT_EQ(params["model.layers.0.self_attn.qkv_proj.weight"].sizes(),
            (std::vector<int64_t>{32 + 2 * 16, 32}));
  EXPECT_EQ(params["model.layers.0.mlp.gate_up_proj.weight"].sizes(),
            (std::vector<int64_t>{2 * 64, 32}));
  EXPECT_FALSE(params.contains("model.layers.0.self_attn.q_proj.weight"));
  EXPECT_FALSE(params.contains("model.layers.0.mlp.up_proj.weight"));
  EXPECT_EQ(model->UnitClassAliases("DecoderLayer"), std::vector<std::string>{"Phi3DecoderLayer"});
  ExpectTransformersParity("hf_phi3_tiny");
  ExpectFeatureMatters("hf_phi3_tiny", [](proto::DecoderConfig& c) { c.clear_sliding_window(); });
  ExpectFeatureMatters("hf_phi3_tiny", [](proto::DecoderConfig& c) { c.clear_rope_scaling(); });
}

// ---------------------------------------------------------------------------------------------
// Gemma 2 and Gemma 3

TEST(HfArchTest, Gemma2GivesTransformersResults) {
  auto config = DecoderConfigFromHfConfig(TestdataPath("hf_gemma2_tiny") + "/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(ResolvedModelType(*config), "gemma2");
  EXPECT_EQ(config->hidden_act(), "gelu_pytorch_tanh");
  EXPECT_TRUE(config->norm_unit_offset() && config->scale_embeddings() && config->sandwich_norms());
  EXPECT_FALSE(config->qk_norm());
  EXPECT_TRUE(config->tie_word_embeddings());
  EXPECT_EQ(config->query_pre_attn_scalar(), 16);
  EXPECT_EQ(config->attn_logit_softcapping(), 2);
  EXPECT_EQ(config->final_logit_softcapping(), 3);
  EXPECT_EQ(config->sliding_window(), 4);
  auto model = BuildDecoder(*config).value();
  EXPECT_EQ(model->layers()[0]->self_attn()->window(), 4);  // sliding, shorter than 12 tokens
  EXPECT_EQ(model->layers()[1]->self_attn()->window(), 0);  // global
  EXPECT_TRUE(model->named_parameters().contains("model.layers.1.post_feedforward_layernorm.weight"));
  EXPECT_EQ(model->UnitClassAliases("DecoderLayer"),
            std::vector<std::string>{"Gemma2DecoderLayer"});
  ExpectTransformersParity("hf_gemma2_tiny");
  ExpectFeatureMatters("hf_gemma2_tiny",
                       [](proto::DecoderConfig& c) { c.clear_attn_logit_softcapping(); });
  ExpectFeatureMatters("hf_gemma2_tiny",
                       [](proto::DecoderConfig& c) { c.clear_final_logit_softcapping(); });
  ExpectFeatureMatters("hf_gemma2_tiny",
                       [](proto::DecoderConfig& c) { c.set_query_pre_attn_scalar(8); });
  ExpectFeatureMatters("hf_gemma2_tiny",
                       [](proto::DecoderConfig& c) { c.set_layer_types(0, "full_attention"); });
}

TEST(HfArchTest, Gemma3GivesTransformersResults) {
  auto config = DecoderConfigFromHfConfig(TestdataPath("hf_gemma3_tiny") + "/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(ResolvedModelType(*config), "gemma3_text");
  EXPECT_TRUE(config->qk_norm());
  EXPECT_FALSE(config->has_attn_logit_softcapping());
  EXPECT_FALSE(config->has_final_logit_softcapping());
  EXPECT_EQ(config->rope_theta(), 1e6);
  EXPECT_EQ(config->rope_local_base_freq(), 10000);
  EXPECT_EQ(config->rope_scaling().rope_type(), "linear");
  EXPECT_EQ(config->rope_scaling().factor(), 2);
  EXPECT_EQ(BuildDecoder(*config).value()->UnitClassAliases("DecoderLayer"),
            std::vector<std::string>{"Gemma3DecoderLayer"});
  ExpectTransformersParity("hf_gemma3_tiny");
  // The sliding layer's own rope base, and the global layer's scaling, each matter.
  ExpectFeatureMatters("hf_gemma3_tiny",
                       [](proto::DecoderConfig& c) { c.set_rope_local_base_freq(1e6); });
  ExpectFeatureMatters("hf_gemma3_tiny", [](proto::DecoderConfig& c) { c.clear_rope_scaling(); });
}

// ---------------------------------------------------------------------------------------------
// config.json

std::string Config(const std::string& fields) {
  return absl::StrCat(R"({"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
      "num_hidden_layers": 4, "num_attention_heads": 4, )",
                      fields, "}");
}

absl::StatusOr<proto::DecoderConfig> Read(const std::string& text) {
  return DecoderConfigFromHfConfig(WriteText(FreshTestDir() + "/config.json", text));
}

std::string ReadError(const std::string& text) {
  auto config = Read(text);
  EXPECT_FALSE(config.ok()) << text;
  return config.ok() ? "" : std::string(config.status().message());
}

TEST(HfArchTest, Phi3PartialRotaryGivesTransformersResults) {
  auto config = DecoderConfigFromHfConfig(TestdataPath("hf_phi3_partial_tiny") + "/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->partial_rotary_factor(), 0.5);
  EXPECT_EQ(ResolvedRotaryDim(*config), 4);
  EXPECT_EQ(config->rope_scaling().short_factor_size(), 2);
  ExpectTransformersParity("hf_phi3_partial_tiny");
  ExpectFeatureMatters("hf_phi3_partial_tiny", [](proto::DecoderConfig& c) {
    c.clear_partial_rotary_factor();
    c.clear_rope_scaling();
  });
}

TEST(HfArchConfigTest, Phi3ReadsItsRopeAsTransformersDoes) {
  // Phi-3-mini-128k's 4.x form: "su" is longrope; the top-level pretraining length wins.
  auto su = DecoderConfigFromHfConfig(TestdataPath("hf_rope_init") + "/phi3_su_4x.json");
  ASSERT_TRUE(su.ok()) << su.status();
  EXPECT_EQ(su->rope_scaling().rope_type(), "longrope");
  EXPECT_EQ(su->rope_scaling().original_max_position_embeddings(), 4096);
  EXPECT_EQ(su->sliding_window(), 262144);
  // Absent at the top level: Phi-3's default 4096, not the rope object's.
  auto absent = Read(Config(R"("model_type": "phi3", "max_position_embeddings": 131072,
      "rope_scaling": {"type": "longrope", "short_factor": [1, 1, 1, 1],
      "long_factor": [2, 2, 2, 2], "original_max_position_embeddings": 2048})"));
  ASSERT_TRUE(absent.ok()) << absent.status();
  EXPECT_EQ(absent->rope_scaling().original_max_position_embeddings(), 4096);
  EXPECT_FALSE(absent->has_sliding_window());  // Phi-3's default: none
  auto dropout = Read(Config(R"("model_type": "phi3", "resid_pdrop": 0.1, "embd_pdrop": 0.1)"));
  ASSERT_TRUE(dropout.ok()) << dropout.status();
  EXPECT_EQ(dropout->residual_dropout(), 0.1);
  EXPECT_THAT(ReadError(Config(R"("model_type": "llama", "partial_rotary_factor": 0.75)")),
              HasSubstr("for phi3 only"));
  auto partial = Read(Config(R"("model_type": "phi3", "partial_rotary_factor": 0.75)"));
  ASSERT_TRUE(partial.ok()) << partial.status();
  EXPECT_EQ(partial->partial_rotary_factor(), 0.75);
  EXPECT_THAT(ReadError(Config(R"("model_type": "phi3", "partial_rotary_factor": 0.1)")),
              HasSubstr("turns int(head_dim * factor) = 0"));
}

TEST(HfArchConfigTest, GemmaDefaultsAsTransformersReadThem) {
  // Gemma 2: soft-capping 50 and 30, query_pre_attn_scalar 256, head_dim 256, window 4096 in
  // every other layer from layer 0, tied.
  auto gemma2 = Read(Config(R"("model_type": "gemma2", "head_dim": 8)"));
  ASSERT_TRUE(gemma2.ok()) << gemma2.status();
  EXPECT_EQ(gemma2->attn_logit_softcapping(), 50);
  EXPECT_EQ(gemma2->final_logit_softcapping(), 30);
  EXPECT_EQ(gemma2->query_pre_attn_scalar(), 256);
  EXPECT_EQ(gemma2->sliding_window(), 4096);
  EXPECT_EQ(std::vector<std::string>(gemma2->layer_types().begin(), gemma2->layer_types().end()),
            (std::vector<std::string>{"sliding_attention", "full_attention", "sliding_attention",
                                      "full_attention"}));
  EXPECT_TRUE(gemma2->tie_word_embeddings());
  auto nulls = Read(Config(R"("model_type": "gemma2", "head_dim": 8,
      "attn_logit_softcapping": null, "final_logit_softcapping": null)"));
  ASSERT_TRUE(nulls.ok()) << nulls.status();
  EXPECT_FALSE(nulls->has_attn_logit_softcapping());
  EXPECT_FALSE(nulls->has_final_logit_softcapping());
  // Gemma 3 in transformers 4.x's form: sliding_window_pattern, rope_theta, rope_scaling for the
  // global layers and rope_local_base_freq for the sliding ones; no soft-capping by default.
  auto gemma3 = Read(Config(R"("model_type": "gemma3_text", "head_dim": 8,
      "sliding_window_pattern": 3, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
      "rope_scaling": {"rope_type": "linear", "factor": 8.0})"));
  ASSERT_TRUE(gemma3.ok()) << gemma3.status();
  EXPECT_EQ(std::vector<std::string>(gemma3->layer_types().begin(), gemma3->layer_types().end()),
            (std::vector<std::string>{"sliding_attention", "sliding_attention", "full_attention",
                                      "sliding_attention"}));
  EXPECT_EQ(gemma3->rope_scaling().factor(), 8);
  EXPECT_EQ(gemma3->rope_local_base_freq(), 10000);
  EXPECT_FALSE(gemma3->has_attn_logit_softcapping());
  EXPECT_TRUE(gemma3->qk_norm());
  EXPECT_THAT(ReadError(Config(R"("model_type": "gemma3_text", "head_dim": 8,
      "use_bidirectional_attention": true)")),
              HasSubstr("the decoder is causal"));
  EXPECT_THAT(ReadError(Config(R"("model_type": "gemma2", "head_dim": 8,
      "hidden_activation": "gelu")")),
              HasSubstr("only \"gelu_pytorch_tanh\""));
}

TEST(HfArchConfigTest, SlidingWindowFieldsAsTransformersReadThem) {
  // Qwen2: off by default whatever sliding_window says.
  auto off = Read(Config(R"("model_type": "qwen2", "sliding_window": 4096,
                            "use_sliding_window": false)"));
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_FALSE(off->has_sliding_window());
  // On: max_window_layers (default 28) decides, and 28 >= 4 layers means none.
  auto on = Read(Config(R"("model_type": "qwen2", "use_sliding_window": true,
                           "max_window_layers": 2)"));
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_EQ(on->sliding_window(), 4096);  // transformers' default
  EXPECT_EQ(on->first_sliding_layer(), 2);
  auto beyond = Read(Config(R"("model_type": "qwen2", "use_sliding_window": true,
                               "sliding_window": 8)"));
  ASSERT_TRUE(beyond.ok()) << beyond.status();
  EXPECT_FALSE(beyond->has_sliding_window());
  // Qwen3 reads the same fields.
  auto qwen3 = Read(Config(R"("model_type": "qwen3", "head_dim": 8, "use_sliding_window": true,
      "sliding_window": 16, "layer_types": ["full_attention", "full_attention",
      "sliding_attention", "sliding_attention"])"));
  ASSERT_TRUE(qwen3.ok()) << qwen3.status();
  EXPECT_EQ(qwen3->sliding_window(), 16);
  EXPECT_EQ(qwen3->first_sliding_layer(), 2);
  // Mistral: absent is transformers' 4096, null is none.
  auto absent = Read(Config(R"("model_type": "mistral")"));
  ASSERT_TRUE(absent.ok()) << absent.status();
  EXPECT_EQ(absent->sliding_window(), 4096);
  auto none = Read(Config(R"("model_type": "mistral", "sliding_window": null)"));
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->has_sliding_window());
  EXPECT_EQ(ResolvedModelType(*none), "mistral");
  // attention_dropout is read (and applied in training, models/decoder_test.cc).
  auto dropout = Read(Config(R"("model_type": "llama", "attention_dropout": 0.1)"));
  ASSERT_TRUE(dropout.ok()) << dropout.status();
  EXPECT_EQ(dropout->attention_dropout(), 0.1);
}

TEST(HfArchConfigTest, UnsupportedArchitecturesAndFeaturesAreRefused) {
  for (const std::string type : {"gemma", "gemma3", "phi", "mixtral", "qwen2_moe", "t5"}) {
    EXPECT_THAT(ReadError(Config(absl::StrCat(R"("model_type": ")", type, "\""))),
                AllOf(HasSubstr(absl::StrCat("\"model_type\" is \"", type, "\"")),
                      HasSubstr(R"("gemma2", "gemma3_text", "llama", "mistral", "phi3", "qwen2", "qwen3")"),
                      HasSubstr("Gemma 1, mixture-of-experts, multimodal and encoder-decoder")))
        << type;
  }
  EXPECT_THAT(ReadError(Config(R"("model_type": "qwen2", "mlp_bias": true)")),
              AllOf(HasSubstr("\"mlp_bias\" is true"), HasSubstr("only llama reads mlp_bias")));
  EXPECT_THAT(ReadError(Config(R"("model_type": "qwen2", "use_sliding_window": true,
      "sliding_window": 4, "layer_types": ["sliding_attention", "full_attention",
      "full_attention", "full_attention"])")),
              HasSubstr("windows in the last layers only"));
  EXPECT_THAT(ReadError(Config(R"("model_type": "qwen2", "layer_types": ["full_attention",
      "full_attention", "full_attention", "sliding_attention"])")),
              HasSubstr("but use_sliding_window is false"));
  EXPECT_THAT(ReadError(Config(R"("model_type": "llama", "layer_types": ["full_attention",
      "full_attention", "full_attention", "sliding_attention"])")),
              HasSubstr("Llama has no sliding-window layers"));
  EXPECT_THAT(ReadError(Config(R"("model_type": "mistral", "sliding_window": 0)")),
              HasSubstr("sliding_window = 0 must be positive"));
  EXPECT_THAT(ReadError(Config(R"("model_type": "llama", "attention_dropout": 1.0)")),
              HasSubstr("attention_dropout = 1 must be in [0, 1)"));

  // Configs built by hand: each feature only where transformers' class has it.
  proto::DecoderConfig config = NamedDecoderConfig("demo").value();
  config.set_mlp_bias(true);
  config.set_model_type("mistral");
  EXPECT_THAT(std::string(ValidateDecoderConfig(config).message()),
              HasSubstr("model_type \"mistral\" has mlp_bias true"));
  config = NamedDecoderConfig("demo").value();
  config.set_qkv_bias(true);
  config.set_attention_bias(true);
  EXPECT_THAT(std::string(ValidateDecoderConfig(config).message()), HasSubstr("set one"));
  config = NamedDecoderConfig("demo").value();
  config.set_model_type("gemma");
  EXPECT_THAT(std::string(ValidateDecoderConfig(config).message()),
              AllOf(HasSubstr("\"gemma\" is not implemented"),
                    HasSubstr("gemma2, gemma3_text, llama, mistral, phi3, qwen2, qwen3")));
  config = NamedDecoderConfig("demo").value();
  config.set_model_type("gemma2");
  EXPECT_THAT(std::string(ValidateDecoderConfig(config).message()),
              HasSubstr("Gemma has all four"));
  config = NamedDecoderConfig("demo").value();
  config.set_attn_logit_softcapping(30);
  EXPECT_THAT(std::string(ValidateDecoderConfig(config).message()),
              HasSubstr("sets a Gemma feature"));
  config = NamedDecoderConfig("demo").value();
  config.set_model_type("phi3");
  EXPECT_THAT(std::string(ValidateDecoderConfig(config).message()),
              HasSubstr("has fused_projections false"));
  config = NamedDecoderConfig("demo").value();
  config.set_residual_dropout(0.1);
  EXPECT_THAT(std::string(ValidateDecoderConfig(config).message()),
              HasSubstr("residual_dropout = 0.1 (only phi3 has it"));
}

// ---------------------------------------------------------------------------------------------
// Writing model directories for transformers

// Where the export tests write: $CPPTRAIN_HF_EXPORT_DIR<suffix>, for
// tests/golden/check_hf_export.py to load into transformers, else under TEST_TMPDIR.
std::string ExportDir(const std::string& suffix) {
  const char* dir = std::getenv("CPPTRAIN_HF_EXPORT_DIR");
  const std::string path = dir != nullptr && *dir != '\0' ? absl::StrCat(dir, suffix)
                                                          : FreshTestDir() + "/export" + suffix;
  EXPECT_TRUE(RemoveTree(path).ok());
  std::filesystem::create_directories(path);
  return path;
}

// A model of `config` written as a Hugging Face directory with its logits on a 12-token batch
// (longer than the windows used here), then loaded back: the same config and logits.
void ExportAndReload(const proto::DecoderConfig& config, const std::string& suffix) {
  const std::string dir = ExportDir(suffix);
  torch::manual_seed(99);
  auto model = BuildDecoder(config);
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<std::pair<std::string, at::Tensor>> weights;
  {
    at::NoGradGuard no_grad;
    for (const auto& item : (*model)->named_parameters()) {
      // Biases are initialized to zero: make them count.
      if (item.key().find(".bias") != std::string::npos) item.value().normal_(0, 0.1);
      weights.emplace_back(item.key(), item.value().detach());
    }
  }
  ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", weights, {{"format", "pt"}}).ok());
  ASSERT_TRUE(WriteHfModelConfigs(config, dir).ok());
  const at::Tensor input_ids = at::arange(24, at::kLong).remainder(config.vocab_size())
                                   .reshape({2, 12});
  at::NoGradGuard no_grad;
  (*model)->eval();  // no attention dropout
  const at::Tensor logits = (*model)->Logits(input_ids).contiguous();
  ASSERT_TRUE(WriteSafetensors(dir + "/expected_logits.safetensors",
                               {{"input_ids", input_ids}, {"logits", logits}}, {{"format", "pt"}})
                  .ok());
  auto loaded = LoadHfDecoderForTest(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  // Equal as configs: a field set to its default equals the field unset.
  google::protobuf::util::MessageDifferencer differencer;
  differencer.set_message_field_comparison(
      google::protobuf::util::MessageDifferencer::EQUIVALENT);
  std::string report;
  differencer.ReportDifferencesToString(&report);
  EXPECT_TRUE(differencer.Compare(config, (*loaded)->config())) << report;
  (*loaded)->eval();
  EXPECT_TRUE(at::equal((*loaded)->Logits(input_ids), logits));
}

proto::DecoderConfig Tiny(const std::string& model_type) {
  proto::DecoderConfig config = NamedDecoderConfig("tiny").value();
  config.set_qk_norm(false);  // head_dim stays 8: Mistral's config.json always has it
  if (model_type != "llama") config.set_model_type(model_type);
  return config;
}

TEST(HfArchExportTest, Qwen2LoadsBack) {
  proto::DecoderConfig config = Tiny("qwen2");
  config.set_qkv_bias(true);
  config.clear_model_type();  // qkv_bias says qwen2
  ExportAndReload(config, "_qwen2");
  const std::string json = HfConfigJson(config);
  EXPECT_THAT(json, AllOf(HasSubstr(R"("model_type": "qwen2")"),
                          HasSubstr(R"("architectures": ["Qwen2ForCausalLM"])"),
                          HasSubstr(R"("use_sliding_window": false)"),
                          Not(HasSubstr("attention_bias")), Not(HasSubstr("mlp_bias"))));
}

TEST(HfArchExportTest, Qwen2WithSlidingLayersLoadsBack) {
  proto::DecoderConfig config = Tiny("qwen2");
  config.set_qkv_bias(true);
  config.clear_model_type();
  config.set_tie_word_embeddings(false);
  config.set_sliding_window(3);
  config.set_first_sliding_layer(1);
  ExportAndReload(config, "_qwen2_sliding");
  EXPECT_THAT(HfConfigJson(config),
              AllOf(HasSubstr(R"("layer_types": ["full_attention", "sliding_attention"])"),
                    HasSubstr(R"("max_window_layers": 1)"), HasSubstr(R"("sliding_window": 3)"),
                    HasSubstr(R"("use_sliding_window": true)")));
}

TEST(HfArchExportTest, MistralLoadsBack) {
  proto::DecoderConfig config = Tiny("mistral");
  config.clear_model_type();  // the window says mistral
  config.set_sliding_window(5);
  config.set_tie_word_embeddings(false);
  ExportAndReload(config, "_mistral");
  proto::DecoderConfig no_window = Tiny("mistral");
  ExportAndReload(no_window, "_mistral_nowindow");
  EXPECT_THAT(HfConfigJson(no_window), HasSubstr(R"("sliding_window": null)"));
}

TEST(HfArchExportTest, LlamaWithMlpBiasLoadsBack) {
  proto::DecoderConfig config = Tiny("llama");
  config.set_mlp_bias(true);
  config.set_attention_dropout(0.25);
  ExportAndReload(config, "_llama_mlp_bias");
  EXPECT_THAT(HfConfigJson(config),
              AllOf(HasSubstr(R"("mlp_bias": true)"), HasSubstr(R"("attention_dropout": 0.25)")));
}

TEST(HfArchExportTest, YarnAndLongropeLoadBack) {
  proto::DecoderConfig yarn = Tiny("qwen2");
  yarn.set_qkv_bias(true);
  yarn.clear_model_type();  // qkv_bias says qwen2
  proto::RopeScaling* s = yarn.mutable_rope_scaling();
  s->set_rope_type("yarn");
  s->set_factor(4);
  s->set_original_max_position_embeddings(8);
  s->set_beta_fast(16);
  s->set_mscale(0.707);
  s->set_mscale_all_dim(1);
  s->set_truncate(false);
  ExportAndReload(yarn, "_yarn");
  EXPECT_THAT(HfConfigJson(yarn), AllOf(HasSubstr(R"("mscale": 0.707)"),
                                        HasSubstr(R"("truncate": false)")));
  proto::DecoderConfig longrope = Tiny("llama");
  s = longrope.mutable_rope_scaling();
  s->set_rope_type("longrope");
  s->set_original_max_position_embeddings(6);
  s->set_attention_factor(1.5);
  for (double f : {1.0, 2.0, 3.5, 4.0}) {
    s->add_short_factor(f);
    s->add_long_factor(2 * f);
  }
  ExportAndReload(longrope, "_longrope");
  EXPECT_THAT(HfConfigJson(longrope), HasSubstr(R"("long_factor": [2, 4, 7, 8])"));
  s->add_long_factor(1);
  EXPECT_THAT(std::string(ValidateDecoderConfig(longrope).message()),
              HasSubstr("long_factor 5; longrope needs head_dim / 2 = 4 each"));
}

TEST(HfArchExportTest, Phi3LoadsBackWithTheFusedNames) {
  proto::DecoderConfig config = Tiny("phi3");
  config.set_fused_projections(true);
  config.clear_model_type();  // fused_projections says phi3
  config.set_tie_word_embeddings(false);
  config.set_sliding_window(5);
  config.set_residual_dropout(0.125);
  config.set_partial_rotary_factor(0.5);
  proto::RopeScaling* s = config.mutable_rope_scaling();
  s->set_rope_type("longrope");
  s->set_original_max_position_embeddings(6);
  for (double f : {1.0, 3.5}) {  // 4 of 8 dimensions turn
    s->add_short_factor(f);
    s->add_long_factor(2 * f);
  }
  ExportAndReload(config, "_phi3");
  EXPECT_THAT(HfConfigJson(config),
              AllOf(HasSubstr(R"("model_type": "phi3")"),
                    HasSubstr(R"("architectures": ["Phi3ForCausalLM"])"),
                    HasSubstr(R"("original_max_position_embeddings": 6)"),
                    HasSubstr(R"("resid_pdrop": 0.125)"), HasSubstr(R"("sliding_window": 5)")));
}

proto::DecoderConfig TinyGemma(const std::string& type) {
  proto::DecoderConfig config = Tiny(type);
  config.set_hidden_act("gelu_pytorch_tanh");
  config.set_norm_unit_offset(true);
  config.set_scale_embeddings(true);
  config.set_sandwich_norms(true);
  config.set_query_pre_attn_scalar(16);
  config.set_sliding_window(5);
  config.add_layer_types("sliding_attention");
  config.add_layer_types("full_attention");
  config.clear_model_type();  // norm_unit_offset says gemma (qk_norm: gemma3_text)
  return config;
}

TEST(HfArchExportTest, Gemma2AndGemma3LoadBack) {
  proto::DecoderConfig gemma2 = TinyGemma("gemma2");
  gemma2.set_attn_logit_softcapping(4);
  gemma2.set_final_logit_softcapping(6);
  ExportAndReload(gemma2, "_gemma2");
  EXPECT_THAT(HfConfigJson(gemma2),
              AllOf(HasSubstr(R"("architectures": ["Gemma2ForCausalLM"])"),
                    HasSubstr(R"("hidden_activation": "gelu_pytorch_tanh")"),
                    HasSubstr(R"("final_logit_softcapping": 6.0)"),
                    HasSubstr(R"("layer_types": ["sliding_attention", "full_attention"])")));
  proto::DecoderConfig gemma3 = TinyGemma("gemma3_text");
  gemma3.set_qk_norm(true);
  gemma3.set_tie_word_embeddings(false);
  gemma3.set_rope_theta(1e6);
  gemma3.set_rope_local_base_freq(10000);
  gemma3.mutable_rope_scaling()->set_rope_type("linear");
  gemma3.mutable_rope_scaling()->set_factor(2);
  ExportAndReload(gemma3, "_gemma3");
  EXPECT_THAT(HfConfigJson(gemma3),
              AllOf(HasSubstr(R"("architectures": ["Gemma3ForCausalLM"])"),
                    HasSubstr(R"("final_logit_softcapping": null)"),
                    HasSubstr(R"("sliding_attention": {"rope_theta": 10000, "rope_type": "default"})")));
}

}  // namespace
}  // namespace cpptrain
