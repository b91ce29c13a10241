#include "trainer/optimizer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace cpptrain {
namespace {

TEST(OptimizerTest, DecayExclusionsFollowHuggingFaceNames) {
  for (const char* name :
       {"model.norm.weight", "model.layers.0.input_layernorm.weight",
        "model.layers.3.post_attention_layernorm.weight", "model.layers.1.self_attn.q_norm.weight",
        "model.layers.1.self_attn.k_norm.weight", "model.layers.0.self_attn.q_proj.bias",
        "encoder.RMSNorm.weight", "norm.weight", "block.norm"}) {
    EXPECT_TRUE(ExcludedFromWeightDecay(name)) << name;
  }
  for (const char* name :
       {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.mlp.down_proj.weight", "lm_head.weight", "normalizer.weight",
        "model.layers.0.mlp.gate_proj.weight"}) {
    EXPECT_FALSE(ExcludedFromWeightDecay(name)) << name;
  }
}

TEST(OptimizerTest, AdamWGroupsApplyDecayOnlyToMatrices) {
  proto::TrainingArguments args;
  args.set_learning_rate(0.1);
  args.set_weight_decay(0.5);
  torch::Tensor matrix = torch::ones({2, 2}, torch::requires_grad());
  torch::Tensor norm = torch::ones({2}, torch::requires_grad());
  auto optimizer = MakeAdamWFactory(args)({{"layer.weight", matrix}, {"layer.norm.weight", norm}});
  ASSERT_TRUE(optimizer.ok());
  ASSERT_EQ((*optimizer)->param_groups().size(), 2u);
  // Zero gradients: Adam's update is zero, so only decoupled weight decay moves parameters.
  matrix.mutable_grad() = torch::zeros_like(matrix);
  norm.mutable_grad() = torch::zeros_like(norm);
  (*optimizer)->step();
  EXPECT_TRUE(torch::allclose(matrix, torch::full({2, 2}, 1.0 - 0.1 * 0.5)));
  EXPECT_TRUE(torch::allclose(norm, torch::ones({2})));
}

TEST(OptimizerTest, SetLearningRateReachesEveryGroup) {
  proto::TrainingArguments args;
  torch::Tensor a = torch::ones({2, 2}, torch::requires_grad());
  torch::Tensor b = torch::ones({2}, torch::requires_grad());
  auto optimizer = MakeAdamWFactory(args)({{"w", a}, {"bias", b}});
  ASSERT_TRUE(optimizer.ok());
  SetLearningRate(**optimizer, 0.25);
  for (auto& group : (*optimizer)->param_groups()) {
    EXPECT_DOUBLE_EQ(static_cast<torch::optim::AdamWOptions&>(group.options()).lr(), 0.25);
  }
}

}  // namespace
}  // namespace cpptrain
