#include "config/hf_training_args.h"

#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "config/text_proto.h"
#include "config/training_args.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/job.pb.h"
#include "proto/training_args.pb.h"

namespace cpptrain {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

bool IsOurField(const std::string& name) {
  return proto::TrainingArguments::descriptor()->FindFieldByName(name) != nullptr;
}

std::vector<std::string> TransformersFields() {
  std::ifstream in("config/testdata/hf_training_arguments_fields.txt");
  std::vector<std::string> fields;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line[0] != '#') fields.push_back(line);
  }
  return fields;
}

std::string Error(const absl::Status& status) { return std::string(status.message()); }

std::string WriteConfig(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(HfTrainingArgsTest, EveryTransformersFieldIsAcceptedMappedOrRefused) {
  const std::vector<std::string> fields = TransformersFields();
  ASSERT_GE(fields.size(), 100u) << "config/testdata/hf_training_arguments_fields.txt is short";
  std::vector<std::string> missing;
  for (const std::string& name : fields) {
    if (!IsOurField(name) && !IsHfOnlyArgument(name)) missing.push_back(name);
  }
  EXPECT_THAT(missing, IsEmpty()) << "give each a row in config/hf_training_args.cc";
}

TEST(HfTrainingArgsTest, TheTableHoldsOnlyTransformersNamesThatAreNotOurFields) {
  const std::vector<std::string> fields = TransformersFields();
  for (const std::string& name : HfOnlyArgumentNames()) {
    EXPECT_FALSE(IsOurField(name)) << name << " is a field of ours and a row of the table";
    EXPECT_NE(std::find(fields.begin(), fields.end(), name), fields.end())
        << name << " is not a field of the listed transformers";
  }
}

// A nested field that shares a name with a row (FsdpConfig.activation_checkpointing) stays the
// nested field's; only the TrainingArguments block is read for Hugging Face's names.
TEST(HfTrainingArgsTest, NestedFieldsOfTheSameNameAreNotHuggingFaces) {
  const std::string path = WriteConfig("hf_nested.textproto",
                                       "fsdp { activation_checkpointing: true }\n");
  absl::StatusOr<proto::TrainingArguments> args = LoadTrainingArguments(path, {});
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_TRUE(args->fsdp().activation_checkpointing());
  EXPECT_FALSE(args->gradient_checkpointing());

  const std::string job_path = WriteConfig(
      "hf_nested_job.textproto",
      "model { name: \"tiny\" }\ndata { builtin: \"arithmetic\" }\n"
      "args { fsdp { activation_checkpointing: true } activation_checkpointing: false }\n");
  absl::StatusOr<proto::TrainJob> job = LoadTrainJob(job_path, {});
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_TRUE(job->args().fsdp().activation_checkpointing());
  EXPECT_FALSE(job->args().gradient_checkpointing());
}

TEST(HfTrainingArgsTest, TheDocsHoldTheGeneratedTable) {
  std::ifstream in("docs/TRAINING_ARGUMENTS.md");
  ASSERT_TRUE(in) << "docs/TRAINING_ARGUMENTS.md is missing";
  std::stringstream text;
  text << in.rdbuf();
  const std::string table = HfTrainingArgumentsTableMarkdown(TransformersFields(), IsOurField);
  EXPECT_THAT(table, Not(HasSubstr("| missing |")));
  EXPECT_THAT(text.str(), HasSubstr(table))
      << "regenerate the table: bazel run //tools:training_args_table";
}

TEST(HfTrainingArgsTest, HuggingFacesDefaultsChangeNothing) {
  for (const auto& [name, value] : std::vector<std::pair<std::string, std::string>>{
           {"push_to_hub", "false"}, {"hub_token", "None"}, {"hub_strategy", "every_save"},
           {"torch_compile", "False"}, {"label_names", "[\"labels\"]"},
           {"include_num_input_tokens_seen", "no"}, {"log_level", "passive"},
           {"debug", "\"\""}, {"use_liger_kernel", "false"}, {"tf32", "false"}}) {
    absl::StatusOr<std::vector<std::string>> ours = TranslateHfArgument(name, value);
    ASSERT_TRUE(ours.ok()) << name << "=" << value << ": " << ours.status();
    EXPECT_THAT(*ours, IsEmpty()) << name << "=" << value;
  }
}

TEST(HfTrainingArgsTest, MappedNamesSetOurFields) {
  EXPECT_THAT(*TranslateHfArgument("use_liger_kernel", "True"), ElementsAre("fused_kernels=true"));
  EXPECT_THAT(*TranslateHfArgument("activation_checkpointing", "true"),
              ElementsAre("gradient_checkpointing=true"));
  EXPECT_THAT(*TranslateHfArgument("train_sampling_strategy", "group_by_length"),
              ElementsAre("group_by_length=true"));
  EXPECT_THAT(*TranslateHfArgument("gradient_checkpointing_kwargs", "{\"use_reentrant\": false}"),
              IsEmpty());
  EXPECT_EQ(TranslateHfArgument("learning_rate", "1").status().code(),
            absl::StatusCode::kNotFound);

  absl::StatusOr<proto::TrainingArguments> args = LoadTrainingArguments(
      "", {"use_liger_kernel=true", "fused_kernels=false", "activation_checkpointing=true",
           "push_to_hub=false", "remove_unused_columns=false"});
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_TRUE(args->gradient_checkpointing());
  EXPECT_FALSE(args->fused_kernels());  // the later --set wins
}

TEST(HfTrainingArgsTest, RefusalsNameTheFieldTheValueAndTheEquivalent) {
  EXPECT_THAT(Error(LoadTrainingArguments("", {"torch_compile=true"}).status()),
              AllOf(HasSubstr("--set=torch_compile=true"), HasSubstr("TorchDynamo"),
                    HasSubstr("fused_kernels"), HasSubstr("cuda_graphs")));
  EXPECT_THAT(Error(LoadTrainingArguments("", {"push_to_hub=true"}).status()),
              AllOf(HasSubstr("push_to_hub=true"), HasSubstr("hf upload")));
  EXPECT_THAT(Error(LoadTrainingArguments("", {"log_level=warning"}).status()),
              HasSubstr("GLOG_minloglevel=1"));
  // deepspeed is mapped now (config/hf_json_args_test.cc): a file that is not there says so.
  EXPECT_THAT(Error(LoadTrainingArguments("", {"deepspeed=ds.json"}).status()),
              AllOf(HasSubstr("--set=deepspeed=ds.json"), HasSubstr("cannot be read"),
                    HasSubstr("path of a JSON file")));
  EXPECT_THAT(Error(LoadTrainingArguments("", {"gradient_checkpointing_kwargs={\"x\": 1}"})
                        .status()),
              HasSubstr("only use_reentrant"));
  const std::string token = Error(LoadTrainingArguments("", {"hub_token=hf_secret"}).status());
  EXPECT_THAT(token, AllOf(HasSubstr("hub_token=<hidden>"), Not(HasSubstr("hf_secret"))));
}

TEST(HfTrainingArgsTest, ConfigFilesTakeHuggingFacesNames) {
  const std::string path = WriteConfig("hf_names.textproto",
                                       "learning_rate: 1e-4\n"
                                       "push_to_hub: false  # torch_compile: true\n"
                                       "use_liger_kernel: true\n"
                                       "gradient_checkpointing_kwargs { use_reentrant: false }\n"
                                       "activation_checkpointing: true\n"
                                       "hub_strategy: \"every_save\"\n");
  absl::StatusOr<proto::TrainingArguments> args = LoadTrainingArguments(path, {});
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_DOUBLE_EQ(args->learning_rate(), 1e-4);
  EXPECT_TRUE(args->fused_kernels());
  EXPECT_TRUE(args->gradient_checkpointing());

  // Names inside strings and comments are not settings.
  const std::string quoted = WriteConfig("hf_quoted.textproto",
                                         "run_name: \"debug: x, torch_compile: true\"\n"
                                         "# push_to_hub: true\n");
  absl::StatusOr<proto::TrainingArguments> named = LoadTrainingArguments(quoted, {});
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(named->run_name(), "debug: x, torch_compile: true");

  const std::string bad = WriteConfig("hf_bad.textproto",
                                      "learning_rate: 1e-4\n\ntorch_compile: true\n");
  EXPECT_THAT(Error(LoadTrainingArguments(bad, {}).status()),
              AllOf(HasSubstr(bad + ":3: torch_compile=true"), HasSubstr("cuda_graphs")));
}

TEST(HfTrainingArgsTest, TrainJobsTakeThemUnderArgs) {
  const std::string path = WriteConfig("hf_job.textproto",
                                       "model { name: \"tiny\" }\n"
                                       "data { builtin: \"arithmetic\" }\n"
                                       "args { use_liger_kernel: true fused_kernels: true }\n");
  absl::StatusOr<proto::TrainJob> job =
      LoadTrainJob(path, {"args.train_sampling_strategy=group_by_length"});
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_TRUE(job->args().fused_kernels());
  EXPECT_TRUE(job->args().group_by_length());
  // A file whose Hugging Face name maps onto a field it sets to another value: an error naming
  // both, not a silent choice.
  const std::string both = WriteConfig("hf_job_both.textproto",
                                       "model { name: \"tiny\" }\n"
                                       "data { builtin: \"arithmetic\" }\n"
                                       "args { use_liger_kernel: true fused_kernels: false }\n");
  EXPECT_THAT(Error(LoadTrainJob(both, {}).status()),
              AllOf(HasSubstr("(use_liger_kernel) sets args.fused_kernels=true"),
                    HasSubstr("keep one of the two")));
  EXPECT_THAT(Error(LoadTrainJob(path, {"args.save_on_each_node=true"}).status()),
              AllOf(HasSubstr("--set=args.save_on_each_node=true"), HasSubstr("output_dir")));
}

TEST(HfTrainingArgsTest, UnknownNamesSuggestTheNearestFieldAndWhereHfsSettingLives) {
  proto::TrainingArguments args;
  // A typo of one of our fields: that field.
  EXPECT_THAT(Error(ApplyOverride("learning_rat=1", &args)),
              HasSubstr("did you mean \"learning_rate\""));
  // A typo of a Hugging Face name: that name and what it is here.
  EXPECT_THAT(Error(ApplyOverride("push_to_hubb=true", &args)),
              AllOf(HasSubstr("did you mean \"push_to_hub\""), HasSubstr("hf upload")));
  // A Hugging Face name reaching the parser directly: where its setting lives.
  EXPECT_THAT(Error(ParseTextProto("fsdp_config: \"fsdp.json\"", "f.textproto", &args)),
              AllOf(HasSubstr("f.textproto:1:1"), HasSubstr("fsdp.*"), HasSubstr("JSON")));
  proto::TrainJob job;
  EXPECT_THAT(Error(ApplyOverride("torch_compile=true", &job)),
              AllOf(HasSubstr("TorchDynamo"), HasSubstr("belongs under args")));
}

}  // namespace
}  // namespace cpptrain
