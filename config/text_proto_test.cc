#include "config/text_proto.h"

#include <chrono>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/job.pb.h"
#include "proto/training_args.pb.h"

namespace cpptrain {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

std::string TestDataPath(const std::string& name) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  EXPECT_NE(srcdir, nullptr);
  EXPECT_NE(workspace, nullptr);
  return absl::StrCat(srcdir == nullptr ? "" : srcdir, "/", workspace == nullptr ? "" : workspace,
                      "/config/testdata/", name);
}

std::string ParseError(const std::string& text) {
  proto::TrainingArguments args;
  absl::Status status = ParseTextProto(text, "run.textproto", &args);
  EXPECT_FALSE(status.ok()) << text;
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  return std::string(status.message());
}

std::string OverrideError(const std::string& assignment, google::protobuf::Message* msg) {
  absl::Status status = ApplyOverride(assignment, msg);
  EXPECT_FALSE(status.ok()) << assignment;
  return std::string(status.message());
}

TEST(ParseTextProtoTest, ParsesFullExampleFile) {
  proto::TrainJob job;
  ASSERT_TRUE(LoadTextProtoFile(TestDataPath("full.textproto"), &job).ok());
  EXPECT_EQ(job.args().output_dir(), "/tmp/cpptrain/full");
  EXPECT_EQ(job.args().max_steps(), 2000);
  EXPECT_DOUBLE_EQ(job.args().learning_rate(), 3e-4);
  EXPECT_EQ(job.args().lr_scheduler_type(), proto::TrainingArguments::COSINE_WITH_MIN_LR);
  EXPECT_DOUBLE_EQ(job.args().lr_scheduler_kwargs().min_lr_rate(), 0.1);
  EXPECT_TRUE(job.args().has_fsdp());
  EXPECT_EQ(job.args().fsdp().version(), 2);
  EXPECT_THAT(job.args().fsdp().transformer_layer_cls_to_wrap(), ElementsAre("DecoderLayer"));
  EXPECT_EQ(job.model().decoder().num_hidden_layers(), 4);
  EXPECT_EQ(job.data().builtin(), "arithmetic");
}

TEST(ParseTextProtoTest, ReplacesPreviousContents) {
  proto::TrainingArguments args;
  args.set_seed(7);
  ASSERT_TRUE(ParseTextProto("learning_rate: 0.1", "inline", &args).ok());
  EXPECT_FALSE(args.has_seed());
  EXPECT_DOUBLE_EQ(args.learning_rate(), 0.1);
}

TEST(ParseTextProtoTest, UnknownFieldNamesLineColumnAndValidFields) {
  const std::string error = ParseError("learning_rate: 1e-4\nlearnig_rate: 3\n");
  EXPECT_THAT(error, AllOf(HasSubstr("run.textproto:2:1:"), HasSubstr("learnig_rate"),
                           HasSubstr("did you mean \"learning_rate\""),
                           HasSubstr("Valid fields of TrainingArguments"),
                           HasSubstr("per_device_train_batch_size")));
}

TEST(ParseTextProtoTest, UnknownNestedFieldListsThatMessagesFields) {
  const std::string error = ParseError("seed: 1\nfsdp {\n  versoin: 2\n}\n");
  EXPECT_THAT(error,
              AllOf(HasSubstr("run.textproto:3:3:"), HasSubstr("versoin"),
                    HasSubstr("Valid fields of FsdpConfig"), HasSubstr("reshard_after_forward")));
  EXPECT_THAT(error, ::testing::Not(HasSubstr("per_device_train_batch_size")));
}

TEST(ParseTextProtoTest, TypeErrorNamesLineAndField) {
  const std::string error =
      ParseError("logging_steps: 10\n\nper_device_train_batch_size: \"eight\"\n");
  EXPECT_THAT(error, AllOf(HasSubstr("run.textproto:3:"),
                           HasSubstr("field per_device_train_batch_size: "),
                           HasSubstr("Expected integer")));
}

