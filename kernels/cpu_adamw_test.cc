#include "kernels/cpu_adamw.h"

#include <gtest/gtest.h>
#include <torch/optim/adamw.h>
#include <torch/types.h>
#include <torch/utils.h>
#include <torch/version.h>

#include <cmath>
#include <vector>

#include "kernels/cpu_adamw_agreement.h"

namespace cpptrain {
namespace kernels {
namespace {

// The key of a parameter in torch::optim::Optimizer::state(): its TensorImpl as a pointer
// (LibTorch 2.x) or as the pointer's text (1.13).
#if TORCH_VERSION_MAJOR >= 2
void* StateKey(const at::Tensor& param) { return param.unsafeGetTensorImpl(); }
#else
std::string StateKey(const at::Tensor& param) {
  return c10::guts::to_string(param.unsafeGetTensorImpl());
}
#endif


struct Case {
  int64_t n;
  double weight_decay;
  int threads;
};

// Steps torch::optim::AdamW and the kernel side by side on the same fp32 data and expects
// parameters and both moments to be bitwise equal after every step. Gradients change scale
// from step to step so the moments see both growth and decay.
void ExpectBitwiseEqualToLibTorch(const Case& c, bool bf16_grads) {
  at::set_num_threads(c.threads);
  torch::manual_seed(c.n + static_cast<int64_t>(c.weight_decay * 100) + c.threads);
  AdamWHyper hyper;
  hyper.lr = 3e-3;
  hyper.beta1 = 0.9;
  hyper.beta2 = 0.95;
  hyper.eps = 1e-8;
  hyper.weight_decay = c.weight_decay;
  torch::Tensor reference = torch::randn({c.n});
  torch::Tensor param = reference.clone();
  torch::Tensor exp_avg = torch::zeros({c.n}), exp_avg_sq = torch::zeros({c.n});
  reference.mutable_grad() = torch::zeros({c.n});
  torch::optim::AdamW adamw({reference}, torch::optim::AdamWOptions(hyper.lr)
                                             .betas({hyper.beta1, hyper.beta2})
                                             .eps(hyper.eps)
                                             .weight_decay(hyper.weight_decay));
  for (int64_t step = 1; step <= 6; ++step) {
    torch::Tensor grad = torch::randn({c.n}) * std::pow(10.0, static_cast<double>(step % 3) - 1);
    torch::Tensor grad_bf16 = grad.to(torch::kBFloat16);
    if (bf16_grads) grad = grad_bf16.to(torch::kFloat);
    reference.mutable_grad().copy_(grad);
    const torch::Tensor before = param.clone();
    adamw.step();
    if (bf16_grads) {
      CpuAdamWStep(AdamWSpansBf16Grad{param.data_ptr<float>(),
                                      reinterpret_cast<const uint16_t*>(grad_bf16.data_ptr()),
                                      exp_avg.data_ptr<float>(), exp_avg_sq.data_ptr<float>(), c.n},
                   hyper, step);
    } else {
      CpuAdamWStep(AdamWSpans{param.data_ptr<float>(), grad.data_ptr<float>(),
                              exp_avg.data_ptr<float>(), exp_avg_sq.data_ptr<float>(), c.n},
                   hyper, step);
    }
    const auto& state = static_cast<const torch::optim::AdamWParamState&>(
        *adamw.state().at(StateKey(reference)));
    const std::string where = "n=" + std::to_string(c.n) + " wd=" + std::to_string(c.weight_decay) +
                              " threads=" + std::to_string(c.threads) +
                              " step=" + std::to_string(step);
    ASSERT_TRUE(torch::equal(state.exp_avg(), exp_avg)) << where << " exp_avg";
    ASSERT_TRUE(torch::equal(state.exp_avg_sq(), exp_avg_sq)) << where << " exp_avg_sq";
    const int64_t worst = (reference.detach() - param).abs().argmax().item<int64_t>();
    ASSERT_TRUE(AgreesWithLibTorchAdamW(reference.detach(), param, before))
        << where << " param, max |diff| " << (reference.detach() - param).abs().max().item<float>()
        << " at " << worst << ": before " << before[worst].item<float>() << " LibTorch "
        << reference.detach()[worst].item<float>() << " kernel " << param[worst].item<float>();
#if TORCH_VERSION_MAJOR >= 2
    param.copy_(reference.detach());  // each step's difference alone, not their sum over steps
#endif
  }
}

TEST(CpuAdamWTest, Fp32GradsMatchLibTorchBitwise) {
  for (int64_t n : {1, 7, 1000003}) {
    for (double wd : {0.0, 0.1}) {
      for (int threads : {1, 2}) ExpectBitwiseEqualToLibTorch({n, wd, threads}, false);
    }
  }
}

// One fp32 parameter and its moments, stepped by the kernel.
struct Stepped {
  torch::Tensor param, exp_avg, exp_avg_sq;
  explicit Stepped(const torch::Tensor& p0)
      : param(p0.clone()), exp_avg(torch::zeros_like(p0)), exp_avg_sq(torch::zeros_like(p0)) {}
  void Step(const torch::Tensor& grad, const AdamWHyper& hyper, int64_t step,
            uint16_t* bf16_copy = nullptr) {
    CpuAdamWStep({param.data_ptr<float>(), grad.data_ptr<float>(), exp_avg.data_ptr<float>(),
                  exp_avg_sq.data_ptr<float>(), param.numel(), bf16_copy},
                 hyper, step);
  }
  bool Equals(const Stepped& other) const {
    return torch::equal(param, other.param) && torch::equal(exp_avg, other.exp_avg) &&
           torch::equal(exp_avg_sq, other.exp_avg_sq);
  }
};

AdamWHyper DecayingHyper() {
  AdamWHyper hyper;
  hyper.lr = 3e-3;
  hyper.weight_decay = 0.1;
  return hyper;
}

// grad_scale reads each gradient as clipping's g.mul_(scale) would have left it.
TEST(CpuAdamWTest, GradScaleEqualsScalingTheGradientsFirst) {
  at::set_num_threads(2);
  torch::manual_seed(11);
  const int64_t n = 300007;
  const torch::Tensor p0 = torch::randn({n}), grad = torch::randn({n});
  Stepped clipped_first(p0), folded(p0);
  const torch::Tensor scaled = grad.clone();
  at::_foreach_mul_({scaled}, 0.3713);  // what ClipByNorm does
  AdamWHyper folded_hyper = DecayingHyper();
  folded_hyper.grad_scale = 0.3713;
  for (int64_t step = 1; step <= 3; ++step) {
    clipped_first.Step(scaled, DecayingHyper(), step);
    folded.Step(grad, folded_hyper, step);
    ASSERT_TRUE(clipped_first.Equals(folded)) << "step " << step;
  }
}

// param_bf16 gets the updated parameter as param.to(kBFloat16) rounds it (nearest even; ties,
// values near bf16's largest and tiny ones among the inputs), and the fp32 results are those of
// a step that writes no copy.
TEST(CpuAdamWTest, Bf16CopyIsTheRoundedParameter) {
  at::set_num_threads(2);
  torch::manual_seed(13);
  const int64_t n = 400009;
  torch::Tensor p0 = torch::randn({n}) * 5;
  p0.narrow(0, 0, 4).copy_(torch::tensor({3.3895e38f, -1e-40f, 1.00390625f, 1.01171875f}));
  const torch::Tensor grad = torch::randn({n});
  Stepped plain(p0), copied(p0);
  torch::Tensor copy = torch::empty({n}, torch::kBFloat16);
  for (int64_t step = 1; step <= 2; ++step) {
    plain.Step(grad, DecayingHyper(), step);
    copied.Step(grad, DecayingHyper(), step, reinterpret_cast<uint16_t*>(copy.data_ptr()));
    ASSERT_TRUE(plain.Equals(copied)) << "step " << step;
    ASSERT_TRUE(torch::equal(copy, copied.param.to(torch::kBFloat16))) << "step " << step;
  }
}

TEST(CpuAdamWTest, SumOfSquaresIsExactEnoughAndTheSameOnAnyThreadCount) {
  torch::manual_seed(12);
  const torch::Tensor x = torch::randn({2000003}) * 3;
  const double want = x.to(torch::kDouble).square().sum().item<double>();
  at::set_num_threads(1);
  const double one = CpuSumOfSquares(x.data_ptr<float>(), x.numel());
  at::set_num_threads(2);
  const double two = CpuSumOfSquares(x.data_ptr<float>(), x.numel());
  EXPECT_NEAR(one, want, 1e-12 * want);
  EXPECT_EQ(one, two);
  EXPECT_EQ(CpuSumOfSquares(x.data_ptr<float>(), 0), 0.0);
}

// Built without -fopenmp, at::parallel_for in the kernel's file is a plain loop: one thread.
TEST(CpuAdamWTest, RunsOnTheIntraOpThreads) {
  at::set_num_threads(2);
  EXPECT_EQ(CpuAdamWThreads(1 << 20), 2);
  EXPECT_EQ(CpuAdamWThreads(100), 1);  // one chunk
}

TEST(CpuAdamWTest, Bf16GradsMatchLibTorchOnWidenedGradsBitwise) {
  for (int64_t n : {7, 1000003}) ExpectBitwiseEqualToLibTorch({n, 0.1, 2}, true);
}

TEST(CpuAdamWTest, ReportsWhichBodyRuns) {
  // This machine and every GPU host the project uses have AVX2 and FMA; a portable-only build
  // would still be correct but slow, which is worth a failure here.
  EXPECT_TRUE(CpuAdamWVectorized());
}

}  // namespace
}  // namespace kernels
}  // namespace cpptrain
