#include "checkpoint/model_match.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "models/configs.h"

namespace cpptrain {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

TEST(DecoderConfigDifferencesTest, NamesEachFieldWithBothValues) {
  const proto::DecoderConfig tiny = NamedDecoderConfig("tiny").value();
  EXPECT_THAT(DecoderConfigDifferences(tiny, tiny), IsEmpty());
  proto::DecoderConfig other = tiny;
  other.set_rope_theta(500000);
  other.set_rms_norm_eps(1e-5);
  other.set_qk_norm(!tiny.qk_norm());
  other.set_initializer_range(0.5);  // draws initial values only: not compared
  EXPECT_THAT(DecoderConfigDifferences(tiny, other),
              ElementsAre(absl::StrCat("rope_theta is ", tiny.rope_theta(),
                                       " in the checkpoint but 500000 in the model"),
                          "rms_norm_eps is 1e-06 in the checkpoint but 1e-05 in the model",
                          absl::StrCat("qk_norm is ", tiny.qk_norm() ? "true" : "false",
                                       " in the checkpoint but ",
                                       other.qk_norm() ? "true" : "false", " in the model")));
}

TEST(DecoderConfigDifferencesTest, UnsetHeadDimIsHiddenOverHeads) {
  proto::DecoderConfig a = NamedDecoderConfig("tiny").value();
  a.clear_head_dim();
  proto::DecoderConfig b = a;
  b.set_head_dim(a.hidden_size() / a.num_attention_heads());
  EXPECT_THAT(DecoderConfigDifferences(a, b), IsEmpty());
  b.set_head_dim(2 * b.head_dim());
  EXPECT_THAT(DecoderConfigDifferences(a, b, "config.json"), ElementsAre(HasSubstr("head_dim is")));
  EXPECT_THAT(DecoderConfigDifferences(a, b, "config.json")[0], HasSubstr("in config.json"));
}

TEST(ConfigFieldHintTest, NamesTheFieldThatDecidesATensor) {
  EXPECT_EQ(ConfigFieldHint("model.layers.3.self_attn.q_norm.weight"), "qk_norm");
  EXPECT_EQ(ConfigFieldHint("model.layers.3.self_attn.k_norm.weight"), "qk_norm");
  EXPECT_EQ(ConfigFieldHint("model.layers.0.self_attn.v_proj.bias"), "attention_bias");
  EXPECT_EQ(ConfigFieldHint("model.layers.0.mlp.up_proj.bias"), "mlp_bias");
  EXPECT_EQ(ConfigFieldHint("lm_head.weight"), "tie_word_embeddings");
  EXPECT_EQ(ConfigFieldHint("model.layers.4.mlp.up_proj.weight", 4), "num_hidden_layers");
  EXPECT_EQ(ConfigFieldHint("model.model.layers.4.mlp.up_proj.weight", 4), "num_hidden_layers");
  EXPECT_EQ(ConfigFieldHint("model.layers.3.mlp.up_proj.weight", 4), "");
  EXPECT_EQ(ConfigFieldHint("model.norm.weight"), "");
  EXPECT_EQ(DecoderLayerCount({"model.layers.0.a", "model.layers.11.b", "model.norm.weight"}), 12);
  EXPECT_EQ(DecoderLayerCount({"model.model.layers.2.a"}), 3);
  EXPECT_EQ(DecoderLayerCount({"lm_head.weight"}), 0);
}

TEST(LoadProblemsTest, StrictListsEverythingAndTheFields) {
  LoadProblems problems;
  EXPECT_TRUE(problems.Resolve("checkpoint 'x'", /*strict=*/true, "set load_strict: false").ok());
  problems.AddConfigDifference("rope_theta is 1 in the checkpoint but 2 in the model");
  problems.AddUnexpected("model.layers.0.self_attn.q_norm.weight", {8}, "qk_norm");
  problems.AddMissing("model.layers.0.self_attn.q_proj.bias", {32}, "attention_bias");
  problems.AddShapeMismatch("model.norm.weight", {32}, {64});
  const absl::Status strict = problems.Resolve("checkpoint 'x'", true, "set load_strict: false");
  EXPECT_EQ(strict.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      std::string(strict.message()),
      AllOf(HasSubstr("checkpoint 'x' does not match the model (4 problems; nothing was loaded; "
                      "config fields that differ or probably differ: attention_bias, qk_norm, "
                      "rope_theta)"),
            HasSubstr("unexpected tensor 'model.layers.0.self_attn.q_norm.weight' (shape [8])"),
            HasSubstr("missing tensor 'model.layers.0.self_attn.q_proj.bias' (the model's "
                      "shape [32])"),
            HasSubstr("tensor 'model.norm.weight' has shape [32] saved but [64] in the model"),
            HasSubstr("set load_strict: false to load what matches")));
  EXPECT_TRUE(problems.Resolve("checkpoint 'x'", /*strict=*/false, "").ok());
}

TEST(LoadProblemsTest, LongListsAreCounted) {
  LoadProblems problems;
  for (int i = 0; i < 20; ++i) problems.AddMissing(absl::StrCat("w", i), {1}, "");
  const std::string message(problems.Resolve("d", true, "e").message());
  EXPECT_THAT(message,
              AllOf(HasSubstr("20 problems"), HasSubstr("'w15'"), HasSubstr("and 4 more")));
  EXPECT_THAT(message, testing::Not(HasSubstr("'w16'")));
}

}  // namespace
}  // namespace cpptrain