TEST(ParseTextProtoTest, TypeErrorInANestedMessageNamesItsPath) {
  proto::TrainJob job;
  const absl::Status status = ParseTextProto(
      "args {\n  # a comment { with braces }\n  output_dir: \"/tmp/x {\"\n  ddp {\n"
      "    bucket_cap_mb: lots\n  }\n}\n",
      "job.textproto", &job);
  EXPECT_THAT(std::string(status.message()),
              AllOf(HasSubstr("job.textproto:5:"), HasSubstr("field args.ddp.bucket_cap_mb: ")));
}

TEST(ParseTextProtoTest, UnknownEnumListsValidValues) {
  const std::string error = ParseError("seed: 3\nlr_scheduler_type: COSIN\n");
  EXPECT_THAT(error, AllOf(HasSubstr("run.textproto:2:20:"), HasSubstr("COSIN"),
                           HasSubstr("did you mean \"COSINE\""), HasSubstr("Valid values"),
                           HasSubstr("WARMUP_STABLE_DECAY"), HasSubstr("REDUCE_LR_ON_PLATEAU")));
}

TEST(ParseTextProtoTest, UnknownNestedEnumListsValidValues) {
  const std::string error = ParseError("fsdp { sharding_strategy: FULL }\n");
  EXPECT_THAT(error, AllOf(HasSubstr("run.textproto:1:27:"), HasSubstr("FULL_SHARD"),
                           HasSubstr("HYBRID_SHARD_ZERO2")));
}

TEST(ParseTextProtoTest, AcceptsHuggingFaceLeadingUnderscoreEnumSpelling) {
  proto::TrainingArguments args;
  ASSERT_TRUE(ParseTextProto("fsdp { version: 1 sharding_strategy: _HYBRID_SHARD_ZERO2 }\n"
                             "output_dir: \"a: _b\"  # keeps strings: _c\n",
                             "run.textproto", &args)
                  .ok());
  EXPECT_EQ(args.fsdp().sharding_strategy(), proto::FsdpConfig::HYBRID_SHARD_ZERO2);
  EXPECT_EQ(args.output_dir(), "a: _b");
  EXPECT_THAT(ParseError("fsdp { sharding_strategy: _FULL }\n"), HasSubstr("FULL_SHARD"));
}

TEST(ParseTextProtoTest, MalformedInputNamesLine) {
  const std::string error = ParseError("fsdp {\n  version: 2\n");
  EXPECT_THAT(error, HasSubstr("run.textproto:3:"));
}

TEST(ParseTextProtoTest, RepeatedSingularFieldIsAnError) {
  const std::string error = ParseError("seed: 1\nseed: 2\n");
  EXPECT_THAT(error, AllOf(HasSubstr("run.textproto:2:"), HasSubstr("seed")));
}

// The parser reports a repeated field at its name, where the last "name:" before is the
// field before it; the error names the repeated field.
TEST(ParseTextProtoTest, RepeatedSingularFieldIsNamedItself) {
  proto::TrainJob job;
  const absl::Status status = ParseTextProto(
      "args {\n  learning_rate: 0.001\n  weight_decay: 0.1\n  learning_rate: 0.002\n}\n",
      "job.textproto", &job);
  const std::string error(status.message());
  EXPECT_THAT(error, AllOf(HasSubstr("job.textproto:4:3: field args.learning_rate: "),
                           HasSubstr("\"learning_rate\" is specified multiple times"),
                           Not(HasSubstr("weight_decay"))))
      << error;
  EXPECT_THAT(ParseError("seed: 1\nmax_steps: 3\nseed: 2\n"),
              AllOf(HasSubstr("run.textproto:3:1: field seed: "), Not(HasSubstr("max_steps"))));
}

TEST(ParseTextProtoTest, TwoEnginesAreAnError) {
  const std::string error = ParseError("ddp {}\nfsdp {}\n");
  EXPECT_THAT(error, AllOf(HasSubstr("run.textproto:2:"), HasSubstr("oneof")));
}

