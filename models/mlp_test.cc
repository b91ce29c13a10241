#include "models/mlp.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>
#include <torch/utils.h>

namespace cpptrain {
namespace {

proto::MlpConfig Config(int64_t num_layers = 2) {
  proto::MlpConfig config;
  config.set_input_size(5);
  config.set_hidden_size(16);
  config.set_num_layers(num_layers);
  config.set_num_classes(3);
  return config;
}

std::shared_ptr<Mlp> Build(const proto::MlpConfig& config) {
  torch::manual_seed(0);
  return Mlp::Create(config).value();
}

TEST(MlpTest, ParameterNamesAndShapes) {
  auto model = Build(Config());
  std::vector<std::pair<std::string, std::vector<int64_t>>> got;
  for (const auto& item : model->named_parameters()) {
    got.emplace_back(item.key(), item.value().sizes().vec());
  }
  const std::vector<std::pair<std::string, std::vector<int64_t>>> expected = {
      {"layers.0.linear.weight", {16, 5}}, {"layers.0.linear.bias", {16}},
      {"layers.1.linear.weight", {16, 16}}, {"layers.1.linear.bias", {16}},
      {"head.weight", {3, 16}},            {"head.bias", {3}},
  };
  EXPECT_EQ(got, expected);
  EXPECT_EQ(model->LayerUnitClasses(), std::vector<std::string>{"MlpBlock"});
  EXPECT_EQ(model->unit_class(), "Mlp");
  ASSERT_EQ(model->blocks().size(), 2u);
  EXPECT_EQ(model->blocks()[0]->unit_class(), "MlpBlock");
}

TEST(MlpTest, NoHiddenLayersIsLinear) {
  auto model = Build(Config(0));
  EXPECT_EQ(model->parameters().size(), 2u);
  Batch batch;
  batch.inputs = torch::randn({4, 5});
  EXPECT_EQ(model->Forward(batch).sizes().vec(), (std::vector<int64_t>{4, 3}));
}

TEST(MlpTest, ForwardMatchesTheFormula) {
  auto model = Build(Config());
  Batch batch;
  batch.inputs = torch::randn({4, 5});
  auto p = model->named_parameters();
  torch::Tensor h = torch::relu(torch::linear(batch.inputs, p["layers.0.linear.weight"],
                                              p["layers.0.linear.bias"]));
  h = torch::relu(torch::linear(h, p["layers.1.linear.weight"], p["layers.1.linear.bias"]));
  const torch::Tensor expected = torch::linear(h, p["head.weight"], p["head.bias"]);
  const torch::Tensor logits = model->Forward(batch);
  EXPECT_EQ(logits.sizes().vec(), (std::vector<int64_t>{4, 3}));
  EXPECT_TRUE(torch::allclose(logits, expected, 1e-6, 1e-7));
}

TEST(MlpTest, LossSumAndCountMatchMeanCrossEntropy) {
  auto model = Build(Config());
  Batch batch;
  batch.inputs = torch::randn({6, 5});
  batch.labels = torch::tensor(std::vector<int64_t>{0, 2, kIgnoreIndex, 1, kIgnoreIndex, 2});
  const torch::Tensor logits = model->Forward(batch);
  EXPECT_EQ(model->CountLossTargets(batch), 4);
  const torch::Tensor mean = torch::nn::functional::cross_entropy(
      logits, batch.labels,
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(kIgnoreIndex));
  EXPECT_NEAR(model->LossSum(logits, batch).item<double>(), mean.item<double>() * 4, 1e-5);
}

class CountingHook : public UnitHook {
 public:
  torch::Tensor PreForward(Unit& unit, torch::Tensor input) override {
    order.push_back(&unit);
    return input;
  }
  torch::Tensor PostForward(Unit& unit, torch::Tensor output) override {
    order.push_back(&unit);
    return output;
  }
  std::vector<const Unit*> order;
};

TEST(MlpTest, HooksNestBlocksInsideTheRoot) {
  auto model = Build(Config());
  CountingHook hook;
  model->set_hook(&hook);
  for (const auto& block : model->blocks()) block->set_hook(&hook);
  Batch batch;
  batch.inputs = torch::randn({2, 5});
  model->Forward(batch);
  const Unit* b0 = model->blocks()[0].get();
  const Unit* b1 = model->blocks()[1].get();
  EXPECT_EQ(hook.order, (std::vector<const Unit*>{model.get(), b0, b0, b1, b1, model.get()}));
}

TEST(MlpTest, CheckpointingGivesTheSameGradients) {
  auto model = Build(Config());
  Batch batch;
  batch.inputs = torch::randn({8, 5});
  batch.labels = torch::randint(3, {8}, torch::kLong);
  auto grads = [&] {
    model->zero_grad();
    model->LossSum(model->Forward(batch), batch).backward();
    std::vector<torch::Tensor> out;
    for (const auto& p : model->parameters()) out.push_back(p.grad().clone());
    return out;
  };
  const auto plain = grads();
  model->SetGradientCheckpointing(true);
  const auto checkpointed = grads();
  ASSERT_EQ(plain.size(), checkpointed.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_TRUE(torch::allclose(checkpointed[i], plain[i], 1e-6, 1e-7)) << i;
  }
}

TEST(MlpTest, LearnsASeparableProblem) {
  auto model = Build(Config());
  torch::manual_seed(1);
  Batch batch;
  batch.inputs = torch::randn({64, 5});
  batch.labels = (batch.inputs.select(1, 0) > 0).to(torch::kLong) +
                 (batch.inputs.select(1, 1) > 0).to(torch::kLong);  // classes 0..2
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.5));
  const int64_t count = model->CountLossTargets(batch);
  double first = 0, last = 0;
  for (int step = 0; step < 200; ++step) {
    sgd.zero_grad();
    torch::Tensor loss = model->LossSum(model->Forward(batch), batch) / count;
    loss.backward();
    sgd.step();
    if (step == 0) first = loss.item<double>();
    last = loss.item<double>();
  }
  EXPECT_LT(last, 0.3 * first);
}

TEST(MlpTest, InvalidConfigIsRejected) {
  proto::MlpConfig config = Config();
  config.clear_num_classes();
  absl::StatusOr<std::shared_ptr<Mlp>> model = Mlp::Create(config);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(model.status().message().find("num_classes = 0"), absl::string_view::npos)
      << model.status();
  config = Config();
  config.set_hidden_size(0);
  EXPECT_FALSE(ValidateMlpConfig(config).ok());
  config.set_num_layers(0);
  EXPECT_TRUE(ValidateMlpConfig(config).ok());
}

}  // namespace
}  // namespace cpptrain
