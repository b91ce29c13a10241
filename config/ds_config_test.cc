#include "config/ds_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "config/training_args.h"

namespace cpptrain {
namespace {

using proto::TrainingArguments;
using proto::ZeroConfig;
using ::testing::AllOf;
using ::testing::HasSubstr;

// Converts `json`, writes the job textproto with a model and data appended (what a user adds)
// and loads it through config/ as //tools:train does, validation included.
proto::TrainJob ConvertAndLoad(const std::string& json, const std::string& name,
                               std::string* text_out = nullptr) {
  absl::StatusOr<DeepSpeedConversion> c = ConvertDeepSpeedConfig(json, name);
  EXPECT_TRUE(c.ok()) << c.status();
  if (!c.ok()) return {};
  const std::string text = DeepSpeedConversionText(*c, name, nullptr) +
                           "model { name: \"demo\" }\ndata { builtin: \"arithmetic\" }\n";
  if (text_out != nullptr) *text_out = text;
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = absl::StrCat(tmp ? tmp : "/tmp", "/", name, ".textproto");
  std::ofstream(path) << text;
  absl::StatusOr<proto::TrainJob> job = LoadTrainJob(path, {});
  EXPECT_TRUE(job.ok()) << job.status() << "\n" << text;
  return job.ok() ? *job : proto::TrainJob();
}

std::string ErrorOf(const std::string& json) {
  absl::StatusOr<DeepSpeedConversion> c = ConvertDeepSpeedConfig(json, "ds.json");
  EXPECT_FALSE(c.ok()) << "converted:\n"
                       << (c.ok() ? DeepSpeedConversionText(*c, "", nullptr) : "");
  return c.ok() ? "" : std::string(c.status().message());
}

// Hugging Face's ZeRO-1 template: nearly everything "auto".
TEST(DeepSpeedConfigTest, Zero1AutoValuesStayUnset) {
  std::string text;
  const proto::TrainJob job = ConvertAndLoad(R"({
    "fp16": {"enabled": "auto"},
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                              "weight_decay": "auto"}},
    "zero_optimization": {"stage": 1},
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "steps_per_print": 2000,
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "wall_clock_breakdown": false
  })",
                                             "zero1", &text);
  const TrainingArguments& args = job.args();
  ASSERT_TRUE(args.has_zero());
  EXPECT_EQ(args.zero().stage(), 1);
  EXPECT_FALSE(args.has_learning_rate());
  EXPECT_FALSE(args.has_per_device_train_batch_size());
  EXPECT_FALSE(args.has_max_grad_norm());
  EXPECT_FALSE(args.has_bf16());
  EXPECT_THAT(text, AllOf(HasSubstr("# optimizer.params.lr = \"auto\": left unset"),
                          HasSubstr("# steps_per_print = 2000 is dropped"),
                          HasSubstr("# train_batch_size = \"auto\": left unset")));
}

TEST(DeepSpeedConfigTest, Zero2WithOptimizerOffloadAndWarmupDecay) {
  const proto::TrainJob job = ConvertAndLoad(R"({
    "bf16": {"enabled": true},
    "optimizer": {"type": "AdamW",
                  "params": {"lr": 2e-5, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupDecayLR",
                  "params": {"warmup_min_lr": 0, "warmup_max_lr": 3e-5, "warmup_num_steps": 100,
                             "total_num_steps": 1000, "warmup_type": "linear"}},
    "zero_optimization": {
      "stage": 2,
      "offload_optimizer": {"device": "cpu", "pin_memory": true},
      "allgather_partitions": true,
      "allgather_bucket_size": 2e8,
      "overlap_comm": true,
      "reduce_scatter": true,
      "reduce_bucket_size": 2e8,
      "contiguous_gradients": true,
      "round_robin_gradients": true
    },
    "gradient_accumulation_steps": 4,
    "gradient_clipping": 1.0,
    "train_batch_size": 64,
    "train_micro_batch_size_per_gpu": 2
  })",
                                             "zero2");
  const TrainingArguments& args = job.args();
  const ZeroConfig& z = args.zero();
  EXPECT_EQ(z.stage(), 2);
  EXPECT_EQ(z.offload_optimizer_device(), ZeroConfig::CPU);
  EXPECT_TRUE(z.offload_optimizer_pin_memory());
  EXPECT_EQ(z.offload_param_device(), ZeroConfig::NONE);
  EXPECT_EQ(z.allgather_bucket_size(), 200000000);
  EXPECT_EQ(z.reduce_bucket_size(), 200000000);
  EXPECT_TRUE(z.round_robin_gradients());
  EXPECT_TRUE(args.bf16());
  EXPECT_FALSE(args.fp16());
  EXPECT_DOUBLE_EQ(args.learning_rate(), 3e-5);  // the scheduler's peak wins, as in DeepSpeed
  EXPECT_DOUBLE_EQ(args.adam_beta2(), 0.95);
  EXPECT_DOUBLE_EQ(args.weight_decay(), 0.1);
  EXPECT_EQ(args.lr_scheduler_type(), TrainingArguments::LINEAR);
  EXPECT_DOUBLE_EQ(args.warmup_steps(), 100);
  EXPECT_EQ(args.max_steps(), 1000);
  EXPECT_EQ(args.per_device_train_batch_size(), 2);
  EXPECT_EQ(args.gradient_accumulation_steps(), 4);
  EXPECT_DOUBLE_EQ(args.max_grad_norm(), 1.0);
}