TEST(LoadTextProtoFileTest, MissingFileNamesPath) {
  proto::TrainingArguments args;
  absl::Status status = LoadTextProtoFile("/nonexistent/dir/run.textproto", &args);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("/nonexistent/dir/run.textproto"));
}

TEST(ApplyOverrideTest, SetsDouble) {
  proto::TrainingArguments args;
  ASSERT_TRUE(ApplyOverride("learning_rate=3e-4", &args).ok());
  EXPECT_DOUBLE_EQ(args.learning_rate(), 3e-4);
}

TEST(ApplyOverrideTest, SetsIntegerAndReplacesPreviousValue) {
  proto::TrainingArguments args;
  args.set_max_steps(10);
  ASSERT_TRUE(ApplyOverride("max_steps = 250", &args).ok());
  EXPECT_EQ(args.max_steps(), 250);
}

TEST(ApplyOverrideTest, SetsEnumByNameAndCaseInsensitively) {
  proto::TrainingArguments args;
  ASSERT_TRUE(ApplyOverride("lr_scheduler_type=COSINE", &args).ok());
  EXPECT_EQ(args.lr_scheduler_type(), proto::TrainingArguments::COSINE);
  ASSERT_TRUE(ApplyOverride("lr_scheduler_type=warmup_stable_decay", &args).ok());
  EXPECT_EQ(args.lr_scheduler_type(), proto::TrainingArguments::WARMUP_STABLE_DECAY);
}

TEST(ApplyOverrideTest, SetsEnumWithHuggingFaceLeadingUnderscore) {
  proto::TrainingArguments args;
  ASSERT_TRUE(ApplyOverride("fsdp.sharding_strategy=_HYBRID_SHARD_ZERO2", &args).ok());
  EXPECT_EQ(args.fsdp().sharding_strategy(), proto::FsdpConfig::HYBRID_SHARD_ZERO2);
}

TEST(ApplyOverrideTest, SetsUnquotedAndQuotedString) {
  proto::TrainingArguments args;
  ASSERT_TRUE(ApplyOverride("output_dir=/tmp/x", &args).ok());
  EXPECT_EQ(args.output_dir(), "/tmp/x");
  ASSERT_TRUE(ApplyOverride("output_dir=\"/tmp/with space\"", &args).ok());
  EXPECT_EQ(args.output_dir(), "/tmp/with space");
  ASSERT_TRUE(ApplyOverride("metric_for_best_model=a\"b", &args).ok());
  EXPECT_EQ(args.metric_for_best_model(), "a\"b");
}

TEST(ApplyOverrideTest, SetsNestedFieldSelectingOneofCase) {
  proto::TrainingArguments args;
  ASSERT_TRUE(ApplyOverride("fsdp.reshard_after_forward=false", &args).ok());
  ASSERT_TRUE(args.has_fsdp());
  EXPECT_TRUE(args.fsdp().has_reshard_after_forward());
  EXPECT_FALSE(args.fsdp().reshard_after_forward());
}

TEST(ApplyOverrideTest, SetsFieldThroughTrainJob) {
  proto::TrainJob job;
  ASSERT_TRUE(ApplyOverride("args.fsdp.version=1", &job).ok());
  EXPECT_EQ(job.args().fsdp().version(), 1);
  ASSERT_TRUE(ApplyOverride("data.seq_len=256", &job).ok());
  EXPECT_EQ(job.data().seq_len(), 256);
}

// A field of another engine than the selected one would switch engines silently: an error
// that says how to switch; the explicit forms switch.
TEST(ApplyOverrideTest, ReachingIntoAnotherOneofMemberIsAnError) {
  proto::TrainJob job;
  job.mutable_args()->mutable_local();
  const absl::Status refused = ApplyOverride("args.ddp.bucket_cap_mb=25", &job);
  EXPECT_THAT(std::string(refused.message()),
              AllOf(HasSubstr("--set=args.ddp.bucket_cap_mb=25"), HasSubstr("args.local is selected"),
                    HasSubstr("switch explicitly with --set=args.ddp={}"),
                    HasSubstr("--set=args.ddp={bucket_cap_mb: ...}")));
  EXPECT_TRUE(job.args().has_local()) << "a refused override changes nothing";
  ASSERT_TRUE(ApplyOverrides({"args.ddp={}", "args.ddp.bucket_cap_mb=25"}, &job).ok());
  EXPECT_EQ(job.args().ddp().bucket_cap_mb(), 25);
  ASSERT_TRUE(ApplyOverride("args.fsdp={version: 1}", &job).ok());
  EXPECT_FALSE(job.args().has_ddp());
  EXPECT_EQ(job.args().fsdp().version(), 1);
}

