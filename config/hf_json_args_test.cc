#include "config/hf_json_args.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "config/training_args.h"
#include "proto/job.pb.h"
#include "proto/training_args.pb.h"

namespace cpptrain {
namespace {

using proto::AcceleratorConfig;
using proto::FsdpConfig;
using proto::TrainingArguments;
using proto::ZeroConfig;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Hugging Face's documented samples (config/testdata/hf/README.md), from the runfiles root.
const char kDir[] = "config/testdata/hf/";

std::string Sample(const char* name) { return absl::StrCat(kDir, name); }

TrainingArguments Load(const std::vector<std::string>& overrides) {
  absl::StatusOr<TrainingArguments> args = LoadTrainingArguments("", overrides);
  EXPECT_TRUE(args.ok()) << args.status();
  return args.ok() ? *args : TrainingArguments();
}

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
  std::ofstream(path) << text;
  return path;
}

TEST(HfJsonArgsTest, DeepSpeedZero2SampleLeavesAutoToTheTrainingArguments) {
  absl::StatusOr<HfJsonTranslation> t =
      TranslateHfJsonArgument("deepspeed", Sample("ds_config_zero2.json"));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_THAT(t->notes, Contains(HasSubstr("optimizer.params.lr = \"auto\"")));
  const TrainingArguments args =
      Load({"learning_rate=0.003", "warmup_steps=2", "max_grad_norm=0.5",
            "per_device_train_batch_size=3", "gradient_accumulation_steps=2",
            absl::StrCat("deepspeed=", Sample("ds_config_zero2.json"))});
  ASSERT_TRUE(args.has_zero());
  EXPECT_EQ(args.zero().stage(), 2);
  EXPECT_EQ(args.zero().offload_optimizer_device(), ZeroConfig::CPU);
  EXPECT_EQ(args.zero().reduce_bucket_size(), 200000000);
  // "auto": the training arguments' values, as Hugging Face fills them in.
  EXPECT_DOUBLE_EQ(args.learning_rate(), 0.003);
  EXPECT_DOUBLE_EQ(args.warmup_steps(), 2);
  EXPECT_DOUBLE_EQ(args.max_grad_norm(), 0.5);
  EXPECT_EQ(args.per_device_train_batch_size(), 3);
  EXPECT_EQ(args.gradient_accumulation_steps(), 2);
  EXPECT_FALSE(args.fp16());
  // WarmupLR is Hugging Face's constant_with_warmup.
  EXPECT_EQ(args.lr_scheduler_type(), TrainingArguments::CONSTANT_WITH_WARMUP);
}

TEST(HfJsonArgsTest, DeepSpeedZero3SampleOffloadsParameters) {
  const TrainingArguments args = Load({absl::StrCat("deepspeed=", Sample("ds_config_zero3.json"))});
  ASSERT_TRUE(args.has_zero());
  EXPECT_EQ(args.zero().stage(), 3);
  EXPECT_EQ(args.zero().offload_param_device(), ZeroConfig::CPU);
  EXPECT_EQ(args.zero().offload_optimizer_device(), ZeroConfig::CPU);
  EXPECT_TRUE(args.zero().stage3_gather_16bit_weights_on_model_save());
  // "auto" bucket sizes keep the engine's defaults (transformers derives them from hidden_size).
  EXPECT_EQ(args.zero().reduce_bucket_size(), ZeroConfig().reduce_bucket_size());
}

TEST(HfJsonArgsTest, DeepSpeedInlineValuesThatAreNotAutoAreApplied) {
  const TrainingArguments args = Load(
      {R"(deepspeed={"zero_optimization": {"stage": 1}, "gradient_clipping": 0.25,
          "optimizer": {"type": "AdamW", "params": {"lr": 0.5, "betas": "auto"}}})"});
  EXPECT_EQ(args.zero().stage(), 1);
  EXPECT_DOUBLE_EQ(args.max_grad_norm(), 0.25);
  EXPECT_DOUBLE_EQ(args.learning_rate(), 0.5);
}

TEST(HfJsonArgsTest, FsdpSampleMapsEveryKey) {
  const TrainingArguments args = Load({absl::StrCat("fsdp_config=", Sample("fsdp_config.json"))});
  ASSERT_TRUE(args.has_fsdp());
  const FsdpConfig& f = args.fsdp();
  EXPECT_EQ(f.version(), 2);
  EXPECT_TRUE(f.has_reshard_after_forward());
  EXPECT_TRUE(f.reshard_after_forward());
  EXPECT_FALSE(f.offload_params());
  EXPECT_EQ(f.auto_wrap_policy(), FsdpConfig::TRANSFORMER_BASED_WRAP);
  EXPECT_THAT(f.transformer_layer_cls_to_wrap(), ElementsAre("LlamaDecoderLayer"));
  EXPECT_EQ(f.state_dict_type(), FsdpConfig::FULL_STATE_DICT);
  EXPECT_TRUE(f.cpu_ram_efficient_loading());
  EXPECT_TRUE(f.activation_checkpointing());
}

TEST(HfJsonArgsTest, FsdpKeysWithThePrefixAndTransformersNames) {
  const TrainingArguments args = Load(
      {R"(fsdp_config={"fsdp_version": 1, "fsdp_reshard_after_forward": "SHARD_GRAD_OP",
          "cpu_offload": true, "fsdp_transformer_layer_cls_to_wrap": "LlamaDecoderLayer",
          "limit_all_gathers": false, "xla": false})"});
  const FsdpConfig& f = args.fsdp();
  EXPECT_EQ(f.version(), 1);
  EXPECT_EQ(f.sharding_strategy(), FsdpConfig::SHARD_GRAD_OP);
  EXPECT_TRUE(f.offload_params());
  EXPECT_FALSE(f.limit_all_gathers());
  EXPECT_THAT(f.transformer_layer_cls_to_wrap(), ElementsAre("LlamaDecoderLayer"));
}

TEST(HfJsonArgsTest, FsdpWithoutVersionKeepsTheStringFormsVersion) {
  const TrainingArguments args = Load(
      {"fsdp=full_shard auto_wrap", R"(fsdp_config={"backward_prefetch": "BACKWARD_POST"})"});
  EXPECT_EQ(args.fsdp().version(), 1);  // the string form's FSDP1
  EXPECT_EQ(args.fsdp().auto_wrap_policy(), FsdpConfig::TRANSFORMER_BASED_WRAP);
  EXPECT_EQ(args.fsdp().backward_prefetch(), FsdpConfig::BACKWARD_POST);
}

TEST(HfJsonArgsTest, FsdpTrueIsFsdpWithTheDefaults) {
  const TrainingArguments args =
      Load({"fsdp=true", absl::StrCat("fsdp_config=", Sample("fsdp_config.json"))});
  EXPECT_EQ(args.fsdp().version(), 2);
  EXPECT_TRUE(args.fsdp().activation_checkpointing());
  EXPECT_FALSE(Load({"fsdp=false"}).has_fsdp());
}

TEST(HfJsonArgsTest, UnknownOrUnsupportedKeysAreErrorsNamingThem) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"(fsdp_config={"transformer_layer_cls_to_warp": ["X"]})", "transformer_layer_cls_to_warp"},
      {R"(fsdp_config={"xla": true})", "PyTorch/XLA FSDP is not implemented"},
      {R"(accelerator_config={"split_batch": true})", "split_batch = true: not a key"},
      {R"(accelerator_config={"use_configured_state": true})", "use_configured_state = true"},
      {R"(accelerator_config={"gradient_accumulation_kwargs": {"sync_with_dataloader": false}})",
       "gradient_accumulation_kwargs.sync_with_dataloader = false"},
      {R"(deepspeed={"zero_optimization": {"stage": 2, "stage_typo": 1}})",
       "zero_optimization.stage_typo"},
      {"deepspeed=no/such/ds.json", "deepspeed=\"no/such/ds.json\": the file cannot be read"},
      {"fsdp_config={\"version\": ", "fsdp_config=fsdp_config (inline JSON): not valid JSON"},
  };
  for (const auto& [assignment, expected] : cases) {
    absl::StatusOr<TrainingArguments> args = LoadTrainingArguments("", {assignment});
    ASSERT_FALSE(args.ok()) << assignment;
    EXPECT_THAT(std::string(args.status().message()), HasSubstr(expected)) << assignment;
  }
}