TEST(DeepSpeedConfigTest, Zero3WithParameterOffloadAndWarmupCosine) {
  std::string text;
  const proto::TrainJob job = ConvertAndLoad(R"({
    "bf16": {"enabled": true},
    "scheduler": {"type": "WarmupCosineLR",
                  "params": {"total_num_steps": 500, "warmup_num_steps": 50,
                             "warmup_min_ratio": 0.1, "cos_min_ratio": 0.01}},
    "zero_optimization": {
      "stage": 3,
      "offload_optimizer": {"device": "cpu", "pin_memory": true},
      "offload_param": {"device": "cpu", "pin_memory": false},
      "overlap_comm": true,
      "contiguous_gradients": true,
      "sub_group_size": 1e9,
      "reduce_bucket_size": "auto",
      "stage3_prefetch_bucket_size": 4.5e7,
      "stage3_param_persistence_threshold": 1e4,
      "stage3_max_live_parameters": 1e9,
      "stage3_max_reuse_distance": 1e9,
      "stage3_gather_16bit_weights_on_model_save": true
    },
    "gradient_clipping": 0.5,
    "train_micro_batch_size_per_gpu": 1
  })",
                                             "zero3", &text);
  const TrainingArguments& args = job.args();
  const ZeroConfig& z = args.zero();
  EXPECT_EQ(z.stage(), 3);
  EXPECT_EQ(z.offload_param_device(), ZeroConfig::CPU);
  EXPECT_FALSE(z.offload_param_pin_memory());
  EXPECT_EQ(z.offload_optimizer_device(), ZeroConfig::CPU);
  EXPECT_FALSE(z.has_reduce_bucket_size());  // "auto"
  EXPECT_EQ(z.stage3_prefetch_bucket_size(), 45000000);
  EXPECT_EQ(z.stage3_param_persistence_threshold(), 10000);
  EXPECT_EQ(z.stage3_max_live_parameters(), 1000000000);
  EXPECT_TRUE(z.stage3_gather_16bit_weights_on_model_save());
  EXPECT_EQ(args.lr_scheduler_type(), TrainingArguments::COSINE_WARMUP_WITH_MIN_LR);
  EXPECT_DOUBLE_EQ(args.lr_scheduler_kwargs().warmup_lr_rate(), 0.1);
  EXPECT_DOUBLE_EQ(args.lr_scheduler_kwargs().min_lr_rate(), 0.01);
  EXPECT_EQ(args.max_steps(), 500);
  EXPECT_DOUBLE_EQ(args.max_grad_norm(), 0.5);
  EXPECT_THAT(text, AllOf(HasSubstr("# zero_optimization.sub_group_size = 1e+09 is dropped"),
                          HasSubstr("warmup_type is unset: DeepSpeed's default is \"log\"")));
}

TEST(DeepSpeedConfigTest, Fp16LossScaleKeysGoToZero) {
  const proto::TrainJob job = ConvertAndLoad(R"({
    "fp16": {"enabled": true, "loss_scale": 0, "loss_scale_window": 500,
             "initial_scale_power": 12, "hysteresis": 4, "min_loss_scale": 0.5},
    "zero_optimization": {"stage": 2, "cpu_offload": true},
    "optimizer": {"type": "Adam", "params": {"lr": 1e-4, "weight_decay": 0.0}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 1e-4,
                                                 "warmup_num_steps": 10}}
  })",
                                             "fp16");
  const TrainingArguments& args = job.args();
  const ZeroConfig& z = args.zero();
  EXPECT_TRUE(args.fp16());
  EXPECT_DOUBLE_EQ(z.loss_scale(), 0);
  EXPECT_EQ(z.loss_scale_window(), 500);
  EXPECT_EQ(z.initial_scale_power(), 12);
  EXPECT_EQ(z.hysteresis(), 4);
  EXPECT_DOUBLE_EQ(z.min_loss_scale(), 0.5);
  EXPECT_EQ(z.offload_optimizer_device(), ZeroConfig::CPU);
  EXPECT_EQ(args.lr_scheduler_type(), TrainingArguments::CONSTANT_WITH_WARMUP);
  EXPECT_DOUBLE_EQ(args.warmup_steps(), 10);
}

