// The Accelerate mapping from both of its sources: the YAML samples tools/accelerate_samples.py
// made with Accelerate's own config class (config/testdata/accelerate/), the variables
// `accelerate launch` sets (names and values as its utils/launch.py writes them), and the
// subset parser's refusals. Each sample's overrides are also applied to a job and validated.
#include "config/accelerate_config.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "config/accelerate_yaml.h"
#include "config/text_proto.h"
#include "config/training_args.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/job.pb.h"

namespace cpptrain {
namespace {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

const char kDir[] = "config/testdata/accelerate/";

AccelerateMapping MapFile(const std::string& name) {
  absl::StatusOr<std::vector<AccelerateSetting>> settings =
      ReadAccelerateYamlFile(std::string(kDir) + name);
  EXPECT_TRUE(settings.ok()) << settings.status();
  if (!settings.ok()) return {};
  absl::StatusOr<AccelerateMapping> mapping = MapAccelerateSettings(*settings);
  EXPECT_TRUE(mapping.ok()) << mapping.status();
  return mapping.ok() ? *mapping : AccelerateMapping{};
}

// The mapping's overrides on a minimal job: they must parse and validate.
proto::TrainJob Apply(const AccelerateMapping& mapping) {
  proto::TrainJob job;
  std::vector<std::string> overrides = mapping.overrides;
  absl::Status s = ApplyOverrides(overrides, &job);
  EXPECT_TRUE(s.ok()) << s << "\n" << absl::StrJoin(overrides, "\n");
  s = ValidateTrainingArguments(job.args());
  EXPECT_TRUE(s.ok()) << s;
  return job;
}

TEST(AccelerateYamlSamplesTest, MultiGpuBf16KeepsTheEngineAndSetsBf16) {
  const AccelerateMapping m = MapFile("multi_gpu_bf16.yaml");
  EXPECT_THAT(m.overrides, Contains("args.bf16=true"));
  EXPECT_THAT(m.overrides, Not(Contains(HasSubstr("args.ddp"))));
  EXPECT_EQ(m.launch.num_processes, 2);
  EXPECT_EQ(m.launch.num_machines, 1);
  EXPECT_EQ(m.launch.machine_rank, 0);
  const proto::TrainJob job = Apply(m);
  EXPECT_TRUE(job.args().bf16());
  EXPECT_EQ(job.args().engine_case(), proto::TrainingArguments::ENGINE_NOT_SET);
}

TEST(AccelerateYamlSamplesTest, MultiCpuRunsOnTheCpuAtAFreePort) {
  const AccelerateMapping m = MapFile("multi_cpu.yaml");
  EXPECT_TRUE(Apply(m).args().use_cpu());
  EXPECT_EQ(m.launch.main_process_port, 0);
}

TEST(AccelerateYamlSamplesTest, Fsdp1FullShardWrapsLlamaLayers) {
  const proto::TrainJob job = Apply(MapFile("fsdp1_full_shard.yaml"));
  ASSERT_TRUE(job.args().has_fsdp());
  const proto::FsdpConfig& f = job.args().fsdp();
  EXPECT_EQ(f.version(), 1);
  EXPECT_EQ(f.sharding_strategy(), proto::FsdpConfig::FULL_SHARD);
  EXPECT_EQ(f.auto_wrap_policy(), proto::FsdpConfig::TRANSFORMER_BASED_WRAP);
  ASSERT_EQ(f.transformer_layer_cls_to_wrap_size(), 1);
  EXPECT_EQ(f.transformer_layer_cls_to_wrap(0), "LlamaDecoderLayer");
  EXPECT_EQ(f.backward_prefetch(), proto::FsdpConfig::BACKWARD_PRE);
  EXPECT_EQ(f.state_dict_type(), proto::FsdpConfig::SHARDED_STATE_DICT);
  EXPECT_TRUE(f.has_cpu_ram_efficient_loading() && !f.cpu_ram_efficient_loading());
  EXPECT_TRUE(f.has_use_orig_params() && f.use_orig_params());
}

TEST(AccelerateYamlSamplesTest, Fsdp2ReshardsAfterForward) {
  const proto::TrainJob job = Apply(MapFile("fsdp2.yaml"));
  ASSERT_TRUE(job.args().has_fsdp());
  EXPECT_EQ(job.args().fsdp().version(), 2);
  EXPECT_TRUE(job.args().fsdp().has_reshard_after_forward());
  EXPECT_TRUE(job.args().fsdp().reshard_after_forward());
  EXPECT_EQ(job.args().fsdp().transformer_layer_cls_to_wrap(0), "LlamaDecoderLayer");
  EXPECT_TRUE(job.args().fsdp().cpu_ram_efficient_loading());
}

TEST(AccelerateYamlSamplesTest, DeepSpeedZero3) {
  const proto::TrainJob job = Apply(MapFile("deepspeed_zero3.yaml"));
  ASSERT_TRUE(job.args().has_zero());
  EXPECT_EQ(job.args().zero().stage(), 3);
  EXPECT_FALSE(job.args().zero().zero3_init_flag());
  EXPECT_TRUE(job.args().zero().stage3_gather_16bit_weights_on_model_save());
  EXPECT_EQ(job.args().zero().offload_param_device(), proto::ZeroConfig::NONE);
  EXPECT_EQ(job.args().gradient_accumulation_steps(), 1);
}

TEST(AccelerateYamlSamplesTest, DeepSpeedZero2WithOptimizerOffload) {
  const proto::TrainJob job = Apply(MapFile("deepspeed_zero2_offload.yaml"));
  EXPECT_EQ(job.args().zero().stage(), 2);
  EXPECT_EQ(job.args().zero().offload_optimizer_device(), proto::ZeroConfig::CPU);
  EXPECT_EQ(job.args().gradient_accumulation_steps(), 2);
  EXPECT_DOUBLE_EQ(job.args().max_grad_norm(), 1.0);
}

TEST(AccelerateYamlSamplesTest, DeepSpeedConfigFileIsHandedOn) {
  const AccelerateMapping m = MapFile("deepspeed_config_file.yaml");
  EXPECT_EQ(m.deepspeed_config_file, "ds_config_zero2.json");
  EXPECT_TRUE(Apply(m).args().has_zero());
}

// What `accelerate launch --config_file fsdp2.yaml` puts in its workers' environment
// (accelerate/utils/launch.py's prepare_multi_gpu_env, defaults included).
const std::vector<std::string> kFsdpLaunchEnv = {
    "ACCELERATE_MIXED_PRECISION=bf16",
    "ACCELERATE_DYNAMO_BACKEND=NO",
    "ACCELERATE_DYNAMO_MODE=default",
    "ACCELERATE_DYNAMO_USE_FULLGRAPH=False",
    "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION=False",
    "ACCELERATE_USE_FSDP=true",
    "FSDP_VERSION=2",
    "FSDP_SHARDING_STRATEGY=FULL_SHARD",
    "FSDP_RESHARD_AFTER_FORWARD=true",
    "FSDP_OFFLOAD_PARAMS=false",
    "FSDP_MIN_NUM_PARAMS=100000000",
    "FSDP_AUTO_WRAP_POLICY=TRANSFORMER_BASED_WRAP",
    "FSDP_TRANSFORMER_CLS_TO_WRAP=LlamaDecoderLayer",
    "FSDP_STATE_DICT_TYPE=SHARDED_STATE_DICT",
    "FSDP_FORWARD_PREFETCH=false",
    "FSDP_USE_ORIG_PARAMS=true",
    "FSDP_CPU_RAM_EFFICIENT_LOADING=true",
    "FSDP_SYNC_MODULE_STATES=true",
    "FSDP_ACTIVATION_CHECKPOINTING=false",
    "FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD=false",
    "PATH=/usr/bin",
};

TEST(AccelerateEnvironmentTest, FsdpLaunchSelectsFsdp2WithItsKeys) {
  const std::vector<AccelerateSetting> settings = AccelerateSettingsFromEnvironment(kFsdpLaunchEnv);
  absl::StatusOr<AccelerateMapping> m = MapAccelerateSettings(settings);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->overrides.front(), "args.fsdp={}");
  const proto::TrainJob job = Apply(*m);
  EXPECT_EQ(job.args().fsdp().version(), 2);
  EXPECT_TRUE(job.args().bf16());
  EXPECT_TRUE(job.args().fsdp().reshard_after_forward());
  // The launcher always sets FSDP_MIN_NUM_PARAMS; it counts only under SIZE_BASED_WRAP.
  EXPECT_EQ(job.args().fsdp().min_num_params(), 0);
  EXPECT_EQ(job.args().fsdp().transformer_layer_cls_to_wrap(0), "LlamaDecoderLayer");
  // FSDP2 ignores the strategy Accelerate's launcher always sets, as Accelerate does.
  EXPECT_THAT(m->notes,
              Contains(HasSubstr("FSDP_SHARDING_STRATEGY: fsdp_config.fsdp_sharding_strategy")));
}

TEST(AccelerateEnvironmentTest, DeepSpeedLaunchSelectsZero) {
  const std::vector<AccelerateSetting> settings = AccelerateSettingsFromEnvironment(
      {"ACCELERATE_MIXED_PRECISION=no", "ACCELERATE_USE_DEEPSPEED=true",
       "ACCELERATE_CONFIG_DS_FIELDS=zero_stage,gradient_accumulation_steps",
       "ACCELERATE_DEEPSPEED_ZERO_STAGE=3", "ACCELERATE_GRADIENT_ACCUMULATION_STEPS=4",
       "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE=cpu",
       "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE=none", "ACCELERATE_DEEPSPEED_ZERO3_INIT=false",
       "FSDP_VERSION=2"});  // without ACCELERATE_USE_FSDP: not Accelerate's
  absl::StatusOr<AccelerateMapping> m = MapAccelerateSettings(settings);
  ASSERT_TRUE(m.ok()) << m.status();
  const proto::TrainJob job = Apply(*m);
  EXPECT_EQ(job.args().zero().stage(), 3);
  EXPECT_EQ(job.args().gradient_accumulation_steps(), 4);
  EXPECT_EQ(job.args().zero().offload_optimizer_device(), proto::ZeroConfig::CPU);
  EXPECT_THAT(m->overrides, Not(Contains(HasSubstr("fsdp"))));
}

// zero3_init_flag maps to its field, which ZeRO-3 honours (each rank reads only its own rows of
// a pretrained model) and validation accepts.
TEST(AccelerateEnvironmentTest, Zero3InitReachesItsField) {
  absl::StatusOr<AccelerateMapping> m = MapAccelerateSettings(AccelerateSettingsFromEnvironment(
      {"ACCELERATE_USE_DEEPSPEED=true", "ACCELERATE_DEEPSPEED_ZERO_STAGE=3",
       "ACCELERATE_DEEPSPEED_ZERO3_INIT=true"}));
  ASSERT_TRUE(m.ok()) << m.status();
  proto::TrainJob job;
  ASSERT_TRUE(ApplyOverrides(m->overrides, &job).ok());
  EXPECT_TRUE(job.args().zero().zero3_init_flag());
  EXPECT_TRUE(ValidateTrainingArguments(job.args()).ok())
      << ValidateTrainingArguments(job.args());
}

TEST(AccelerateEnvironmentTest, NotLaunchedByAccelerateGivesNothing) {
  EXPECT_THAT(AccelerateSettingsFromEnvironment({"FSDP_VERSION=2", "RANK=0", "WORLD_SIZE=2"}),
              IsEmpty());
}

TEST(AccelerateEnvironmentTest, EachRefusalNamesTheVariableAndTheFix) {
  const std::vector<AccelerateSetting> settings = AccelerateSettingsFromEnvironment(
      {"ACCELERATE_MIXED_PRECISION=fp8", "ACCELERATE_DYNAMO_BACKEND=INDUCTOR",
       "ACCELERATE_USE_FSDP=true", "FSDP_VERSION=2", "FSDP_RESHARD_AFTER_FORWARD=SHARD_GRAD_OP",
       "FSDP_IGNORED_MODULES=lm_head", "FSDP_MADE_UP=1"});
  absl::StatusOr<AccelerateMapping> m = MapAccelerateSettings(settings);
  ASSERT_FALSE(m.ok());
  const std::string message(m.status().message());
  EXPECT_THAT(message, HasSubstr("ACCELERATE_MIXED_PRECISION: mixed_precision: \"fp8\" is not "
                                 "supported: use no, bf16 or fp16"));
  EXPECT_THAT(message,
              AllOf(HasSubstr("ACCELERATE_DYNAMO_BACKEND"), HasSubstr("args.fused_kernels")));
  EXPECT_THAT(message,
              HasSubstr("FSDP_RESHARD_AFTER_FORWARD: fsdp_config.fsdp_reshard_after_forward: "
                        "\"SHARD_GRAD_OP\" is not true or false (fsdp_version 2)"));
  EXPECT_THAT(message, HasSubstr("FSDP_IGNORED_MODULES"));
  EXPECT_THAT(message, HasSubstr("FSDP_MADE_UP: FSDP_MADE_UP: \"1\" is not an Accelerate setting"));
}

TEST(AccelerateMappingTest, SectionOfAnotherDistributedTypeIsAnError) {
  absl::StatusOr<AccelerateMapping> m = MapAccelerateSettings(
      {{"distributed_type", "MULTI_GPU", "a.yaml:1"},
       {"fsdp_config.fsdp_version", "2", "a.yaml:3"}});
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(std::string(m.status().message()),
              HasSubstr("a.yaml:3: fsdp_config.fsdp_version: \"2\" is set but distributed_type is "
                        "MULTI_GPU: set distributed_type: FSDP or remove it"));
}

TEST(AccelerateMappingTest, UnknownKeyIsAnError) {
  absl::StatusOr<AccelerateMapping> m =
      MapAccelerateSettings({{"megatron_lm_config.megatron_lm_tp_degree", "2", "a.yaml:9"}});
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(std::string(m.status().message()),
              HasSubstr("a.yaml:9: megatron_lm_config.megatron_lm_tp_degree: \"2\" is not an "
                        "Accelerate setting this framework knows"));
}

TEST(YamlSubsetTest, ReadsScalarsQuotesListsAndComments) {
  absl::StatusOr<std::vector<YamlEntry>> e = ParseYamlSubset(
      "---\n# a comment\na: 1  # trailing\nb: 'it''s'\nc: \"x\\\"y # not a comment\"\n"
      "d:\n  e: [p, 'q']\n  f:\n  - r\n  - s\ng: {}\nh: ~\n",
      "t.yaml");
  ASSERT_TRUE(e.ok()) << e.status();
  std::vector<std::string> got;
  for (const YamlEntry& x : *e) got.push_back(absl::StrCat(x.line, " ", x.path, "=", x.value));
  EXPECT_EQ(got, (std::vector<std::string>{"3 a=1", "4 b=it's", "5 c=x\"y # not a comment",
                                           "7 d.e=p,q", "8 d.f=r,s", "12 h="}));
}

TEST(YamlSubsetTest, RefusesWhatItDoesNotReadWithTheLine) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"a: 1\n\tb: 2\n", "t.yaml:2: a tab in indentation"},
      {"a: &x 1\n", "t.yaml:1: \"&x 1\" (anchors"},
      {"a: |\n  text\n", "t.yaml:1: \"|\" (anchors"},
      {"a: {b: 1}\n", "t.yaml:1: \"{b: 1}\": a flow mapping"},
      {"a:\n  b:\n    c: 1\n", "t.yaml:3: a third level of nesting"},
      {"a: 1\na: 2\n", "t.yaml:2: the key \"a\" twice"},
      {"a: 1\n---\nb: 2\n", "t.yaml:2: a second YAML document"},
      {"a:\n- b: 1\n", "t.yaml:2: \"b: 1\": a mapping where a scalar belongs"},
      {"a: \"open\n", "t.yaml:1: a quoted string that does not end on its line"},
      {"just text\n", "t.yaml:1: \"just text\" is not `key: value`"},
      {"a: 1\n b: 2\n", "t.yaml:2: indented by 1 where 0"},
  };
  for (const auto& [text, want] : cases) {
    absl::StatusOr<std::vector<YamlEntry>> e = ParseYamlSubset(text, "t.yaml");
    ASSERT_FALSE(e.ok()) << text;
    EXPECT_THAT(std::string(e.status().message()), HasSubstr(want)) << text;
  }
}

TEST(AccelerateDocsTest, TheTableInDocsIsTheMappingsOwn) {
  std::ifstream in("docs/ACCELERATE.md");
  ASSERT_TRUE(in) << "docs/ACCELERATE.md is missing";
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_THAT(text.str(), HasSubstr(AccelerateKeyTableMarkdown()))
      << "regenerate the table: bazel-bin/tools/train --accelerate_table";
}

}  // namespace
}  // namespace cpptrain
