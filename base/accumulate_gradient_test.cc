#include "base/accumulate_gradient.h"

#include <gtest/gtest.h>
#include <torch/types.h>

namespace cpptrain {
namespace {

TEST(AccumulateGradientTest, KeepsWhatTheOptimizerReadsAndAddsInItsDtype) {
  const at::Tensor bf16 = torch::tensor({1.5f, -2.25f}).to(at::kBFloat16);
  at::Tensor held;
  AccumulateGradient(held, bf16, at::kFloat, /*keep_bf16=*/true);
  EXPECT_TRUE(held.is_same(bf16));
  AccumulateGradient(held, bf16, at::kFloat, true);  // widened, then added
  EXPECT_EQ(held.scalar_type(), at::kFloat);
  EXPECT_TRUE(torch::equal(held, torch::tensor({3.0f, -4.5f})));
  EXPECT_FALSE(torch::equal(bf16.to(at::kFloat), held)) << "the kept tensor was written";

  at::Tensor widened;
  AccumulateGradient(widened, bf16, at::kFloat, /*keep_bf16=*/false);
  EXPECT_EQ(widened.scalar_type(), at::kFloat);
  EXPECT_TRUE(torch::equal(widened, bf16.to(at::kFloat)));

  const at::Tensor fp32 = torch::tensor({0.5f, 4.0f});
  at::Tensor same;
  AccumulateGradient(same, fp32, at::kFloat, false);
  EXPECT_TRUE(same.is_same(fp32));
  AccumulateGradient(same, fp32, at::kFloat, false);  // in place, into autograd's buffer
  EXPECT_TRUE(same.is_same(fp32));
  EXPECT_TRUE(torch::equal(same, torch::tensor({1.0f, 8.0f})));

  at::Tensor half;  // a bf16 gradient of a non-fp32 parameter is not kept by keep_bf16
  AccumulateGradient(half, bf16, at::kHalf, true);
  EXPECT_EQ(half.scalar_type(), at::kHalf);
}

}  // namespace
}  // namespace cpptrain
