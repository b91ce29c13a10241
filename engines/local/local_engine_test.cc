// LocalEngine: a weight tied across two units (registered as a.w and b.w) is given to the
// optimizer once, counted once in the gradient norm and clipped once; under bf16 the forward
// reads bf16 working copies and the optimizer steps fp32 masters, which checkpoints see.
#include "engines/local/local_engine.h"

#include <gtest/gtest.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cmath>
#include <map>
#include <string>

#include "engines/testing/engine_testing.h"
#include "module/checkpointable_optimizer.h"
#include "module/testing/tied_blocks.h"

namespace cpptrain {
namespace {

using testing::TiedBlocks;

// The references are computed on the CPU, also on a CUDA host.
proto::LocalEngineConfig CpuConfig() {
  proto::LocalEngineConfig config;
  config.set_device("cpu");
  return config;
}

void StepTiedBlocks(double max_norm) {
  const Batch batch = TiedBlocks::Inputs(5, 3);
  const testing::SgdReference want = testing::TiedBlocksSgdStep({batch}, 0.5, max_norm);
  auto model = std::make_shared<TiedBlocks>(1);
  auto engine = LocalEngine::Create(CpuConfig(), MixedPrecision::kNone);
  ASSERT_TRUE(engine.ok()) << engine.status();
  int given = 0;
  ASSERT_TRUE((*engine)->PrepareForTraining(model, testing::SgdFactory(0.5, &given)).ok());
  EXPECT_EQ(given, 3) << "a.w (tied with b.w), a.b, b.b";
  ASSERT_TRUE((*engine)->Backward(model->LossSum(model->Forward(batch), batch)).ok());
  auto norm = (*engine)->ClipGradNorm(max_norm);
  ASSERT_TRUE(norm.ok()) << norm.status();
  EXPECT_NEAR(norm->item<double>(), want.norm, 1e-5 * want.norm);
  ASSERT_TRUE((*engine)->OptimizerStep().ok());
  for (const auto& item : model->named_parameters()) {
    EXPECT_TRUE(torch::allclose(item.value(), want.params.at(item.key()), 1e-5, 1e-6))
        << item.key() << ": " << item.value() << " vs " << want.params.at(item.key());
  }
}

TEST(LocalEngineTest, TiedWeightsAreSteppedOnce) { StepTiedBlocks(/*max_norm=*/0); }

TEST(LocalEngineTest, TiedWeightsAreClippedOnce) { StepTiedBlocks(/*max_norm=*/0.05); }

TEST(LocalEngineTest, ResetOptimizerBuildsAFreshOne) {
  auto model = std::make_shared<TiedBlocks>(1);
  auto engine = LocalEngine::Create(CpuConfig(), MixedPrecision::kNone);
  ASSERT_TRUE(engine.ok());
  ASSERT_TRUE((*engine)->PrepareForTraining(model, testing::SgdFactory(0.5)).ok());
  torch::optim::Optimizer* first = (*engine)->optimizer();
  (*engine)->ResetOptimizer();
  EXPECT_EQ((*engine)->optimizer(), nullptr);
  ASSERT_TRUE((*engine)->PrepareForTraining(model, testing::SgdFactory(0.5)).ok());
  EXPECT_NE((*engine)->optimizer(), nullptr);
  (void)first;
}

// One SGD step under bf16 with working copies equals, by hand: the forward and backward of a
// bf16 copy of the model under the same autocast, its gradients widened to fp32, the fp32
// parameters stepped with them. The optimizer is given fp32 tensors; the model then holds
// their bf16 rounding, and ExposeMasterWeights the fp32 values themselves.
TEST(LocalEngineTest, Bf16WorkingCopiesStepFp32Masters) {
  const Batch batch = TiedBlocks::Inputs(5, 3);
  const double lr = 0.5;
  auto model = std::make_shared<TiedBlocks>(1);
  auto engine = LocalEngine::Create(CpuConfig(), MixedPrecision::kBf16);
  ASSERT_TRUE(engine.ok()) << engine.status();
  bool all_fp32 = true;
  const OptimizerFactory sgd = testing::SgdFactory(lr);
  const OptimizerFactory checking = [&](const NamedParameters& params) {
    for (const auto& [name, p] : params) all_fp32 = all_fp32 && p.scalar_type() == torch::kFloat;
    return sgd(params);
  };
  ASSERT_TRUE((*engine)->PrepareForTraining(model, checking).ok());
  EXPECT_TRUE(all_fp32) << "the optimizer steps the fp32 masters";
  EXPECT_EQ(model->named_parameters()["a.w"].scalar_type(), torch::kBFloat16);

  auto ref = std::make_shared<TiedBlocks>(1);
  std::map<std::string, torch::Tensor> start;
  for (const auto& item : ref->named_parameters()) {
    start[item.key()] = item.value().detach().clone();
  }
  for (const auto& item : ref->named_parameters()) {  // a.w and b.w are one tensor
    if (item.value().scalar_type() == torch::kFloat) {
      item.value().set_data(item.value().detach().to(torch::kBFloat16));
    }
  }
  {
    auto scope = (*engine)->EnterForward();
    ref->LossSum(ref->Forward(batch), batch).backward();
  }
  double ref_squares = 0;
  for (const auto& item : ref->named_parameters()) {
    if (item.key() == "b.w") continue;  // a.w's tensor
    ref_squares += item.value().grad().to(torch::kFloat).square().sum().item<double>();
  }

  {
    auto scope = (*engine)->EnterForward();
    torch::Tensor loss = model->LossSum(model->Forward(batch), batch);
    scope.reset();
    ASSERT_TRUE((*engine)->Backward(loss).ok());
  }
  auto norm = (*engine)->ClipGradNorm(0);
  ASSERT_TRUE(norm.ok()) << norm.status();
  EXPECT_NEAR(norm->item<double>(), std::sqrt(ref_squares), 1e-6 * norm->item<double>());
  ASSERT_TRUE((*engine)->OptimizerStep().ok());
  (*engine)->ZeroGrad();
  ASSERT_TRUE((*engine)->ExposeMasterWeights().ok());
  for (const auto& item : model->named_parameters()) {
    const torch::Tensor want =
        start.at(item.key()) - lr * ref->named_parameters()[item.key()].grad().to(torch::kFloat);
    ASSERT_EQ(item.value().scalar_type(), torch::kFloat) << item.key();
    EXPECT_TRUE(torch::allclose(item.value(), want, 1e-6, 1e-7)) << item.key();
  }
  std::map<std::string, torch::Tensor> masters;
  for (const auto& item : model->named_parameters()) masters[item.key()] = item.value().clone();
  EXPECT_FALSE((*engine)->ExposeMasterWeights().ok()) << "a second Expose is refused";
  // Checkpoints find each parameter's optimizer state under its master.
  auto* stand_ins = dynamic_cast<StepsStandIns*>((*engine)->optimizer());
  ASSERT_NE(stand_ins, nullptr);
  const StepsStandIns::StandIn a_w = stand_ins->StandInFor(model->named_parameters()["a.w"]);
  ASSERT_NE(a_w.optimizer, nullptr);
  EXPECT_EQ(a_w.tensor.scalar_type(), torch::kFloat);
  EXPECT_TRUE(a_w.tensor.equal(masters.at("a.w")));
  EXPECT_NE(a_w.tensor.unsafeGetTensorImpl(),
            model->named_parameters()["a.w"].unsafeGetTensorImpl());
  EXPECT_EQ(stand_ins->StandInFor(torch::zeros({2})).optimizer, nullptr);
  ASSERT_TRUE((*engine)->RestoreWorkingWeights().ok());
  for (const auto& item : model->named_parameters()) {
    EXPECT_TRUE(item.value().equal(masters.at(item.key()).to(torch::kBFloat16))) << item.key();
  }
}

TEST(LocalEngineTest, Bf16WorkingCopiesCanBeTurnedOff) {
  auto model = std::make_shared<TiedBlocks>(1);
  proto::LocalEngineConfig config = CpuConfig();
  config.set_bf16_working_copies(false);
  auto engine = LocalEngine::Create(config, MixedPrecision::kBf16);
  ASSERT_TRUE(engine.ok()) << engine.status();
  ASSERT_TRUE((*engine)->PrepareForTraining(model, testing::SgdFactory(0.5)).ok());
  EXPECT_EQ(model->named_parameters()["a.w"].scalar_type(), torch::kFloat);
}

}  // namespace
}  // namespace cpptrain
