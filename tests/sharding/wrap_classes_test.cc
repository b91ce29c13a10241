// ResolveWrapClasses and AssignGroups on the reference decoder: Hugging Face's layer class of
// the model's type (Llama-, Mistral-, Qwen2- and Qwen3DecoderLayer) wraps the same layers as the
// project's "DecoderLayer"; a name that matches no module (another architecture's class or a
// made-up one) is an error listing the classes that exist, instead of wrapping nothing.
#include "sharding/wrap_classes.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "models/configs.h"
#include "models/mlp.h"
#include "sharding/sharding_core.h"

namespace cpptrain {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using sharding_core::AssignGroups;
using sharding_core::Assignment;

std::shared_ptr<DecoderLM> Decoder(bool qk_norm) {
  proto::DecoderConfig config = *NamedDecoderConfig("tiny");
  config.set_qk_norm(qk_norm);  // qwen3 with, llama without (HfConfigJson's model_type)
  return *BuildDecoder(config);
}

std::shared_ptr<DecoderLM> DecoderOfType(const std::string& model_type) {
  proto::DecoderConfig config = *NamedDecoderConfig("tiny");
  config.set_model_type(model_type);
  config.set_qk_norm(model_type == "qwen3");
  config.set_qkv_bias(model_type == "qwen2");  // what ValidateDecoderConfig requires per type
  absl::StatusOr<std::shared_ptr<DecoderLM>> model = BuildDecoder(config);
  EXPECT_TRUE(model.ok()) << model_type << ": " << model.status();
  return *model;
}

std::string ErrorOf(const TrainableModel& model, const std::vector<std::string>& names) {
  absl::StatusOr<std::vector<std::string>> classes = ResolveWrapClasses(model, names);
  EXPECT_FALSE(classes.ok()) << "names resolved to " << classes->size() << " classes";
  return classes.ok() ? "" : std::string(classes.status().message());
}

TEST(WrapClassesTest, HuggingFaceLayerClassOfTheModelTypeSelectsTheLayers) {
  auto llama = Decoder(/*qk_norm=*/false);
  auto qwen3 = Decoder(/*qk_norm=*/true);
  EXPECT_THAT(*ResolveWrapClasses(*llama, {"LlamaDecoderLayer"}), ElementsAre("DecoderLayer"));
  EXPECT_THAT(*ResolveWrapClasses(*qwen3, {"Qwen3DecoderLayer"}), ElementsAre("DecoderLayer"));
  EXPECT_THAT(*ResolveWrapClasses(*DecoderOfType("qwen2"), {"Qwen2DecoderLayer"}),
              ElementsAre("DecoderLayer"));
  EXPECT_THAT(*ResolveWrapClasses(*DecoderOfType("mistral"), {"MistralDecoderLayer"}),
              ElementsAre("DecoderLayer"));
  EXPECT_THAT(ErrorOf(*DecoderOfType("mistral"), {"Qwen2DecoderLayer"}),
              HasSubstr("DecoderLayer (also MistralDecoderLayer)"));
  EXPECT_THAT(*ResolveWrapClasses(*llama, {"DecoderLayer"}), ElementsAre("DecoderLayer"));
  EXPECT_THAT(*ResolveWrapClasses(*llama, {"DecoderLayer", "LlamaDecoderLayer"}),
              ElementsAre("DecoderLayer"));
  EXPECT_THAT(*ResolveWrapClasses(*llama, {}), ElementsAre("DecoderLayer"));
  // The root is always its own group: naming it is accepted and wraps nothing more.
  EXPECT_THAT(*ResolveWrapClasses(*llama, {"DecoderLM"}), IsEmpty());
}

TEST(WrapClassesTest, ANameThatMatchesNoModuleIsAnErrorListingThoseThatExist) {
  auto llama = Decoder(/*qk_norm=*/false);
  auto qwen3 = Decoder(/*qk_norm=*/true);
  for (const char* name : {"MadeUpLayer", "Qwen3DecoderLayer", "Qwen2DecoderLayer",
                           "MistralDecoderLayer"}) {
    EXPECT_THAT(ErrorOf(*llama, {"DecoderLayer", name}),
                AllOf(HasSubstr(absl::StrCat("transformer_layer_cls_to_wrap names \"", name,
                                             "\"")),
                      HasSubstr("DecoderLM (the model itself"),
                      HasSubstr("DecoderLayer (also LlamaDecoderLayer)"),
                      HasSubstr("leave transformer_layer_cls_to_wrap empty")));
  }
  EXPECT_THAT(ErrorOf(*qwen3, {"LlamaDecoderLayer"}),
              HasSubstr("DecoderLayer (also Qwen3DecoderLayer)"));
  proto::MlpConfig mlp_config;
  mlp_config.set_input_size(4);
  mlp_config.set_hidden_size(8);
  mlp_config.set_num_classes(3);
  auto mlp = *Mlp::Create(mlp_config);
  EXPECT_THAT(ErrorOf(*mlp, {"DecoderLayer"}), HasSubstr("MlpBlock"));
}

// The policy as FSDP1 and FSDP2 apply it (they share AssignGroups).
TEST(WrapClassesTest, AssignGroupsWrapsEachLayerForHuggingFacesNameAndRefusesAMadeUpOne) {
  auto llama = Decoder(/*qk_norm=*/false);
  WrapPolicy policy;
  policy.classes = {"LlamaDecoderLayer"};
  std::vector<Unit*> units;
  std::vector<Assignment> assignments;
  ASSERT_TRUE(AssignGroups(*llama, policy, &units, &assignments).ok());
  ASSERT_EQ(units.size(), 2u);
  for (const Unit* unit : units) EXPECT_EQ(unit->unit_class(), "DecoderLayer");
  int in_layers = 0;
  for (const Assignment& a : assignments) in_layers += a.group < 2 ? 1 : 0;
  EXPECT_GT(in_layers, 0);

  policy.classes = {"MadeUpLayer"};
  units.clear();
  assignments.clear();
  absl::Status refused = AssignGroups(*llama, policy, &units, &assignments);
  EXPECT_THAT(std::string(refused.message()), HasSubstr("\"MadeUpLayer\"")) << refused;
}

}  // namespace
}  // namespace cpptrain
