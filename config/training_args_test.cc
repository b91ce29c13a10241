#include "config/training_args.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "config/text_proto.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "gtest/gtest.h"

namespace cpptrain {
namespace {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::string EnvOrEmpty(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

std::string FixturePath() {
  return absl::StrCat(EnvOrEmpty("TEST_SRCDIR"), "/", EnvOrEmpty("TEST_WORKSPACE"),
                      "/config/testdata/full.textproto");
}

proto::TrainingArguments Args(const std::string& text) {
  proto::TrainingArguments args;
  absl::Status status = ParseTextProto(text, "test", &args);
  EXPECT_TRUE(status.ok()) << status;
  return args;
}

// The validation error of `text`; fails the test when it validates.
std::string Problems(const std::string& text) {
  absl::Status status = ValidateTrainingArguments(Args(text));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << text;
  return std::string(status.message());
}

void ExpectValid(const std::string& text) {
  absl::Status status = ValidateTrainingArguments(Args(text));
  EXPECT_TRUE(status.ok()) << text << "\n" << status;
}

// ---------------------------------------------------------------------------------------
// Whole configs.

TEST(ValidateTrainingArgumentsTest, DefaultsAreValid) { ExpectValid(""); }

TEST(ValidateTrainingArgumentsTest, ValidConfigWithManyFieldsPasses) {
  ExpectValid(R"pb(
    output_dir: "/tmp/run"
    per_device_train_batch_size: 4
    per_device_eval_batch_size: 16
    gradient_accumulation_steps: 8
    num_train_epochs: 1.5
    learning_rate: 1e-3
    lr_scheduler_type: WARMUP_STABLE_DECAY
    lr_scheduler_kwargs { num_stable_steps: 100 num_decay_steps: 50 decay_type: "1-sqrt" }
    warmup_steps: 0.1
    weight_decay: 0.01
    adam_beta2: 0.98
    max_grad_norm: 0
    logging_steps: 0.01
    eval_strategy: STEPS
    eval_steps: 0.1
    save_strategy: STEPS
    save_steps: 0.2
    save_total_limit: 1
    load_best_model_at_end: true
    metric_for_best_model: "accuracy"
    greater_is_better: true
    fp16: true
    auto_find_batch_size: true
    dataloader_num_workers: 4
    dataloader_prefetch_factor: 2
    dataloader_persistent_workers: true
    accelerator_config { split_batches: true non_blocking: true }
    zero { stage: 2 offload_optimizer_device: CPU }
  )pb");
}

TEST(ValidateTrainingArgumentsTest, FullFixturePasses) {
  absl::StatusOr<proto::TrainJob> job = LoadTrainJob(FixturePath(), {});
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->args().per_device_train_batch_size(), 16);
}

TEST(ValidateTrainingArgumentsTest, CollectsEveryProblemOneLineEach) {
  const std::string message = Problems(R"pb(
    fp16: true
    bf16: true
    learning_rate: -1
    per_device_train_batch_size: 0
    zero { stage: 7 }
  )pb");
  EXPECT_THAT(message,
              AllOf(HasSubstr("(4 problems)"), HasSubstr("\n  fp16=true"),
                    HasSubstr("\n  learning_rate=-1"),
                    HasSubstr("\n  per_device_train_batch_size=0"), HasSubstr("\n  zero.stage=7")));
}

// ---------------------------------------------------------------------------------------
// Warnings.

TEST(WarningsTest, DefaultsHaveNone) {
  EXPECT_THAT(TrainingArgumentsWarnings(Args("")), IsEmpty());
}

// Recomputation runs inside each unit after its backward gather, whichever flag asks for it:
// no extra all-gather, so no warning.
TEST(WarningsTest, GradientCheckpointingWithFullShardWarnsNothing) {
  EXPECT_THAT(TrainingArgumentsWarnings(Args("gradient_checkpointing: true fsdp {}")), IsEmpty());
  EXPECT_THAT(TrainingArgumentsWarnings(Args("gradient_checkpointing: true fsdp { version: 1 "
                                             "sharding_strategy: HYBRID_SHARD }")),
              IsEmpty());
}

TEST(WarningsTest, NonBlockingWithoutPinMemory) {
  EXPECT_THAT(
      TrainingArgumentsWarnings(
          Args("dataloader_pin_memory: false accelerator_config { non_blocking: true }")),
      Contains(AllOf(HasSubstr("non_blocking=true"), HasSubstr("dataloader_pin_memory=false"))));
  EXPECT_THAT(TrainingArgumentsWarnings(Args("accelerator_config { non_blocking: true }")),
              IsEmpty());
}

TEST(WarningsTest, LoadBestWithoutEvaluation) {
  EXPECT_THAT(TrainingArgumentsWarnings(Args("load_best_model_at_end: true save_strategy: NO")),
              Contains(HasSubstr("eval_strategy=NO")));
}

TEST(WarningsTest, Fsdp1KeysIgnoredByFsdp2) {
  EXPECT_THAT(TrainingArgumentsWarnings(Args("fsdp { limit_all_gathers: false }")),
              Contains(HasSubstr("fsdp.limit_all_gathers")));
  // FSDP2 honours backward_prefetch (NO_PREFETCH turns it off).
  EXPECT_THAT(TrainingArgumentsWarnings(Args("fsdp { backward_prefetch: NO_PREFETCH }")),
              IsEmpty());
}

TEST(WarningsTest, SizeBasedWrapWithoutThreshold) {
  EXPECT_THAT(TrainingArgumentsWarnings(Args("fsdp { auto_wrap_policy: SIZE_BASED_WRAP }")),
              Contains(HasSubstr("min_num_params=0")));
}

// ---------------------------------------------------------------------------------------
// World-size checks.

TEST(ValidateForWorldTest, SplitBatchesNeedsDivisibleBatch) {
  const proto::TrainingArguments args =
      Args("per_device_train_batch_size: 6 accelerator_config { split_batches: true }");
  const std::string four = std::string(ValidateForWorld(args, 4).message());
  EXPECT_THAT(four, AllOf(HasSubstr("per_device_train_batch_size=6"), HasSubstr("round multiple"),
                          HasSubstr("number of processes (4)"), HasSubstr("(1 problem)")));
  EXPECT_THAT(std::string(ValidateForWorld(args, 3).message()),
              AllOf(HasSubstr("per_device_eval_batch_size=8"), HasSubstr("(1 problem)")));
  EXPECT_TRUE(ValidateForWorld(args, 2).ok());
  EXPECT_TRUE(ValidateForWorld(Args("per_device_train_batch_size: 6"), 4).ok());
}

TEST(ValidateForWorldTest, FsdpMeshMustCoverWorld) {
  const proto::TrainingArguments args = Args("fsdp { dp_replicate_size: 2 dp_shard_size: 4 }");
  EXPECT_TRUE(ValidateForWorld(args, 8).ok());
  absl::Status status = ValidateForWorld(args, 6);
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(status.message(), AllOf(HasSubstr("dp_replicate_size=2"),
                                      HasSubstr("dp_shard_size=4"), HasSubstr("world size 6")));
}

TEST(ValidateForWorldTest, ReplicateSizeMustDivideWorld) {
  const proto::TrainingArguments args = Args("fsdp { dp_replicate_size: 3 }");
  EXPECT_TRUE(ValidateForWorld(args, 6).ok());
  EXPECT_THAT(ValidateForWorld(args, 4).message(),
              AllOf(HasSubstr("dp_replicate_size=3"), HasSubstr("world size 4")));
}

TEST(ValidateForWorldTest, WorldSizeMustBePositive) {
  EXPECT_THAT(ValidateForWorld(Args(""), 0).message(), HasSubstr("world_size=0"));
}

// ---------------------------------------------------------------------------------------
// Resolution helpers.

TEST(ResolveTest, EvalStepsFallBackToLoggingSteps) {
  EXPECT_DOUBLE_EQ(ResolvedEvalSteps(Args("logging_steps: 20")), 20);
  EXPECT_DOUBLE_EQ(ResolvedEvalSteps(Args("logging_steps: 20 eval_steps: 0")), 20);
  EXPECT_DOUBLE_EQ(ResolvedEvalSteps(Args("logging_steps: 20 eval_steps: 0.25")), 0.25);
}

TEST(ResolveTest, MetricForBestModelGetsEvalPrefix) {
  EXPECT_EQ(ResolvedMetricForBestModel(Args("")), "eval_loss");
  EXPECT_EQ(ResolvedMetricForBestModel(Args("metric_for_best_model: \"accuracy\"")),
            "eval_accuracy");
  EXPECT_EQ(ResolvedMetricForBestModel(Args("metric_for_best_model: \"eval_f1\"")), "eval_f1");
}

TEST(ResolveTest, GreaterIsBetterFollowsMetricName) {
  EXPECT_FALSE(ResolvedGreaterIsBetter(Args("")));
  EXPECT_FALSE(ResolvedGreaterIsBetter(Args("metric_for_best_model: \"nll_loss\"")));
  EXPECT_TRUE(ResolvedGreaterIsBetter(Args("metric_for_best_model: \"accuracy\"")));
  EXPECT_TRUE(ResolvedGreaterIsBetter(Args("greater_is_better: true")));
}

TEST(ResolveTest, StepIntervalRatioRoundsUp) {
  EXPECT_EQ(ResolveStepInterval(0.1, 1005), 101);
  EXPECT_EQ(ResolveStepInterval(0.5, 10), 5);
  EXPECT_EQ(ResolveStepInterval(500, 1005), 500);
  EXPECT_EQ(ResolveStepInterval(1, 1005), 1);
}

TEST(ResolveTest, WarmupStepsRatioRoundsUp) {
  EXPECT_EQ(ResolveWarmupSteps(Args("warmup_steps: 0.05"), 1010), 51);
  EXPECT_EQ(ResolveWarmupSteps(Args("warmup_steps: 30"), 1010), 30);
  EXPECT_EQ(ResolveWarmupSteps(Args(""), 1010), 0);
}

TEST(ResolveTest, DataSeedFallsBackToSeed) {
  EXPECT_EQ(ResolvedDataSeed(Args("seed: 3")), 3);
  EXPECT_EQ(ResolvedDataSeed(Args("seed: 3 data_seed: 9")), 9);
}

TEST(ResolveTest, GradientAccumulationNumStepsOverrides) {
  EXPECT_EQ(ResolvedGradientAccumulationSteps(Args("gradient_accumulation_steps: 4")), 4);
  EXPECT_EQ(ResolvedGradientAccumulationSteps(
                Args("accelerator_config { gradient_accumulation_kwargs { num_steps: 3 } }")),
            3);
}

// ---------------------------------------------------------------------------------------
// Loading.

TEST(LoadTrainingArgumentsTest, FromDefaultsWithOverrides) {
  absl::StatusOr<proto::TrainingArguments> args =
      LoadTrainingArguments("", {"learning_rate=3e-4", "lr_scheduler_type=cosine"});
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_DOUBLE_EQ(args->learning_rate(), 3e-4);
  EXPECT_EQ(args->lr_scheduler_type(), proto::TrainingArguments::COSINE);
}

TEST(LoadTrainingArgumentsTest, FromFileValidatesAndNamesPath) {
  const std::string path = absl::StrCat(EnvOrEmpty("TEST_TMPDIR"), "/args.textproto");
  std::ofstream(path) << "fp16: true\nlogging_steps: 10\n";
  ASSERT_TRUE(LoadTrainingArguments(path, {}).ok());
  absl::StatusOr<proto::TrainingArguments> args = LoadTrainingArguments(path, {"bf16=true"});
  ASSERT_FALSE(args.ok());
  EXPECT_THAT(args.status().message(),
              AllOf(HasSubstr(path), HasSubstr("fp16=true and bf16=true")));
}

TEST(LoadTrainingArgumentsTest, MissingFile) {
  EXPECT_EQ(LoadTrainingArguments("/nonexistent.textproto", {}).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(LoadTrainJobTest, FixtureWithOverrides) {
  absl::StatusOr<proto::TrainJob> job = LoadTrainJob(
      FixturePath(),
      {"args.fsdp.version=1", "args.fsdp.reshard_after_forward=", "args.learning_rate=1e-3"});
  // An empty value for a singular field is a type error, not a clear.
  ASSERT_FALSE(job.ok());
  EXPECT_THAT(job.status().message(), HasSubstr("--set=args.fsdp.reshard_after_forward=:"));

  job = LoadTrainJob(FixturePath(), {"args.ddp={}", "args.learning_rate=1e-3"});
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_TRUE(job->args().has_ddp());
  EXPECT_DOUBLE_EQ(job->args().learning_rate(), 1e-3);
}

TEST(LoadTrainJobTest, OverrideBreakingARuleIsReportedWithPath) {
  absl::StatusOr<proto::TrainJob> job = LoadTrainJob(FixturePath(), {"args.fsdp.version=1"});
  ASSERT_FALSE(job.ok());
  EXPECT_THAT(job.status().message(),
              AllOf(HasSubstr("full.textproto"), HasSubstr("args: fsdp.reshard_after_forward")));
}

TEST(ValidateTrainJobTest, NeedsModelAndData) {
  absl::Status status = ValidateTrainJob(proto::TrainJob());
  EXPECT_THAT(status.message(), AllOf(HasSubstr("(2 problems)"), HasSubstr("model.name"),
                                      HasSubstr("data.train_file")));
}

TEST(ValidateTrainJobTest, TrainFileAndBuiltinAreExclusive) {
  proto::TrainJob job;
  job.mutable_model()->set_name("tiny");
  job.mutable_data()->set_train_file("train.bin");
  job.mutable_data()->set_builtin("arithmetic");
  EXPECT_THAT(ValidateTrainJob(job).message(),
              AllOf(HasSubstr("train_file=\"train.bin\""), HasSubstr("builtin=\"arithmetic\"")));
}

TEST(ValidateTrainJobTest, EvaluationNeedsEvalData) {
  proto::TrainJob job;
  job.mutable_model()->set_name("tiny");
  job.mutable_data()->set_train_file("train.bin");
  job.mutable_args()->set_eval_strategy(proto::TrainingArguments::EPOCH);
  EXPECT_THAT(ValidateTrainJob(job).message(),
              AllOf(HasSubstr("args.eval_strategy=EPOCH"), HasSubstr("data.eval_file")));
  job.mutable_data()->set_eval_file("eval.bin");
  EXPECT_TRUE(ValidateTrainJob(job).ok());
}

TEST(ValidateTrainJobTest, SeqLenMustBePositive) {
  proto::TrainJob job;
  job.mutable_model()->set_name("tiny");
  job.mutable_data()->set_builtin("arithmetic");
  job.mutable_data()->set_seq_len(0);
  EXPECT_THAT(ValidateTrainJob(job).message(), HasSubstr("data.seq_len=0"));
}

TEST(ValidateTrainJobTest, ArgsProblemsArePrefixed) {
  proto::TrainJob job;
  job.mutable_model()->set_name("tiny");
  job.mutable_data()->set_builtin("arithmetic");
  job.mutable_args()->set_max_steps(0);
  EXPECT_THAT(ValidateTrainJob(job).message(), HasSubstr("args: max_steps=0"));
}

// The dotted paths of every singular float or double field reachable from `type` through
// singular message fields (each message type once per path, so a recursive type ends).
void FloatFieldPaths(const google::protobuf::Descriptor* type, const std::string& prefix,
                     std::vector<std::string> seen, std::vector<std::string>* paths) {
  using google::protobuf::FieldDescriptor;
  seen.push_back(type->full_name());
  for (int i = 0; i < type->field_count(); ++i) {
    const FieldDescriptor* field = type->field(i);
    if (field->is_repeated()) continue;
    const std::string path = absl::StrCat(prefix, field->name());
    if (field->cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE ||
        field->cpp_type() == FieldDescriptor::CPPTYPE_FLOAT) {
      paths->push_back(path);
    } else if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE &&
               std::find(seen.begin(), seen.end(), field->message_type()->full_name()) ==
                   seen.end()) {
      FloatFieldPaths(field->message_type(), absl::StrCat(path, "."), seen, paths);
    }
  }
}

// Sets the float or double field at `path` (from FloatFieldPaths) of `message` to `value`.
void SetFloatField(google::protobuf::Message* message, const std::string& path, double value) {
  using google::protobuf::FieldDescriptor;
  const size_t dot = path.find('.');
  const FieldDescriptor* field =
      message->GetDescriptor()->FindFieldByName(path.substr(0, dot));
  ASSERT_NE(field, nullptr) << path;
  const google::protobuf::Reflection* reflection = message->GetReflection();
  if (dot != std::string::npos) {
    SetFloatField(reflection->MutableMessage(message, field), path.substr(dot + 1), value);
  } else if (field->cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE) {
    reflection->SetDouble(message, field, value);
  } else {
    reflection->SetFloat(message, field, static_cast<float>(value));
  }
}

// Every float and double field of the job, the training arguments' included, set to NaN or
// an infinity, is refused by name and value; found by reflection, so new fields are covered.
TEST(ValidateTrainJobTest, EveryFloatFieldMustBeFinite) {
  std::vector<std::string> paths;
  FloatFieldPaths(proto::TrainJob::descriptor(), "", {}, &paths);
  // A sample of the fields the walk must reach, so an empty walk cannot pass.
  for (const char* expected : {"args.learning_rate", "args.weight_decay", "args.warmup_steps",
                               "args.lr_scheduler_kwargs.min_lr", "args.ddp.bucket_cap_mb",
                               "model.decoder.rope_theta"}) {
    EXPECT_THAT(paths, Contains(std::string(expected)));
  }
  const std::pair<double, const char*> bad[] = {
      {std::numeric_limits<double>::quiet_NaN(), "nan"},
      {std::numeric_limits<double>::infinity(), "inf"},
      {-std::numeric_limits<double>::infinity(), "-inf"},
  };
  for (const std::string& path : paths) {
    for (const auto& [value, name] : bad) {
      proto::TrainJob job;
      job.mutable_model()->set_name("tiny");
      job.mutable_data()->set_builtin("arithmetic");
      SetFloatField(&job, path, value);
      // Problems in args are listed as "args: <path inside args>".
      const std::string expected =
          absl::StartsWith(path, "args.")
              ? absl::StrCat("args: ", path.substr(5), "=", name, " is not a finite number")
              : absl::StrCat(path, "=", name, " is not a finite number");
      EXPECT_THAT(ValidateTrainJob(job).message(), HasSubstr(expected)) << path << "=" << name;
    }
  }
  EXPECT_GE(paths.size(), 30u);
}

// The values reach validation from the command line and from files.
TEST(LoadTrainJobTest, NonFiniteOverridesAreRefused) {
  for (const char* set : {"args.learning_rate=nan", "args.learning_rate=inf",
                          "args.weight_decay=nan", "args.warmup_steps=nan",
                          "args.warmup_steps=-inf"}) {
    absl::StatusOr<proto::TrainJob> job = LoadTrainJob(FixturePath(), {set});
    ASSERT_FALSE(job.ok()) << set;
    const std::string field = std::string(set).substr(5);
    EXPECT_THAT(job.status().message(), HasSubstr(absl::StrCat(
                                            "args: ", field, " is not a finite number")));
  }
}


// ---------------------------------------------------------------------------------------
// Hugging Face's flat ddp_* names and fsdp's string form, as transformers spells them.

TEST(HfDdpArgumentsTest, FlatNamesMapOntoTheDdpBlock) {
  for (const char* engine : {"ddp={}", "learning_rate=1e-3"}) {  // selected, or left to default
    absl::StatusOr<proto::TrainingArguments> args = LoadTrainingArguments(
        "", {engine, "ddp_find_unused_parameters=true", "ddp_bucket_cap_mb=50",
             "ddp_broadcast_buffers=false", "ddp_backend=gloo", "ddp_static_graph=false"});
    ASSERT_TRUE(args.ok()) << args.status();
    const proto::DdpConfig ddp = ResolvedDdpConfig(*args);
    EXPECT_TRUE(ddp.find_unused_parameters()) << engine;
    EXPECT_DOUBLE_EQ(ddp.bucket_cap_mb(), 50) << engine;
    EXPECT_FALSE(ddp.broadcast_buffers()) << engine;
  }
  // In a config file as well, and the nested block alone still counts.
  const proto::TrainingArguments file = Args("ddp_bucket_cap_mb: 10 ddp { broadcast_buffers: false }");
  EXPECT_DOUBLE_EQ(ResolvedDdpConfig(file).bucket_cap_mb(), 10);
  EXPECT_FALSE(ResolvedDdpConfig(file).broadcast_buffers());
  EXPECT_DOUBLE_EQ(ResolvedDdpConfig(Args("")).bucket_cap_mb(), 25);
}

TEST(HfDdpArgumentsTest, DisagreeingOrUnsupportedValuesAreRefusedWithTheFix) {
  EXPECT_THAT(Problems("ddp_find_unused_parameters: true ddp { find_unused_parameters: false }"),
              AllOf(HasSubstr("ddp_find_unused_parameters=true and "
                              "ddp.find_unused_parameters=false disagree"),
                    HasSubstr("keep one of them")));
  EXPECT_THAT(Problems("ddp_bucket_cap_mb: 50 ddp { bucket_cap_mb: 25 }"),
              HasSubstr("ddp_bucket_cap_mb=50 and ddp.bucket_cap_mb=25 disagree"));
  EXPECT_THAT(Problems("ddp_bucket_cap_mb: 0"), HasSubstr("ddp_bucket_cap_mb=0 must be positive"));
  EXPECT_THAT(Problems("ddp_backend: \"mpi\""),
              AllOf(HasSubstr("ddp_backend=\"mpi\" is not built"),
                    HasSubstr("\"nccl\" on CUDA and \"gloo\" on the CPU")));
  EXPECT_THAT(Problems("ddp_backend: \"nccl\" use_cpu: true"),
              HasSubstr("ddp_backend=\"nccl\" but use_cpu=true"));
  EXPECT_THAT(Problems("ddp_static_graph: true"),
              AllOf(HasSubstr("ddp_static_graph=true has no equivalent"),
                    HasSubstr("ddp.find_unused_parameters")));
  ExpectValid("ddp_bucket_cap_mb: 25 ddp { bucket_cap_mb: 25 } ddp_backend: \"nccl\"");
}

TEST(HfDdpArgumentsTest, IgnoredOutsideDdpWithAWarning) {
  EXPECT_THAT(TrainingArgumentsWarnings(Args("ddp_find_unused_parameters: false zero { stage: 2 }")),
              Contains(HasSubstr("apply to the DDP engine only and are ignored: the `zero` engine")));
  EXPECT_THAT(TrainingArgumentsWarnings(Args("ddp_find_unused_parameters: false")), IsEmpty());
}

TEST(HfFsdpStringTest, OptionsMapOntoTheFsdpBlock) {
  absl::StatusOr<proto::TrainingArguments> args =
      LoadTrainingArguments("", {"fsdp=full_shard auto_wrap"});
  ASSERT_TRUE(args.ok()) << args.status();
  ASSERT_TRUE(args->has_fsdp());
  EXPECT_EQ(args->fsdp().version(), 1);
  EXPECT_EQ(args->fsdp().sharding_strategy(), proto::FsdpConfig::FULL_SHARD);
  EXPECT_EQ(args->fsdp().auto_wrap_policy(), proto::FsdpConfig::TRANSFORMER_BASED_WRAP);
  EXPECT_FALSE(args->fsdp().offload_params());

  args = LoadTrainingArguments("", {"fsdp=shard_grad_op offload"});
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(args->fsdp().sharding_strategy(), proto::FsdpConfig::SHARD_GRAD_OP);
  EXPECT_TRUE(args->fsdp().offload_params());
  EXPECT_EQ(args->fsdp().auto_wrap_policy(), proto::FsdpConfig::NO_WRAP);

  args = LoadTrainingArguments("", {"fsdp=HYBRID_SHARD,auto_wrap"});
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(args->fsdp().sharding_strategy(), proto::FsdpConfig::HYBRID_SHARD);

  absl::StatusOr<proto::TrainJob> job =
      LoadTrainJob(FixturePath(), {"args.fsdp=full_shard auto_wrap"});
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->args().fsdp().version(), 1);
  EXPECT_EQ(job->args().fsdp().auto_wrap_policy(), proto::FsdpConfig::TRANSFORMER_BASED_WRAP);
  // The braces form is unchanged.
  args = LoadTrainingArguments("", {"fsdp={version: 2}"});
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(args->fsdp().version(), 2);
}

TEST(HfFsdpStringTest, OptionsTransformersRefusesAreRefused) {
  auto error = [](const std::string& value) {
    absl::StatusOr<proto::TrainingArguments> args =
        LoadTrainingArguments("", {absl::StrCat("fsdp=", value)});
    EXPECT_FALSE(args.ok()) << value;
    return std::string(args.status().message());
  };
  EXPECT_THAT(error("offload"), AllOf(HasSubstr("--set=fsdp=offload"),
                                      HasSubstr("offload can't work on its own")));
  EXPECT_THAT(error("full_shard shard_grad_op"), HasSubstr("names 2 sharding strategies"));
  EXPECT_THAT(error("full_shard autowrap"),
              AllOf(HasSubstr("\"autowrap\" is not one of Hugging Face's fsdp options"),
                    HasSubstr("auto_wrap")));
}

TEST(HfFsdpStringTest, TheStringFormInAConfigFile) {
  const std::string path = absl::StrCat(EnvOrEmpty("TEST_TMPDIR"), "/hf_fsdp.textproto");
  std::ofstream(path) << "logging_steps: 10\nfsdp: \"shard_grad_op auto_wrap\"\n"
                      << "run_name: \"fsdp: 'x'\"\n";
  absl::StatusOr<proto::TrainingArguments> args = LoadTrainingArguments(path, {});
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(args->fsdp().version(), 1);
  EXPECT_EQ(args->fsdp().sharding_strategy(), proto::FsdpConfig::SHARD_GRAD_OP);
  EXPECT_EQ(args->fsdp().auto_wrap_policy(), proto::FsdpConfig::TRANSFORMER_BASED_WRAP);
  EXPECT_EQ(args->run_name(), "fsdp: 'x'");

  std::ofstream(path) << "logging_steps: 10\n  fsdp: \"offload\"\n";
  args = LoadTrainingArguments(path, {});
  ASSERT_FALSE(args.ok());
  EXPECT_THAT(args.status().message(),
              AllOf(HasSubstr(absl::StrCat(path, ":2: ")), HasSubstr("can't work on its own")));

  const std::string job_path = absl::StrCat(EnvOrEmpty("TEST_TMPDIR"), "/hf_fsdp_job.textproto");
  std::ofstream(job_path) << "args { fsdp: \"full_shard\" }\nmodel { name: \"tiny\" }\n"
                          << "data { builtin: \"arithmetic\" }\n";
  absl::StatusOr<proto::TrainJob> job = LoadTrainJob(job_path, {});
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->args().fsdp().sharding_strategy(), proto::FsdpConfig::FULL_SHARD);
  EXPECT_EQ(job->args().fsdp().auto_wrap_policy(), proto::FsdpConfig::NO_WRAP);
}

}  // namespace
}  // namespace cpptrain