TEST(HfJsonArgsTest, AcceleratorSampleAndOurTextFormStillWork) {
  TrainingArguments args =
      Load({absl::StrCat("accelerator_config=", Sample("accelerator_config.json"))});
  EXPECT_EQ(args.accelerator_config().gradient_accumulation_kwargs().num_steps(), 2);
  EXPECT_TRUE(args.accelerator_config().even_batches());
  EXPECT_FALSE(args.accelerator_config().has_dispatch_batches());
  args = Load({"accelerator_config={split_batches: true}"});
  EXPECT_TRUE(args.accelerator_config().split_batches());
  args = Load({R"(accelerator_config={"non_blocking": true})"});
  EXPECT_TRUE(args.accelerator_config().non_blocking());
}

TEST(HfJsonArgsTest, InAConfigFileAndTheConflictRule) {
  const std::string ok = WriteFile(
      "ok.textproto", absl::StrCat("learning_rate: 0.002\ndeepspeed: \"", Sample("ds_config_zero2.json"),
                                   "\"\naccelerator_config: '{\"even_batches\": false}'\n"
                                   "fsdp_config: \"\"\n"));
  absl::StatusOr<TrainingArguments> args = LoadTrainingArguments(ok, {});
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(args->zero().stage(), 2);
  EXPECT_DOUBLE_EQ(args->learning_rate(), 0.002);
  EXPECT_FALSE(args->accelerator_config().even_batches());

  // The JSON sets what the same file sets to another value: an error naming both.
  const std::string clash = WriteFile(
      "clash.textproto",
      "max_grad_norm: 2\ndeepspeed: '{\"zero_optimization\": {\"stage\": 1}, "
      "\"gradient_clipping\": 1.0}'\n");
  args = LoadTrainingArguments(clash, {});
  ASSERT_FALSE(args.ok());
  EXPECT_THAT(std::string(args.status().message()),
              HasSubstr("(deepspeed) sets max_grad_norm=1, but the file also sets max_grad_norm"));
}

