#include "engines/loss_scaler.h"

#include <gtest/gtest.h>
#include <torch/types.h>

#include <limits>

namespace cpptrain {
namespace {

TEST(LossScalerTest, StartsAtTwoToTheSixteen) {
  LossScaler scaler;
  EXPECT_EQ(scaler.scale(), 65536.0);
}

TEST(LossScalerTest, OverflowHalvesScaleAndResetsCount) {
  LossScaler scaler;
  scaler.Update(true);
  scaler.Update(true);
  EXPECT_EQ(scaler.clean_steps(), 2);
  scaler.Update(false);
  EXPECT_EQ(scaler.scale(), 32768.0);
  EXPECT_EQ(scaler.clean_steps(), 0);
}

TEST(LossScalerTest, GrowsAfterInterval) {
  LossScaler scaler(LossScalerOptions{.initial_scale = 8.0, .growth_interval = 3});
  scaler.Update(true);
  scaler.Update(true);
  EXPECT_EQ(scaler.scale(), 8.0);
  scaler.Update(true);
  EXPECT_EQ(scaler.scale(), 16.0);
  EXPECT_EQ(scaler.clean_steps(), 0);
}

TEST(LossScalerTest, HysteresisDelaysBackoffAndMinScaleBoundsIt) {
  LossScalerOptions options;
  options.initial_scale = 8.0;
  options.growth_interval = 2;
  options.hysteresis = 2;
  options.min_scale = 2.0;
  LossScaler scaler(options);
  scaler.Update(false);  // the first overflow is tolerated
  EXPECT_EQ(scaler.scale(), 8.0);
  scaler.Update(false);
  EXPECT_EQ(scaler.scale(), 4.0);
  scaler.Update(false);  // hysteresis used up: every overflow backs off, down to min_scale
  EXPECT_EQ(scaler.scale(), 2.0);
  scaler.Update(false);
  EXPECT_EQ(scaler.scale(), 2.0);
  scaler.Update(true);
  scaler.Update(true);  // a clean window grows the scale and restores the hysteresis
  EXPECT_EQ(scaler.scale(), 4.0);
  scaler.Update(false);
  EXPECT_EQ(scaler.scale(), 4.0);
}

TEST(LossScalerTest, UnscaleDividesAndDetectsNonFinite) {
  LossScaler scaler(LossScalerOptions{.initial_scale = 4.0});
  torch::Tensor a = torch::full({3}, 8.0);
  torch::Tensor b = torch::full({2}, 2.0);
  EXPECT_TRUE(scaler.UnscaleAndCheck({a, b}));
  EXPECT_TRUE(torch::allclose(a, torch::full({3}, 2.0)));
  EXPECT_TRUE(torch::allclose(b, torch::full({2}, 0.5)));

  torch::Tensor c = torch::tensor({1.0, std::numeric_limits<double>::infinity()});
  EXPECT_FALSE(scaler.UnscaleAndCheck({a, c}));
  torch::Tensor d = torch::tensor({std::numeric_limits<double>::quiet_NaN()});
  EXPECT_FALSE(scaler.UnscaleAndCheck({d}));
}

}  // namespace
}  // namespace cpptrain
