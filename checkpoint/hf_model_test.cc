// Hugging Face model directories written by transformers (tests/golden/gen_hf_golden.py) load
// into DecoderLM and give transformers' logits; config.json fields map onto DecoderConfig; a
// checkpoint that does not fit the model is an error naming the tensor and leaves it unchanged.
// The other direction: HfConfigJson round-trips through DecoderConfigFromHfConfig, and an
// exported model directory (checked against transformers by tests/golden/check_hf_export.py)
// loads back with the same logits.
#include "checkpoint/hf_model.h"

#include <ATen/ATen.h>
#include <torch/utils.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/files.h"
#include "checkpoint/hf_decoder_testing.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/test_dirs.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "models/configs.h"
#include "models/decoder.h"

namespace cpptrain {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using Tensors = std::vector<std::pair<std::string, at::Tensor>>;

// transformers' input_ids and fp32 logits, saved beside the model.
struct Expected {
  at::Tensor input_ids;
  at::Tensor logits;
};

Expected ReadExpected(const std::string& dir) {
  auto file = SafetensorsFile::Open(dir + "/expected_logits.safetensors");
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return {};
  return {(*file)->GetCopy("input_ids").value(), (*file)->GetCopy("logits").value()};
}

void ExpectTransformersLogits(const std::string& dir, DecoderLM& model) {
  const Expected expected = ReadExpected(dir);
  ASSERT_TRUE(expected.logits.defined());
  at::NoGradGuard no_grad;
  const at::Tensor logits = model.Logits(expected.input_ids);
  ASSERT_EQ(logits.sizes(), expected.logits.sizes());
  const double max_diff = (logits - expected.logits).abs().max().item<double>();
  EXPECT_LT(max_diff, 1e-5) << dir;
  // The comparison is worth something: the logits are far from zero and from each other.
  EXPECT_GT(expected.logits.std().item<double>(), 0.1);
}

// Every tensor of a model directory, as owned copies.
Tensors ReadAll(const std::string& dir) {
  Tensors tensors;
  auto files = SafetensorsModelDir::Open(dir);
  EXPECT_TRUE(files.ok()) << files.status();
  if (!files.ok()) return tensors;
  for (const std::string& name : (*files)->names()) {
    tensors.emplace_back(name, (*files)->GetCopy(name).value());
  }
  return tensors;
}

std::map<std::string, at::Tensor> Snapshot(DecoderLM& model) {
  std::map<std::string, at::Tensor> out;
  for (const auto& item : model.named_parameters()) out[item.key()] = item.value().clone();
  return out;
}

void ExpectUnchanged(DecoderLM& model, const std::map<std::string, at::Tensor>& before) {
  for (const auto& item : model.named_parameters()) {
    EXPECT_TRUE(at::equal(item.value(), before.at(item.key()))) << item.key() << " changed";
  }
}

// ---------------------------------------------------------------------------------------------
// Golden directories

TEST(HfModelTest, Qwen3TiedSingleFileGivesTransformersLogits) {
  const std::string dir = TestdataPath("hf_qwen3_tiny");
  auto model = LoadHfDecoderForTest(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  const proto::DecoderConfig& config = (*model)->config();
  EXPECT_EQ(config.vocab_size(), 64);
  EXPECT_EQ(config.head_dim(), 8);
  EXPECT_EQ(config.num_key_value_heads(), 2);
  EXPECT_EQ(config.rope_theta(), 1e6);
  EXPECT_TRUE(config.qk_norm());
  EXPECT_TRUE(config.tie_word_embeddings());
  EXPECT_FALSE(config.attention_bias());
  EXPECT_FALSE((*model)->named_parameters().contains("lm_head.weight"));
  ExpectTransformersLogits(dir, **model);
}

TEST(HfModelTest, LlamaShardedBf16FilesGiveTransformersLogits) {
  const std::string dir = TestdataPath("hf_llama_tiny");
  ASSERT_TRUE(std::filesystem::exists(dir + "/model.safetensors.index.json"));
  auto model = LoadHfDecoderForTest(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  const proto::DecoderConfig& config = (*model)->config();
  EXPECT_FALSE(config.qk_norm());
  EXPECT_FALSE(config.tie_word_embeddings());
  EXPECT_TRUE(config.attention_bias());
  EXPECT_EQ(config.rms_norm_eps(), 1e-5);
  // Each bf16 tensor became the fp32 parameter of the same name, exactly.
  const Tensors file = ReadAll(dir);
  const auto params = (*model)->named_parameters();
  EXPECT_EQ(file.size(), params.size());
  for (const auto& [name, tensor] : file) {
    ASSERT_TRUE(params.contains(name)) << name;
    EXPECT_EQ(tensor.scalar_type(), at::kBFloat16) << name;
    EXPECT_EQ(params[name].scalar_type(), at::kFloat) << name;
    EXPECT_TRUE(at::equal(params[name], tensor.to(at::kFloat))) << name;
  }
  ExpectTransformersLogits(dir, **model);
}

// The scaled rotary embeddings: transformers' logits within 1e-5, and the scaling matters (the
// same weights with the default embedding give logits further away than that).
void ExpectScaledRopeLogits(const std::string& name, const std::string& rope_type) {
  const std::string dir = TestdataPath(name);
  auto model = LoadHfDecoderForTest(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  const proto::DecoderConfig& config = (*model)->config();
  EXPECT_EQ(config.rope_scaling().rope_type(), rope_type);
  EXPECT_EQ(config.bos_token_id(), 1);
  ASSERT_EQ(config.eos_token_id_size(), 1);
  EXPECT_EQ(config.eos_token_id(0), 2);
  EXPECT_EQ(config.pad_token_id(), 0);
  ExpectTransformersLogits(dir, **model);

  proto::DecoderConfig unscaled = config;
  unscaled.clear_rope_scaling();
  auto plain = BuildDecoder(unscaled);
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_TRUE(LoadHfWeights(dir, **plain, {/*strict=*/false}).ok());
  const Expected expected = ReadExpected(dir);
  at::NoGradGuard no_grad;
  const double diff =
      ((*plain)->Logits(expected.input_ids) - expected.logits).abs().max().item<double>();
  EXPECT_GT(diff, 1e-3) << "the scaling changes too little for the test to mean anything";
}

TEST(HfModelTest, Llama3RopeScalingGivesTransformersLogits) {
  ExpectScaledRopeLogits("hf_rope_llama3_tiny", "llama3");
  auto config = DecoderConfigFromHfConfig(TestdataPath("hf_rope_llama3_tiny") + "/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->rope_scaling().factor(), 8);
  EXPECT_EQ(config->rope_scaling().low_freq_factor(), 1);
  EXPECT_EQ(config->rope_scaling().high_freq_factor(), 4);
  EXPECT_EQ(config->rope_scaling().original_max_position_embeddings(), 64);
  EXPECT_EQ(config->max_position_embeddings(), 256);
}

TEST(HfModelTest, LinearRopeScalingGivesTransformersLogits) {
  ExpectScaledRopeLogits("hf_rope_linear_tiny", "linear");
}

TEST(HfModelTest, DynamicRopeScalingGivesTransformersLogits) {
  ExpectScaledRopeLogits("hf_rope_dynamic_tiny", "dynamic");
  // Within max_position_embeddings (16) dynamic is the default embedding.
  auto model = LoadHfDecoderForTest(TestdataPath("hf_rope_dynamic_tiny"));
  ASSERT_TRUE(model.ok()) << model.status();
  proto::DecoderConfig unscaled = (*model)->config();
  unscaled.clear_rope_scaling();
  auto plain = BuildDecoder(unscaled);
  ASSERT_TRUE(
      plain.ok() &&
      LoadHfWeights(TestdataPath("hf_rope_dynamic_tiny"), **plain, {/*strict=*/false}).ok());
  const at::Tensor ids = at::arange(16, at::kLong).reshape({1, 16});
  at::NoGradGuard no_grad;
  EXPECT_TRUE(at::equal((*model)->Logits(ids), (*plain)->Logits(ids)));
}

TEST(HfConfigTest, ReadsTransformers4RopeScaling) {
  const std::string path = WriteText(FreshTestDir() + "/config.json", R"({
    "model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
    "num_hidden_layers": 2, "num_attention_heads": 4, "rope_theta": 500000.0,
    "max_position_embeddings": 131072, "eos_token_id": [128001, 128008], "bos_token_id": 128000,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0}})");
  auto config = DecoderConfigFromHfConfig(path);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->rope_theta(), 500000);
  EXPECT_EQ(config->rope_scaling().rope_type(), "llama3");
  // Absent: max_position_embeddings, as transformers' standardize_rope_params sets it.
  EXPECT_EQ(config->rope_scaling().original_max_position_embeddings(), 131072);
  EXPECT_EQ(config->eos_token_id_size(), 2);
  EXPECT_FALSE(config->has_pad_token_id());
  // Written back (both rope forms) and read again: the same config.
  const std::string again = FreshTestDir() + "/again.json";
  ASSERT_TRUE(WriteHfConfig(*config, again).ok());
  EXPECT_THAT(ReadBytes(again), AllOf(HasSubstr(R"("eos_token_id": [128001, 128008])"),
                                      HasSubstr(R"("rope_scaling": {"factor": 8)"),
                                      HasSubstr(R"("pad_token_id": null)")));
  auto read = DecoderConfigFromHfConfig(again);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->SerializeAsString(), config->SerializeAsString());
}

TEST(HfModelTest, ConvertsToTheParameterDtype) {
  const std::string dir = TestdataPath("hf_qwen3_tiny");
  auto config = DecoderConfigFromHfConfig(dir + "/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  auto model = BuildDecoder(*config);
  ASSERT_TRUE(model.ok());
  (*model)->to(at::kBFloat16);
  ASSERT_TRUE(LoadHfWeights(dir, **model).ok());
  const at::Tensor embed = (*model)->named_parameters()["model.embed_tokens.weight"];
  EXPECT_EQ(embed.scalar_type(), at::kBFloat16);
  auto files = SafetensorsModelDir::Open(dir);
  ASSERT_TRUE(files.ok());
  EXPECT_TRUE(
      at::equal(embed, (*files)->Get("model.embed_tokens.weight").value().to(at::kBFloat16)));
}

// ---------------------------------------------------------------------------------------------
// config.json

// A transformers 4.x Qwen3 config, as on the Hub: rope_theta at the top level, rope_scaling
// null, and fields the decoder ignores.
constexpr char kQwen3V4Config[] = R"({
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 1024,
  "initializer_range": 0.02,
  "intermediate_size": 3072,
  "max_position_embeddings": 40960,
  "max_window_layers": 28,
  "model_type": "qwen3",
  "num_attention_heads": 16,
  "num_hidden_layers": 28,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

TEST(HfConfigTest, ReadsATransformers4Qwen3Config) {
  const std::string path = WriteText(FreshTestDir() + "/config.json", kQwen3V4Config);
  auto config = DecoderConfigFromHfConfig(path);
  ASSERT_TRUE(config.ok()) << config.status();
  // The same shape as the named config.
  proto::DecoderConfig want = NamedDecoderConfig("qwen3-0.6b").value();
  want.set_attention_bias(false);
  want.set_initializer_range(0.02);
  want.set_max_position_embeddings(40960);
  want.set_bos_token_id(151643);
  want.add_eos_token_id(151645);
  EXPECT_EQ(config->SerializeAsString(), want.SerializeAsString())
      << config->DebugString() << "\nexpected\n"
      << want.DebugString();
}

TEST(HfConfigTest, AbsentAndNullFieldsTakeTransformersDefaults) {
  const std::string path = WriteText(FreshTestDir() + "/config.json", R"({
    "model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
    "num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": null,
    "num_key_value_heads": null, "rope_parameters": null, "tie_word_embeddings": null})");
  auto config = DecoderConfigFromHfConfig(path);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(config->has_head_dim());  // hidden / heads
  EXPECT_EQ(config->num_key_value_heads(), 4);
  EXPECT_EQ(config->rope_theta(), 10000);
  EXPECT_EQ(config->rms_norm_eps(), 1e-6);
  EXPECT_EQ(config->initializer_range(), 0.02);
  EXPECT_FALSE(config->tie_word_embeddings());
  EXPECT_FALSE(config->qk_norm());
  EXPECT_FALSE(config->attention_bias());
}

// The message of DecoderConfigFromHfConfig's error for a config.json of `text`, checked to
// name the file.
std::string ConfigError(const std::string& text) {
  const std::string path = WriteText(FreshTestDir() + "/config.json", text);
  auto config = DecoderConfigFromHfConfig(path);
  EXPECT_FALSE(config.ok()) << text;
  if (config.ok()) return "";
  EXPECT_THAT(std::string(config.status().message()), HasSubstr(path));
  return std::string(config.status().message());
}

// A valid llama config with `extra` fields added (later keys must not repeat these).
std::string Llama(const std::string& extra) {
  return absl::StrCat(R"({"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
      "num_hidden_layers": 2, "num_attention_heads": 4)",
                      extra.empty() ? "" : ", ", extra, "}");
}

