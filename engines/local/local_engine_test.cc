// LocalEngine: a weight tied across two units (registered as a.w and b.w) is given to the
// optimizer once, counted once in the gradient norm and clipped once.
#include "engines/local/local_engine.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "engines/testing/engine_testing.h"
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
  EXPECT_NEAR(*norm, want.norm, 1e-5 * want.norm);
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

}  // namespace
}  // namespace cpptrain