TEST(ApplyOverrideTest, MessageLeafInBracesReplacesAndSelectsOneof) {
  proto::TrainingArguments args;
  args.mutable_fsdp()->set_version(1);
  ASSERT_TRUE(ApplyOverride("ddp={}", &args).ok());
  EXPECT_FALSE(args.has_fsdp());
  EXPECT_TRUE(args.has_ddp());
  ASSERT_TRUE(ApplyOverride("fsdp={version: 1 offload_params: true}", &args).ok());
  EXPECT_TRUE(args.has_fsdp());
  EXPECT_TRUE(args.fsdp().offload_params());
}

TEST(ApplyOverrideTest, ScalarOneofMemberSwitchesCase) {
  proto::TrainJob job;
  job.mutable_model()->mutable_decoder()->set_hidden_size(64);
  ASSERT_TRUE(ApplyOverride("model.name=tiny", &job).ok());
  EXPECT_EQ(job.model().model_case(), proto::ModelSpec::kName);
  EXPECT_EQ(job.model().name(), "tiny");
}

TEST(ApplyOverrideTest, RepeatedCommaListReplaces) {
  proto::TrainingArguments args;
  args.mutable_fsdp()->add_transformer_layer_cls_to_wrap("Old");
  ASSERT_TRUE(
      ApplyOverride("fsdp.transformer_layer_cls_to_wrap=DecoderLayer, MlpBlock", &args).ok());
  EXPECT_THAT(args.fsdp().transformer_layer_cls_to_wrap(), ElementsAre("DecoderLayer", "MlpBlock"));
}

TEST(ApplyOverrideTest, RepeatedListSyntaxAndEmptyClears) {
  proto::TrainingArguments args;
  ASSERT_TRUE(ApplyOverride("fsdp.transformer_layer_cls_to_wrap=[\"A\", \"B\"]", &args).ok());
  EXPECT_THAT(args.fsdp().transformer_layer_cls_to_wrap(), ElementsAre("A", "B"));
  ASSERT_TRUE(ApplyOverride("fsdp.transformer_layer_cls_to_wrap=", &args).ok());
  EXPECT_EQ(args.fsdp().transformer_layer_cls_to_wrap_size(), 0);
}

TEST(ApplyOverrideTest, UnknownTopLevelFieldListsValidNames) {
  proto::TrainingArguments args;
  const std::string error = OverrideError("lerning_rate=1", &args);
  EXPECT_THAT(error, AllOf(HasSubstr("--set=lerning_rate=1:"), HasSubstr("\"lerning_rate\""),
                           HasSubstr("did you mean \"learning_rate\""), HasSubstr("valid fields:"),
                           HasSubstr("max_grad_norm")));
}

TEST(ApplyOverrideTest, UnknownNestedFieldListsThatMessagesNames) {
  proto::TrainingArguments args;
  const std::string error = OverrideError("fsdp.foo=1", &args);
  EXPECT_THAT(error, AllOf(HasSubstr("--set=fsdp.foo=1:"), HasSubstr("FsdpConfig"),
                           HasSubstr("reshard_after_forward")));
  EXPECT_FALSE(args.has_fsdp()) << "a failed override must not select the oneof case";
}

TEST(ApplyOverrideTest, UnknownFieldSuggestsNestedPath) {
  proto::TrainJob job;
  EXPECT_THAT(OverrideError("learning_rate=1e-3", &job),
              AllOf(HasSubstr("TrainJob has no field \"learning_rate\""),
                    HasSubstr("did you mean \"args.learning_rate\"")));
  EXPECT_THAT(OverrideError("version=1", &job), HasSubstr("did you mean \"args.fsdp.version\""));
}

