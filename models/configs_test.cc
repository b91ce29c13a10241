#include "models/configs.h"

#include <algorithm>
#include <string>

#include <gtest/gtest.h>

namespace cpptrain {
namespace {

int64_t CountRegistered(DecoderLM& model) {
  int64_t n = 0;
  for (const auto& p : model.parameters()) n += p.numel();
  return n;
}

// The brief's formula: embedding + per layer (q, k, v, o, MLP, two norms, qk norms) + final
// norm (+ LM head when untied).
int64_t FormulaCount(int64_t v, int64_t h, int64_t inter, int64_t layers, int64_t heads,
                     int64_t kv_heads, int64_t d, bool tied, bool qk_norm) {
  const int64_t per_layer = h * heads * d + 2 * h * kv_heads * d + heads * d * h +
                            3 * h * inter + 2 * h + (qk_norm ? 2 * d : 0);
  return v * h + layers * per_layer + h + (tied ? 0 : v * h);
}

void ExpectInvalid(const proto::DecoderConfig& config, const std::string& needle) {
  absl::Status status = ValidateDecoderConfig(config);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << config.ShortDebugString();
  EXPECT_NE(status.message().find(needle), absl::string_view::npos) << status;
}

TEST(ConfigsTest, NamedConfigsHaveTheirPublishedShapes) {
  const proto::DecoderConfig qwen = NamedDecoderConfig("qwen3-0.6b").value();
  EXPECT_EQ(qwen.vocab_size(), 151936);
  EXPECT_EQ(qwen.hidden_size(), 1024);
  EXPECT_EQ(qwen.intermediate_size(), 3072);
  EXPECT_EQ(qwen.num_hidden_layers(), 28);
  EXPECT_EQ(qwen.num_attention_heads(), 16);
  EXPECT_EQ(qwen.num_key_value_heads(), 8);
  EXPECT_EQ(qwen.head_dim(), 128);  // set explicitly: 16 * 128 != 1024
  EXPECT_TRUE(qwen.tie_word_embeddings());
  EXPECT_TRUE(qwen.qk_norm());
  EXPECT_EQ(qwen.rope_theta(), 1e6);
  EXPECT_EQ(qwen.rms_norm_eps(), 1e-6);

  const proto::DecoderConfig llama = NamedDecoderConfig("llama3-8b").value();
  EXPECT_EQ(llama.vocab_size(), 128256);
  EXPECT_EQ(llama.num_key_value_heads(), 8);
  EXPECT_EQ(ResolvedHeadDim(llama), 128);
  EXPECT_FALSE(llama.tie_word_embeddings());
  EXPECT_FALSE(llama.qk_norm());
  EXPECT_EQ(llama.rope_theta(), 500000);
  EXPECT_EQ(llama.rms_norm_eps(), 1e-5);

  for (const std::string& name : KnownDecoderConfigNames()) {
    EXPECT_TRUE(ValidateDecoderConfig(NamedDecoderConfig(name).value()).ok()) << name;
  }
}

TEST(ConfigsTest, UnknownNameListsTheKnownOnes) {
  absl::StatusOr<proto::DecoderConfig> config = NamedDecoderConfig("gpt5");
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  for (const std::string& name :
       {"gpt5", "qwen3-0.6b", "llama3-8b", "llama3.2-3b", "tiny", "demo"}) {
    EXPECT_NE(config.status().message().find(name), absl::string_view::npos) << config.status();
  }
}

TEST(ConfigsTest, ResolveModelSpec) {
  proto::ModelSpec spec;
  EXPECT_EQ(ResolveModelSpec(spec).status().code(), absl::StatusCode::kInvalidArgument);
  spec.set_name("tiny");
  EXPECT_EQ(ResolveModelSpec(spec).value().SerializeAsString(),
            NamedDecoderConfig("tiny").value().SerializeAsString());
  *spec.mutable_decoder() = NamedDecoderConfig("demo").value();
  EXPECT_EQ(ResolveModelSpec(spec).value().vocab_size(), 32);
  spec.mutable_decoder()->set_num_key_value_heads(3);
  EXPECT_EQ(ResolveModelSpec(spec).status().code(), absl::StatusCode::kInvalidArgument);
  spec.set_name("nope");
  EXPECT_EQ(ResolveModelSpec(spec).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ConfigsTest, ValidationNamesFieldAndValue) {
  const proto::DecoderConfig tiny = NamedDecoderConfig("tiny").value();
  proto::DecoderConfig c = tiny;
  c.clear_vocab_size();
  ExpectInvalid(c, "vocab_size is not set");
  c = tiny;
  c.set_intermediate_size(-4);
  ExpectInvalid(c, "intermediate_size = -4 must be positive");
  c = tiny;
  c.set_num_key_value_heads(3);
  ExpectInvalid(c, "num_attention_heads = 4 is not a multiple of num_key_value_heads = 3");
  c = tiny;
  c.clear_head_dim();
  c.set_hidden_size(30);
  ExpectInvalid(c, "hidden_size = 30 is not a multiple of num_attention_heads = 4");
  c.set_head_dim(8);  // an explicit head_dim lifts the divisibility requirement
  EXPECT_TRUE(ValidateDecoderConfig(c).ok());
  c.set_head_dim(7);
  ExpectInvalid(c, "head_dim = 7 is odd");
  c = tiny;
  c.set_rms_norm_eps(0);
  ExpectInvalid(c, "rms_norm_eps > 0");
  EXPECT_FALSE(BuildDecoder(c).ok());
}

TEST(ConfigsTest, HeadDimDefaultsToHiddenOverHeads) {
  proto::DecoderConfig c = NamedDecoderConfig("demo").value();
  EXPECT_FALSE(c.has_head_dim());
  EXPECT_EQ(ResolvedHeadDim(c), 64 / 4);
}

TEST(ConfigsTest, ParameterCountMatchesBuiltModels) {
  for (bool tied : {false, true}) {
    for (bool qk_norm : {false, true}) {
      for (bool bias : {false, true}) {
        proto::DecoderConfig c = NamedDecoderConfig("tiny").value();
        c.set_tie_word_embeddings(tied);
        c.set_qk_norm(qk_norm);
        c.set_attention_bias(bias);
        auto model = BuildDecoder(c).value();
        EXPECT_EQ(DecoderParameterCount(c), CountRegistered(*model)) << c.ShortDebugString();
        if (!bias) {
          EXPECT_EQ(DecoderParameterCount(c), FormulaCount(64, 32, 64, 2, 4, 2, 8, tied, qk_norm));
        }
      }
    }
  }
  auto demo = BuildDecoder(NamedDecoderConfig("demo").value()).value();
  EXPECT_EQ(DecoderParameterCount(demo->config()), CountRegistered(*demo));
}

TEST(ConfigsTest, ReferenceModelParameterCounts) {
  const int64_t qwen = FormulaCount(151936, 1024, 3072, 28, 16, 8, 128, true, true);
  EXPECT_EQ(DecoderParameterCount(NamedDecoderConfig("qwen3-0.6b").value()), qwen);
  EXPECT_EQ(qwen, 596049920);  // "0.6B" on the model card
  const int64_t llama = FormulaCount(128256, 4096, 14336, 32, 32, 8, 128, false, false);
  EXPECT_EQ(DecoderParameterCount(NamedDecoderConfig("llama3-8b").value()), llama);
  EXPECT_EQ(llama, 8030261248);  // "8B" on the model card
  const int64_t llama3b = FormulaCount(128256, 3072, 8192, 28, 24, 8, 128, true, false);
  EXPECT_EQ(DecoderParameterCount(NamedDecoderConfig("llama3.2-3b").value()), llama3b);
  EXPECT_EQ(llama3b, 3212749824);  // "3.21B" on the model card
  const int64_t llama1b = FormulaCount(128256, 2048, 8192, 16, 32, 8, 64, true, false);
  EXPECT_EQ(DecoderParameterCount(NamedDecoderConfig("llama3.2-1b").value()), llama1b);
  EXPECT_EQ(llama1b, 1235814400);  // "1.24B" on the model card
  // With the q/k/v biases (896 + 2 * 128 a layer).
  const proto::DecoderConfig qwen2 = NamedDecoderConfig("qwen2.5-0.5b").value();
  EXPECT_EQ(ResolvedModelType(qwen2), "qwen2");
  EXPECT_EQ(DecoderParameterCount(qwen2),
            FormulaCount(151936, 896, 4864, 24, 14, 2, 64, true, false) + 24 * (896 + 2 * 128));
  EXPECT_EQ(DecoderParameterCount(qwen2), 494032768);  // "0.49B" on the model card
  const proto::DecoderConfig mistral = NamedDecoderConfig("mistral-7b").value();
  EXPECT_EQ(ResolvedModelType(mistral), "mistral");
  EXPECT_EQ(mistral.sliding_window(), 4096);
  EXPECT_EQ(DecoderParameterCount(mistral), 7241732096);  // Mistral-7B-v0.1's 7.24B
  // Its first 8 layers: 8 of the 32 layers' 218112000 each, the embeddings, head and norm.
  const proto::DecoderConfig mistral8 = NamedDecoderConfig("mistral-7b-8layers").value();
  EXPECT_EQ(ResolvedModelType(mistral8), "mistral");
  EXPECT_EQ(mistral8.sliding_window(), 4096);
  EXPECT_EQ(DecoderParameterCount(mistral8), 7241732096 - int64_t{24} * 218112000);
  // Fused projections count as the separate ones.
  const proto::DecoderConfig phi3 = NamedDecoderConfig("phi3-mini").value();
  EXPECT_EQ(ResolvedModelType(phi3), "phi3");
  EXPECT_EQ(DecoderParameterCount(phi3), 3821079552);  // Phi-3-mini's 3.8B
  // Two more norms a layer (4 * 2304).
  const proto::DecoderConfig gemma2 = NamedDecoderConfig("gemma2-2b").value();
  EXPECT_EQ(ResolvedModelType(gemma2), "gemma2");
  EXPECT_EQ(DecoderParameterCount(gemma2), 2614341888);  // gemma-2-2b's 2.61B
  const proto::DecoderConfig gemma3 = NamedDecoderConfig("gemma3-1b").value();
  EXPECT_EQ(ResolvedModelType(gemma3), "gemma3_text");
  EXPECT_EQ(DecoderParameterCount(gemma3), 999885952);  // gemma-3-1b-pt's 1.0B
  // 22 of 26 layers sliding over 512 keys.
  EXPECT_EQ(std::count(gemma3.layer_types().begin(), gemma3.layer_types().end(),
                       std::string("sliding_attention")),
            22);
}

TEST(ConfigsTest, FlopsPerToken) {
  const proto::DecoderConfig c = NamedDecoderConfig("tiny").value();
  // Per layer q 32*32, k and v 2*32*16, o 32*32, MLP 3*32*64; LM head 64*32 (tied, counted).
  const int64_t matmul = 2 * (32 * 32 + 2 * 32 * 16 + 32 * 32 + 3 * 32 * 64) + 64 * 32;
  EXPECT_EQ(DecoderMatmulParameterCount(c), matmul);
  EXPECT_DOUBLE_EQ(DecoderTrainingFlopsPerToken(c, 16), 6.0 * matmul + 12.0 * 2 * 4 * 8 * 16);
  // Untied Llama: every parameter but the embedding and the 2 * 32 + 1 norms is a matmul weight.
  const proto::DecoderConfig llama = NamedDecoderConfig("llama3-8b").value();
  EXPECT_EQ(DecoderMatmulParameterCount(llama),
            DecoderParameterCount(llama) - 128256LL * 4096 - 65 * 4096);
  // A window of 4 in layer 1 of 2: that layer's attention counts 4 keys, not 16.
  proto::DecoderConfig windowed = c;
  windowed.set_qk_norm(false);
  windowed.set_qkv_bias(true);
  windowed.set_sliding_window(4);
  windowed.set_first_sliding_layer(1);
  EXPECT_DOUBLE_EQ(DecoderTrainingFlopsPerToken(windowed, 16),
                   6.0 * matmul + 12.0 * 4 * 8 * (16 + 4));
  EXPECT_DOUBLE_EQ(DecoderTrainingFlopsPerToken(windowed, 3), 6.0 * matmul + 12.0 * 4 * 8 * 6);
}

}  // namespace
}  // namespace cpptrain