TEST(DeepSpeedConfigTest, BaseJobKeepsItsFieldsAndLosesItsEngine) {
  absl::StatusOr<DeepSpeedConversion> c = ConvertDeepSpeedConfig(
      R"({"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 4})", "ds.json");
  ASSERT_TRUE(c.ok()) << c.status();
  proto::TrainJob base;
  base.mutable_args()->set_learning_rate(0.5);
  base.mutable_args()->set_per_device_train_batch_size(16);
  base.mutable_args()->mutable_ddp();
  base.mutable_model()->set_name("demo");
  const std::string text = DeepSpeedConversionText(*c, "ds.json", &base);
  EXPECT_THAT(text,
              AllOf(HasSubstr("learning_rate: 0.5"), HasSubstr("per_device_train_batch_size: 4"),
                    HasSubstr("stage: 2"), HasSubstr("name: \"demo\"")));
  EXPECT_THAT(text, ::testing::Not(HasSubstr("ddp")));
}

TEST(DeepSpeedConfigTest, ErrorsNameTheKeyPathAndTheFix) {
  EXPECT_THAT(ErrorOf(R"({"zero_optimization": {"stage": 2, "overlap_com": true}})"),
              AllOf(HasSubstr("zero_optimization.overlap_com = true"),
                    HasSubstr("not a key the ZeRO engine supports"), HasSubstr("overlap_comm")));
  EXPECT_THAT(ErrorOf(R"({"zero_optimization": {"stage": 3,
                          "offload_param": {"device": "nvme", "nvme_path": "/nvme"}}})"),
              AllOf(HasSubstr("zero_optimization.offload_param.device = \"nvme\""),
                    HasSubstr("use \"cpu\"")));
  EXPECT_THAT(ErrorOf(R"({"zero_optimization": {"stage": 0}})"),
              AllOf(HasSubstr("zero_optimization.stage = 0"), HasSubstr("ddp")));
  EXPECT_THAT(ErrorOf(R"({"train_micro_batch_size_per_gpu": 2})"),
              HasSubstr("zero_optimization is missing"));
  EXPECT_THAT(ErrorOf(R"({"zero_optimization": {"stage": 1},
                          "optimizer": {"type": "Lamb", "params": {"lr": 1e-3}}})"),
              AllOf(HasSubstr("optimizer.type = \"Lamb\""), HasSubstr("AdamW")));
  EXPECT_THAT(ErrorOf(R"({"zero_optimization": {"stage": 1},
                          "scheduler": {"type": "OneCycle", "params": {}}})"),
              AllOf(HasSubstr("scheduler.type = \"OneCycle\""), HasSubstr("WarmupLR")));
  EXPECT_THAT(ErrorOf(R"({"zero_optimization": {"stage": 1}, "train_batch_size": 30,
                          "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2})"),
              AllOf(HasSubstr("train_batch_size = 30"), HasSubstr("multiple of")));
  EXPECT_THAT(ErrorOf(R"({"zero_optimization": {"stage": "two"}})"),
              AllOf(HasSubstr("zero_optimization.stage = \"two\""), HasSubstr("integer")));
  EXPECT_THAT(ErrorOf(R"({"zero_optimization": {"stage": 1},
                          "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 1e-6}}})"),
              HasSubstr("scheduler.params.warmup_min_lr = 1e-06"));
  EXPECT_THAT(ErrorOf(R"({"zero_optimization": {"stage": 1}, "amp": {"enabled": true}})"),
              HasSubstr("amp = {"));
  EXPECT_THAT(ErrorOf("{\"zero_optimization\": {\"stage\": 1},}"), HasSubstr("not valid JSON"));
}

TEST(DeepSpeedConfigTest, ValidationOfTheLoadedJobStillApplies) {
  // The converter maps what it reads; the engine's own rules reject the combination.
  absl::StatusOr<DeepSpeedConversion> c = ConvertDeepSpeedConfig(
      R"({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})", "ds.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(ValidateTrainingArguments(c->args).ok());
}

}  // namespace
}  // namespace cpptrain