TEST(HfConfigTest, ErrorsNameTheFieldAndTheValue) {
  EXPECT_THAT(ConfigError(Llama(R"("model_type": "gemma")")),
              AllOf(HasSubstr("\"model_type\" is \"gemma\""),
                    HasSubstr(R"("llama", "mistral", "phi3", "qwen2", "qwen3")")));
  EXPECT_THAT(ConfigError(Llama("")), HasSubstr("\"model_type\" is missing"));
  EXPECT_THAT(ConfigError(Llama(
                  R"("model_type": "llama", "rope_scaling": {"type": "mrope", "factor": 2.0})")),
              AllOf(HasSubstr(R"(rope_type "mrope")"), HasSubstr("is not implemented"),
                    HasSubstr("supported: linear, dynamic, llama3, yarn, longrope")));
  EXPECT_THAT(ConfigError(Llama(R"("model_type": "llama",
          "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0})")),
              AllOf(HasSubstr(R"(rope_type "llama3")"),
                    HasSubstr("high_freq_factor > low_freq_factor > 0")));
  EXPECT_THAT(ConfigError(Llama(R"("model_type": "llama",
          "rope_parameters": {"rope_type": "linear", "rope_theta": 1.0, "factor": 0.5})")),
              HasSubstr("factor = 0.5; set a finite factor >= 1"));
  EXPECT_THAT(ConfigError(Llama(R"("model_type": "llama",
          "rope_parameters": {"rope_type": "linear", "rope_theta": 1.0, "factor": 2.0},
          "rope_scaling": {"rope_type": "linear", "factor": 3.0})")),
              HasSubstr("make the two agree"));
  EXPECT_THAT(ConfigError(Llama(R"("model_type": "llama",
                  "rope_parameters": {"rope_theta": 10000.0, "mrope_section": [1, 2]})")),
              HasSubstr(R"("rope_parameters.mrope_section" is [1, 2])"));
  EXPECT_THAT(ConfigError(Llama(R"("model_type": "llama", "rope_theta": 500000.0,
                  "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0})")),
              HasSubstr("\"rope_theta\" is 500000 elsewhere in the file"));
  EXPECT_THAT(ConfigError(Llama(R"("model_type": "llama", "hidden_act": "gelu")")),
              AllOf(HasSubstr("\"hidden_act\" is \"gelu\""), HasSubstr("only \"silu\"")));
  EXPECT_THAT(ConfigError(Llama(R"("model_type": "qwen3", "mlp_bias": true)")),
              HasSubstr("\"mlp_bias\" is true"));
  EXPECT_THAT(ConfigError(Llama(R"("model_type": "qwen3",
                  "layer_types": ["full_attention", "sliding_attention"])")),
              HasSubstr("names sliding_attention layers but use_sliding_window is false"));
  EXPECT_THAT(ConfigError(Llama(R"("model_type": "qwen3",
                  "layer_types": ["full_attention", "chunked_attention"])")),
              HasSubstr("found \"chunked_attention\""));
  EXPECT_THAT(ConfigError(Llama(R"("model_type": "llama", "num_key_value_heads": 2.5)")),
              AllOf(HasSubstr("\"num_key_value_heads\" is 2.5"), HasSubstr("expected an integer")));
  EXPECT_THAT(ConfigError(Llama(R"("model_type": "llama", "tie_word_embeddings": "yes")")),
              HasSubstr("\"tie_word_embeddings\" is \"yes\"; expected true or false"));
  EXPECT_THAT(ConfigError(Llama(R"("model_type": "llama", "num_key_value_heads": 3)")),
              HasSubstr("num_attention_heads = 4 is not a multiple of num_key_value_heads = 3"));
  EXPECT_THAT(ConfigError(R"({"model_type": "llama", "hidden_size": 32})"),
              HasSubstr("\"vocab_size\" is missing or null"));
  EXPECT_THAT(ConfigError(R"({"model_type": "llama",)"), HasSubstr("invalid JSON at byte"));
  EXPECT_THAT(ConfigError("[]"), HasSubstr("expected an object"));

  auto missing = DecoderConfigFromHfConfig(FreshTestDir() + "/no/config.json");
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("cannot read"));
}

// ---------------------------------------------------------------------------------------------
// Checkpoints that do not fit the model

class HfMismatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto config = DecoderConfigFromHfConfig(TestdataPath("hf_qwen3_tiny") + "/config.json");
    ASSERT_TRUE(config.ok()) << config.status();
    auto model = BuildDecoder(*config);
    ASSERT_TRUE(model.ok());
    model_ = *model;
    before_ = Snapshot(*model_);
    tensors_ = ReadAll(TestdataPath("hf_qwen3_tiny"));
    ASSERT_FALSE(tensors_.empty());
    dir_ = FreshTestDir();
  }

  at::Tensor& Find(const std::string& name) {
    for (auto& [key, tensor] : tensors_) {
      if (key == name) return tensor;
    }
    ADD_FAILURE() << "no tensor " << name;
    static at::Tensor none;
    return none;
  }

  // Writes tensors_ and loads them; returns the error message, checked to leave the model as
  // it was.
  std::string LoadError() {
    EXPECT_TRUE(WriteSafetensors(dir_ + "/model.safetensors", tensors_, {{"format", "pt"}}).ok());
    absl::Status status = LoadHfWeights(dir_, *model_);
    EXPECT_FALSE(status.ok());
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(dir_));
    ExpectUnchanged(*model_, before_);
    return std::string(status.message());
  }

  absl::Status Load() {
    EXPECT_TRUE(WriteSafetensors(dir_ + "/model.safetensors", tensors_).ok());
    return LoadHfWeights(dir_, *model_);
  }

  std::shared_ptr<DecoderLM> model_;
  std::map<std::string, at::Tensor> before_;
  Tensors tensors_;
  std::string dir_;
};

TEST_F(HfMismatchTest, ShapeMismatchNamesTheTensorAndBothShapes) {
  Find("model.layers.1.self_attn.k_proj.weight") = at::zeros({24, 32});
  EXPECT_THAT(LoadError(),
              AllOf(HasSubstr("1 problem;"), HasSubstr("'model.layers.1.self_attn.k_proj.weight'"),
                    HasSubstr("shape [24, 32] in the checkpoint"),
                    HasSubstr("the model's parameter has shape [16, 32]"),
                    HasSubstr("DecoderConfigFromHfConfig")));
}

TEST_F(HfMismatchTest, MissingTensorIsNamed) {
  tensors_.erase(tensors_.begin());  // sorted names: model.embed_tokens.weight
  EXPECT_THAT(LoadError(), AllOf(HasSubstr("'model.embed_tokens.weight' (the model's shape "
                                           "[64, 32]) is not in the checkpoint"),
                                 HasSubstr("model_type and sizes")));
}

TEST_F(HfMismatchTest, UnexpectedTensorIsNamedAndProblemsAreListedTogether) {
  tensors_.emplace_back("model.layers.2.mlp.up_proj.weight", at::zeros({64, 32}));
  tensors_.emplace_back("model.layers.0.self_attn.q_proj.bias", at::zeros({32}));
  EXPECT_THAT(LoadError(), AllOf(HasSubstr("2 problems"),
                                 HasSubstr("'model.layers.2.mlp.up_proj.weight' (shape [64, 32]"),
                                 HasSubstr("'model.layers.0.self_attn.q_proj.bias' (shape [32]"),
                                 HasSubstr("matches no parameter of the model")));
}

TEST_F(HfMismatchTest, NonFloatingDtypeIsAnError) {
  Find("model.norm.weight") = at::ones({32}, at::kInt);
  EXPECT_THAT(LoadError(), AllOf(HasSubstr("'model.norm.weight' has dtype Int"),
                                 HasSubstr("expected a floating dtype")));
}

TEST_F(HfMismatchTest, TiedHeadMayBeSavedWhenItEqualsTheEmbedding) {
  tensors_.emplace_back("lm_head.weight", Find("model.embed_tokens.weight").clone());
  tensors_.emplace_back("model.layers.0.self_attn.rotary_emb.inv_freq", at::ones({4}));
  ASSERT_TRUE(Load().ok());
  ExpectTransformersLogits(TestdataPath("hf_qwen3_tiny"), *model_);
}

TEST_F(HfMismatchTest, TiedHeadThatDiffersFromTheEmbeddingIsAnError) {
  tensors_.emplace_back("lm_head.weight", Find("model.embed_tokens.weight") + 1);
  EXPECT_THAT(LoadError(), AllOf(HasSubstr("'lm_head.weight' differs from"),
                                 HasSubstr("set tie_word_embeddings to false")));
}

// Strict loading against config.json, checksums and finite values.

// A config.json beside the weights that describes another model than model_: every field that
// differs is named with both values, and the q_norm tensors the model lacks point at qk_norm.
TEST_F(HfMismatchTest, ConfigJsonFieldsThatDifferAreNamedWithBothValues) {
  proto::DecoderConfig config = model_->config();
  config.set_rope_theta(500000);
  config.set_rms_norm_eps(1e-5);
  ASSERT_TRUE(WriteHfConfig(config, dir_ + "/config.json").ok());
  EXPECT_THAT(LoadError(),
              AllOf(HasSubstr("2 problems"),
                    HasSubstr("rope_theta is 500000 in config.json but 1000000 in the model"),
                    HasSubstr("rms_norm_eps is 1e-05 in config.json but 1e-06 in the model"),
                    HasSubstr("load_strict: false")));
}

TEST_F(HfMismatchTest, QkNormTensorsWithoutQkNormPointAtTheField) {
  proto::DecoderConfig without = model_->config();
  without.set_qk_norm(false);
  model_ = BuildDecoder(without).value();
  before_ = Snapshot(*model_);
  EXPECT_THAT(LoadError(),
              AllOf(HasSubstr("config fields that differ or probably differ: qk_norm"),
                    HasSubstr("'model.layers.0.self_attn.q_norm.weight' (shape [8]"),
                    HasSubstr("matches no parameter of the model (config field qk_norm "
                              "probably differs)")));

  // Not strict: the q_norm / k_norm tensors are left out, everything else loads.
  ASSERT_TRUE(WriteSafetensors(dir_ + "/model.safetensors", tensors_).ok());
  HfLoadOptions loose;
  loose.strict = false;
  ASSERT_TRUE(LoadHfWeights(dir_, *model_, loose).ok());
  for (const auto& item : model_->named_parameters()) {
    EXPECT_TRUE(item.value().equal(Find(item.key()).to(item.value().scalar_type()))) << item.key();
  }
}

TEST_F(HfMismatchTest, BiasesWithoutAttentionBiasPointAtTheField) {
  for (const std::string proj : {"q_proj", "k_proj", "v_proj"}) {
    const std::string name = absl::StrCat("model.layers.1.self_attn.", proj, ".weight");
    tensors_.emplace_back(absl::StrCat("model.layers.1.self_attn.", proj, ".bias"),
                          at::zeros({Find(name).size(0)}));
  }
  EXPECT_THAT(LoadError(),
              AllOf(HasSubstr("3 problems"), HasSubstr("'model.layers.1.self_attn.v_proj.bias'"),
                    HasSubstr("(config field attention_bias probably differs)")));
}

TEST_F(HfMismatchTest, DamagedBytesAndNonFiniteValuesAreRefused) {
  ASSERT_TRUE(WriteSafetensors(dir_ + "/model.safetensors", tensors_).ok());
  std::string bytes = ReadBytes(dir_ + "/model.safetensors");
  bytes[bytes.size() - 7] ^= 0x01;  // the last tensor's bytes
  WriteText(dir_ + "/model.safetensors", bytes);
  absl::Status damaged = LoadHfWeights(dir_, *model_);
  EXPECT_EQ(damaged.code(), absl::StatusCode::kDataLoss) << damaged;
  EXPECT_THAT(std::string(damaged.message()),
              AllOf(HasSubstr(dir_ + "/model.safetensors"), HasSubstr("checksum mismatch")));
  ExpectUnchanged(*model_, before_);

  Find("model.norm.weight")[3] = std::numeric_limits<float>::infinity();
  ASSERT_TRUE(WriteSafetensors(dir_ + "/model.safetensors", tensors_).ok());
  absl::Status infinite = LoadHfWeights(dir_, *model_);
  EXPECT_EQ(infinite.code(), absl::StatusCode::kDataLoss) << infinite;
  EXPECT_THAT(std::string(infinite.message()),
              AllOf(HasSubstr("tensor model.norm.weight holds 1 non-finite value (the first, inf, "
                              "in row 3)")));
  ExpectUnchanged(*model_, before_);
}

// ---------------------------------------------------------------------------------------------
// Writing config.json and model directories for transformers

// Equal as configs: a field set to its default equals the field unset.
void ExpectEquivalent(const proto::DecoderConfig& got, const proto::DecoderConfig& want) {
  google::protobuf::util::MessageDifferencer differencer;
  differencer.set_message_field_comparison(
      google::protobuf::util::MessageDifferencer::EQUIVALENT);
  std::string report;
  differencer.ReportDifferencesToString(&report);
  EXPECT_TRUE(differencer.Compare(want, got)) << report;
}

TEST(HfConfigTest, WrittenConfigReadsBackEqual) {
  const std::string dir = FreshTestDir();
  for (const std::string name : {"qwen3-0.6b", "llama3-8b", "tiny"}) {
    SCOPED_TRACE(name);
    proto::DecoderConfig config = NamedDecoderConfig(name).value();
    const std::string path = absl::StrCat(dir, "/", name, ".json");
    ASSERT_TRUE(WriteHfConfig(config, path).ok());
    auto read = DecoderConfigFromHfConfig(path);
    ASSERT_TRUE(read.ok()) << read.status();
    ExpectEquivalent(*read, config);
    // Values with no short decimal form come back exactly too.
    config.set_rms_norm_eps(1.0 / 3.0 * 1e-5);
    config.set_initializer_range(0.1 + 0.2);
    config.set_rope_theta(123456.789);
    config.set_attention_bias(!config.attention_bias());
    config.set_tie_word_embeddings(!config.tie_word_embeddings());
    ASSERT_TRUE(WriteHfConfig(config, path).ok());
    read = DecoderConfigFromHfConfig(path);
    ASSERT_TRUE(read.ok()) << read.status();
    ExpectEquivalent(*read, config);
  }
}

TEST(HfConfigTest, WritesTheArchitectureAndBothRopeForms) {
  const std::string qwen3 = HfConfigJson(NamedDecoderConfig("qwen3-0.6b").value());
  EXPECT_THAT(qwen3, AllOf(HasSubstr(R"("model_type": "qwen3")"),
                           HasSubstr(R"("architectures": ["Qwen3ForCausalLM"])"),
                           HasSubstr(R"("rope_theta": 1000000,)"),
                           HasSubstr(R"("rope_parameters": {"rope_theta": 1000000, )"
                                     R"("rope_type": "default"})"),
                           HasSubstr(R"("head_dim": 128)"), HasSubstr(R"("rms_norm_eps": 1e-06)")));
  const std::string llama = HfConfigJson(NamedDecoderConfig("llama3-8b").value());
  EXPECT_THAT(llama, AllOf(HasSubstr(R"("model_type": "llama")"),
                           HasSubstr(R"("architectures": ["LlamaForCausalLM"])"),
                           Not(HasSubstr("head_dim"))));
  proto::DecoderConfig invalid = NamedDecoderConfig("tiny").value();
  invalid.set_num_key_value_heads(3);
  EXPECT_FALSE(WriteHfConfig(invalid, FreshTestDir() + "/config.json").ok());
}

// Where ExportedModelLoadsBack writes: $CPPTRAIN_HF_EXPORT_DIR<suffix>, for
// tests/golden/check_hf_export.py to load into transformers, else under TEST_TMPDIR.
std::string ExportDir(const std::string& suffix) {
  const char* dir = std::getenv("CPPTRAIN_HF_EXPORT_DIR");
  const std::string path = dir != nullptr && *dir != '\0' ? absl::StrCat(dir, suffix)
                                                          : FreshTestDir() + "/export" + suffix;
  EXPECT_TRUE(RemoveTree(path).ok());
  std::filesystem::create_directories(path);
  return path;
}

// Writes the model built from `config` as a Hugging Face directory with its own logits
// (expected_logits.safetensors, as gen_hf_golden.py writes them), then loads it back.
void ExportAndReload(const proto::DecoderConfig& config, const std::string& dir) {
  torch::manual_seed(1234);
  auto model = BuildDecoder(config);
  ASSERT_TRUE(model.ok()) << model.status();
  Tensors weights;
  for (const auto& item : (*model)->named_parameters()) {
    weights.emplace_back(item.key(), item.value().detach());
  }
  // A tied head is saved once, as the embedding (DecoderLM does not register it).
  EXPECT_EQ(std::count_if(weights.begin(), weights.end(),
                          [](const auto& w) { return w.first == "lm_head.weight"; }),
            config.tie_word_embeddings() ? 0 : 1);
  ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", weights, {{"format", "pt"}}).ok());
  ASSERT_TRUE(WriteHfModelConfigs(config, dir).ok());
  EXPECT_TRUE(std::filesystem::exists(dir + "/generation_config.json"));
  const at::Tensor input_ids =
      at::tensor({1, 5, 9, 13, 2, 7, 3, 3, 8, 1, 60, 4}, at::kLong).reshape({2, 6});
  at::NoGradGuard no_grad;
  const at::Tensor logits = (*model)->Logits(input_ids).contiguous();
  ASSERT_TRUE(WriteSafetensors(dir + "/expected_logits.safetensors",
                               {{"input_ids", input_ids}, {"logits", logits}}, {{"format", "pt"}})
                  .ok());

  auto loaded = LoadHfDecoderForTest(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectEquivalent((*loaded)->config(), config);
  EXPECT_EQ((*loaded)->named_parameters().size(), weights.size());
  const Expected expected = ReadExpected(dir);
  ASSERT_TRUE(expected.logits.defined());
  EXPECT_TRUE(at::equal((*loaded)->Logits(expected.input_ids), expected.logits));
  EXPECT_GT(expected.logits.std().item<double>(), 0.1);
}

TEST(HfExportTest, TiedQwen3ModelLoadsBackWithTheSameLogits) {
  const proto::DecoderConfig config = NamedDecoderConfig("tiny").value();
  ASSERT_TRUE(config.qk_norm() && config.tie_word_embeddings());
  ExportAndReload(config, ExportDir(""));
}

TEST(HfExportTest, UntiedLlamaModelWithBiasesLoadsBackWithTheSameLogits) {
  proto::DecoderConfig config = NamedDecoderConfig("tiny").value();
  config.set_qk_norm(false);
  config.set_tie_word_embeddings(false);
  config.set_attention_bias(true);
  config.clear_head_dim();  // hidden / heads = 8
  config.set_rope_theta(500000);
  config.set_rms_norm_eps(1e-5);
  ExportAndReload(config, ExportDir("_llama"));
}

TEST(HfExportTest, Llama3RopeModelWithTokenIdsLoadsBackWithTheSameLogits) {
  proto::DecoderConfig config = NamedDecoderConfig("tiny").value();
  config.set_qk_norm(false);
  config.set_tie_word_embeddings(false);
  config.clear_head_dim();
  proto::RopeScaling& rope = *config.mutable_rope_scaling();
  rope.set_rope_type("llama3");
  rope.set_factor(8);
  rope.set_low_freq_factor(1);
  rope.set_high_freq_factor(4);
  rope.set_original_max_position_embeddings(64);
  config.set_bos_token_id(1);
  config.add_eos_token_id(2);
  config.set_pad_token_id(0);
  const std::string dir = ExportDir("_llama3");
  ExportAndReload(config, dir);
  EXPECT_THAT(ReadBytes(dir + "/generation_config.json"),
              AllOf(HasSubstr(R"("bos_token_id": 1)"), HasSubstr(R"("eos_token_id": 2)"),
                    HasSubstr(R"("pad_token_id": 0)")));
}

TEST_F(HfMismatchTest, MissingDirectory) {
  absl::Status status = LoadHfWeights(dir_ + "/nothing", *model_);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
}

}  // namespace
}  // namespace cpptrain