TEST(ApplyOverrideTest, PathThroughScalarIsAnError) {
  proto::TrainingArguments args;
  EXPECT_THAT(OverrideError("learning_rate.x=1", &args),
              AllOf(HasSubstr("learning_rate"), HasSubstr("not a singular message")));
}

TEST(ApplyOverrideTest, BadValueIsTypeError) {
  proto::TrainingArguments args;
  const std::string error = OverrideError("learning_rate=abc", &args);
  EXPECT_THAT(error, AllOf(HasSubstr("--set=learning_rate=abc:"), HasSubstr("learning_rate"),
                           HasSubstr("double"), HasSubstr("abc")));
  EXPECT_DOUBLE_EQ(args.learning_rate(), 5e-5);
}

TEST(ApplyOverrideTest, IntegerFieldRejectsFraction) {
  proto::TrainingArguments args;
  EXPECT_THAT(OverrideError("max_steps=1.5", &args),
              AllOf(HasSubstr("max_steps"), HasSubstr("int64")));
}

TEST(ApplyOverrideTest, BadEnumValueListsValidValues) {
  proto::TrainingArguments args;
  const std::string error = OverrideError("lr_scheduler_type=cosin", &args);
  EXPECT_THAT(error, AllOf(HasSubstr("--set=lr_scheduler_type=cosin:"), HasSubstr("COSINE"),
                           HasSubstr("CONSTANT_WITH_WARMUP")));
}

// Found by fuzz/set_override_fuzzer: the "did you mean" hint computed the edit distance of a
// long unknown name to every field name (quadratic), so a 1 MB name took seconds; names whose
// length alone puts them too far are now skipped.
TEST(ApplyOverrideTest, LongUnknownNameIsRefusedQuickly) {
  proto::TrainingArguments args;
  const std::string name(1 << 20, 'x');
  const auto start = std::chrono::steady_clock::now();
  const std::string error = OverrideError(name + "=1", &args);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_THAT(error, AllOf(HasSubstr("valid fields:"), Not(HasSubstr("did you mean"))));
  EXPECT_LT(seconds, 1.0);
}

TEST(ApplyOverrideTest, MissingEqualsIsAnError) {
  proto::TrainingArguments args;
  EXPECT_THAT(OverrideError("learning_rate", &args), HasSubstr("path.to.field=value"));
}

TEST(ApplyOverrideTest, MessageLeafWithoutBracesIsAnError) {
  proto::TrainingArguments args;
  EXPECT_THAT(OverrideError("fsdp=2", &args),
              AllOf(HasSubstr("is a message"), HasSubstr("fsdp.version")));
}

TEST(ApplyOverrideTest, FailedOverrideLeavesMessageUnchanged) {
  proto::TrainingArguments args;
  args.mutable_ddp()->set_bucket_cap_mb(50);
  OverrideError("fsdp.version=abc", &args);
  EXPECT_TRUE(args.has_ddp());
  EXPECT_DOUBLE_EQ(args.ddp().bucket_cap_mb(), 50);
}

TEST(ApplyOverridesTest, AppliesInOrder) {
  proto::TrainingArguments args;
  ASSERT_TRUE(ApplyOverrides({"seed=1", "seed=2", "bf16=true"}, &args).ok());
  EXPECT_EQ(args.seed(), 2);
  EXPECT_TRUE(args.bf16());
}

TEST(ApplyOverridesTest, ReportsEveryFailureAndChangesNothing) {
  proto::TrainingArguments args;
  absl::Status status = ApplyOverrides({"seed=1", "sed=2", "bf16=maybe"}, &args);
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("--set=sed=2:"), HasSubstr("--set=bf16=maybe:"), HasSubstr("\n")));
  EXPECT_FALSE(args.has_seed());
}

}  // namespace
}  // namespace cpptrain
