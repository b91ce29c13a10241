#include "models/recompute.h"

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "base/torch_compat.h"

namespace cpptrain {
namespace {

// Two linear layers with a nonlinearity; counts how often it runs with grad mode on and off.
struct Body {
  Body() {
    torch::manual_seed(0);
    w1 = torch::randn({8, 6}).requires_grad_();
    w2 = torch::randn({6, 8}).requires_grad_();
  }
  torch::Tensor operator()(const torch::Tensor& x) {
    ++(torch::GradMode::is_enabled() ? runs_with_grad : runs_without_grad);
    return torch::linear(torch::tanh(torch::linear(x, w1)), w2) + x;
  }
  void ZeroGrad() {
    for (torch::Tensor* w : {&w1, &w2}) {
      if (w->grad().defined()) w->mutable_grad().zero_();
    }
  }
  torch::Tensor w1, w2;
  int runs_with_grad = 0;
  int runs_without_grad = 0;
};

torch::Tensor Input(bool requires_grad) {
  torch::manual_seed(1);
  return torch::randn({3, 4, 6}).requires_grad_(requires_grad);
}

TEST(RecomputeTest, GradientsMatchPlainBackward) {
  Body body;
  torch::Tensor x = Input(true);
  torch::Tensor upstream = torch::randn({3, 4, 6});
  (body(x) * upstream).sum().backward();
  const torch::Tensor w1_grad = body.w1.grad().clone(), w2_grad = body.w2.grad().clone();
  const torch::Tensor x_grad = x.grad().clone();
  body.ZeroGrad();
  x.mutable_grad().zero_();
  body.runs_with_grad = body.runs_without_grad = 0;

  // Passing the body by reference wrapper keeps the counters on `body`.
  torch::Tensor out = RecomputeInBackward(std::ref(body), x);
  EXPECT_EQ(body.runs_without_grad, 1);  // forward keeps no activations
  EXPECT_EQ(body.runs_with_grad, 0);
  EXPECT_TRUE(out.requires_grad());
  (out * upstream).sum().backward();
  EXPECT_EQ(body.runs_with_grad, 1);  // recomputed once, in backward
  EXPECT_TRUE(torch::allclose(body.w1.grad(), w1_grad, 1e-6, 1e-7));
  EXPECT_TRUE(torch::allclose(body.w2.grad(), w2_grad, 1e-6, 1e-7));
  EXPECT_TRUE(torch::allclose(x.grad(), x_grad, 1e-6, 1e-7));
}

TEST(RecomputeTest, ParametersGetGradientsWhenTheInputNeedsNone) {
  Body body;
  const torch::Tensor x = Input(false);
  body(x).pow(2).sum().backward();
  const torch::Tensor w1_grad = body.w1.grad().clone();
  body.ZeroGrad();
  RecomputeInBackward(std::ref(body), x).pow(2).sum().backward();
  EXPECT_TRUE(torch::allclose(body.w1.grad(), w1_grad, 1e-6, 1e-7));
  EXPECT_FALSE(x.grad().defined());
}

TEST(RecomputeTest, ChainedCallsMatchPlainBackward) {
  Body first, second;
  torch::Tensor x = Input(true);
  second(first(x)).sum().backward();
  const torch::Tensor first_grad = first.w1.grad().clone(), x_grad = x.grad().clone();
  first.ZeroGrad();
  second.ZeroGrad();
  x.mutable_grad().zero_();
  RecomputeInBackward(std::ref(second), RecomputeInBackward(std::ref(first), x)).sum().backward();
  EXPECT_TRUE(torch::allclose(first.w1.grad(), first_grad, 1e-6, 1e-7));
  EXPECT_TRUE(torch::allclose(x.grad(), x_grad, 1e-6, 1e-7));
}

TEST(RecomputeTest, WithoutGradModeJustRunsTheBody) {
  Body body;
  torch::NoGradGuard no_grad;
  const torch::Tensor x = Input(true);
  const torch::Tensor out = RecomputeInBackward(std::ref(body), x);
  EXPECT_FALSE(out.requires_grad());
  EXPECT_TRUE(torch::equal(out, body(x)));
}

TEST(RecomputeTest, RecomputationUsesTheForwardAutocastState) {
  Body body;
  const torch::Tensor x = Input(true);
  auto w1_grad = [&](bool recompute) {
    body.ZeroGrad();
    torch::Tensor out;
    {
      AutocastGuard autocast(torch::kCPU, torch::kBFloat16);
      out = recompute ? RecomputeInBackward(std::ref(body), x) : body(x);
    }
    out.to(torch::kFloat).pow(2).sum().backward();  // outside autocast
    return body.w1.grad().clone();
  };
  const torch::Tensor plain = w1_grad(false);
  const torch::Tensor recomputed = w1_grad(true);
  EXPECT_TRUE(torch::allclose(recomputed, plain, 1e-6, 1e-7))
      << (recomputed - plain).abs().max().item<double>();
}

// Autocast caches the bf16 copy of each fp32 weight for the scope. A copy cast during the
// no-grad forward has no autograd history; if the recomputation reused it, the weights would
// get no gradient when backward runs inside the same scope.
TEST(RecomputeTest, BackwardInsideTheAutocastScopeStillReachesTheWeights) {
  Body body;
  const torch::Tensor x = Input(true);
  auto w1_grad = [&](bool recompute) {
    body.ZeroGrad();
    AutocastGuard autocast(torch::kCPU, torch::kBFloat16);
    torch::Tensor out = recompute ? RecomputeInBackward(std::ref(body), x) : body(x);
    out.to(torch::kFloat).pow(2).sum().backward();
    return body.w1.grad().clone();
  };
  const torch::Tensor plain = w1_grad(false);
  const torch::Tensor recomputed = w1_grad(true);
  EXPECT_GT(plain.abs().sum().item<double>(), 0);
  EXPECT_TRUE(torch::allclose(recomputed, plain, 1e-6, 1e-7))
      << (recomputed - plain).abs().max().item<double>();
}

}  // namespace
}  // namespace cpptrain