TEST(HfJsonArgsTest, TrainJobsTakeThemUnderArgs) {
  const std::string job = WriteFile(
      "job.textproto",
      absl::StrCat("args {\n  fsdp: true\n  fsdp_config: \"", Sample("fsdp_config.json"),
                   "\"\n  accelerator_config { split_batches: false }\n}\n"
                   "model { name: \"demo\" }\ndata { builtin: \"arithmetic\" seq_len: 16 }\n"));
  absl::StatusOr<proto::TrainJob> loaded = LoadTrainJob(
      job, {absl::StrCat("args.accelerator_config=", Sample("accelerator_config.json"))});
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->args().fsdp().version(), 2);
  EXPECT_THAT(loaded->args().fsdp().transformer_layer_cls_to_wrap(),
              ElementsAre("LlamaDecoderLayer"));
  EXPECT_EQ(loaded->args().accelerator_config().gradient_accumulation_kwargs().num_steps(), 2);
}

TEST(HfJsonArgsTest, HfJsonValueTellsPathsAndJsonFromOurTextFormat) {
  EXPECT_TRUE(IsHfJsonValue("ds.json"));
  EXPECT_TRUE(IsHfJsonValue("'{\"split_batches\": true}'"));
  EXPECT_TRUE(IsHfJsonValue("{ \"split_batches\": true}"));
  EXPECT_FALSE(IsHfJsonValue("{split_batches: true}"));
  EXPECT_FALSE(IsHfJsonValue(""));
}

}  // namespace
}  // namespace cpptrain
