#include "trainer/optimizer.h"

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>
#include <torch/utils.h>
#include <torch/version.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "kernels/cpu_adamw_agreement.h"
#include "kernels/cuda_adamw.h"

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
  for (const char* name : {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                           "model.layers.0.mlp.down_proj.weight", "lm_head.weight",
                           "normalizer.weight", "model.layers.0.mlp.gate_proj.weight"}) {
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

// Two FusedAdamW over copies of the same parameters (odd sizes, a decay and a no-decay group),
// one through the CPU kernel and one through torch::optim::AdamW, stepped with the same
// gradients (fp32, then bf16 for the decay group on the last steps).
struct TwinOptimizers {
  std::vector<torch::Tensor> kernel_params, torch_params;
  std::unique_ptr<FusedAdamW> kernel, reference;

  explicit TwinOptimizers(const std::vector<int64_t>& sizes) {
    torch::manual_seed(7);
    for (int64_t n : sizes) {
      torch::Tensor p = torch::randn({n});
      kernel_params.push_back(p.clone().requires_grad_());
      torch_params.push_back(p.clone().requires_grad_());
    }
    kernel = Make(kernel_params);
    reference = Make(torch_params);
    reference->UseCpuKernel(false);
  }

  static std::unique_ptr<FusedAdamW> Make(const std::vector<torch::Tensor>& params) {
    auto options = [](double wd) {
      return std::make_unique<torch::optim::AdamWOptions>(
          torch::optim::AdamWOptions(2e-3).betas({0.9, 0.98}).eps(1e-7).weight_decay(wd));
    };
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(std::vector<torch::Tensor>{params[0], params[1]}, options(0.1));
    groups.emplace_back(std::vector<torch::Tensor>{params[2]}, options(0.0));
    return std::make_unique<FusedAdamW>(groups, *options(0.1));
  }

  void Step(int64_t step, bool bf16) {
    for (size_t i = 0; i < kernel_params.size(); ++i) {
      torch::Tensor g = torch::randn_like(kernel_params[i]) * (1.0 + step);
      if (bf16 && i == 0) g = g.to(torch::kBFloat16);
      kernel_params[i].mutable_grad() = g.clone();
      // torch::optim::AdamW's arithmetic on a bf16 gradient is mixed-dtype; the kernel widens
      // first, so the reference gets the widened gradient.
      torch_params[i].mutable_grad() = g.to(torch::kFloat);
    }
    kernel->step();
    reference->step();
  }
};

// On LibTorch 1.13 bit for bit over all steps; on 2.x each step within kernels/
// cpu_adamw_agreement.h's bound of 2.x's AdamW (the reference's value then carried over, so each
// step's difference is seen alone), the moments and the step count bit for bit.
TEST(OptimizerTest, CpuKernelEqualsLibTorchAdamWBitwiseIncludingState) {
  TwinOptimizers twins({1000003, 7, 1});
  for (int64_t step = 0; step < 5; ++step) {
    std::vector<torch::Tensor> before;
    for (const torch::Tensor& p : twins.kernel_params) before.push_back(p.detach().clone());
    twins.Step(step, /*bf16=*/step >= 3);
    for (size_t i = 0; i < twins.kernel_params.size(); ++i) {
      ASSERT_TRUE(kernels::AgreesWithLibTorchAdamW(twins.torch_params[i].detach(),
                                                   twins.kernel_params[i].detach(), before[i]))
          << "step " << step << " param " << i;
#if TORCH_VERSION_MAJOR >= 2
      torch::NoGradGuard no_grad;
      twins.kernel_params[i].copy_(twins.torch_params[i]);
#endif
    }
  }
  for (size_t i = 0; i < twins.kernel_params.size(); ++i) {
    EXPECT_TRUE(torch::equal(twins.kernel_params[i], twins.torch_params[i])) << "param " << i;
    auto mine = twins.kernel->ExportState(twins.kernel_params[i]);
    auto theirs = twins.reference->ExportState(twins.torch_params[i]);
    ASSERT_EQ(mine.size(), 3u);
    for (const char* key : {"exp_avg", "exp_avg_sq", "step"}) {
      EXPECT_TRUE(torch::equal(mine.at(key), theirs.at(key))) << key << " of param " << i;
    }
  }
  EXPECT_EQ(twins.kernel->ExportState(twins.kernel_params[2]).at("step").item<double>(), 5.0);
}

TEST(OptimizerTest, CpuKernelStateRoundTripsThroughImportState) {
  // A checkpoint written by the kernel path resumes on the LibTorch path and vice versa.
  TwinOptimizers twins({33, 7, 1});
  for (int64_t step = 0; step < 2; ++step) twins.Step(step, false);
  auto resumed_kernel = TwinOptimizers::Make(twins.kernel_params);
  auto resumed_torch = TwinOptimizers::Make(twins.torch_params);
  resumed_torch->UseCpuKernel(false);
  for (size_t i = 0; i < twins.kernel_params.size(); ++i) {
    ASSERT_TRUE(resumed_kernel
                    ->ImportState(twins.kernel_params[i],
                                  twins.reference->ExportState(twins.torch_params[i]))
                    .ok());
    ASSERT_TRUE(
        resumed_torch
            ->ImportState(twins.torch_params[i], twins.kernel->ExportState(twins.kernel_params[i]))
            .ok());
  }
  twins.kernel = std::move(resumed_kernel);
  twins.reference = std::move(resumed_torch);
  for (int64_t step = 2; step < 4; ++step) twins.Step(step, false);
  for (size_t i = 0; i < twins.kernel_params.size(); ++i) {
    EXPECT_TRUE(torch::equal(twins.kernel_params[i], twins.torch_params[i])) << "param " << i;
  }
}

// A clipping coefficient taken into the CPU kernel's step equals clipping the gradients first
// (ClipByNorm's _foreach_mul_), bitwise, and lasts one step; LibTorch's path says no.
TEST(OptimizerTest, GradientScaleInTheStepEqualsClippingFirst) {
  TwinOptimizers twins({1000003, 7, 1});
  twins.reference->UseCpuKernel(true);
  for (int64_t step = 0; step < 3; ++step) {
    for (size_t i = 0; i < twins.kernel_params.size(); ++i) {
      torch::Tensor g = torch::randn_like(twins.kernel_params[i]);
      twins.kernel_params[i].mutable_grad() = g.clone();
      twins.torch_params[i].mutable_grad() = g.clone();
    }
    const double coefficient = step == 1 ? 1.0 : 0.173;  // step 1: no clipping
    std::vector<torch::Tensor> grads;
    for (const torch::Tensor& p : twins.torch_params) grads.push_back(p.grad());
    if (coefficient < 1.0) at::_foreach_mul_(grads, coefficient);
    ASSERT_TRUE(
        twins.kernel->ScaleGradientsInNextStep(torch::scalar_tensor(coefficient, torch::kDouble)));
    twins.kernel->step();
    twins.reference->step();
    for (size_t i = 0; i < twins.kernel_params.size(); ++i) {
      ASSERT_TRUE(torch::equal(twins.kernel_params[i], twins.torch_params[i]))
          << "step " << step << " param " << i;
    }
  }
  FusedAdamW libtorch_path({torch::zeros({3}, torch::requires_grad())}, {});
  libtorch_path.UseCpuKernel(false);
  EXPECT_FALSE(libtorch_path.ScaleGradientsInNextStep(torch::scalar_tensor(0.5, torch::kDouble)));
  EXPECT_TRUE(libtorch_path.ScaleGradientsInNextStep(torch::Tensor())) << "cancelling always works";
}

// On CUDA the fused kernel takes the coefficient too, as a device tensor (it divides by its
// reciprocal, formed on the device): within a rounding of clipping first, for one step. Runs on
// GPU hosts only.
TEST(OptimizerTest, FusedCudaStepTakesTheClipCoefficient) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a CUDA device";
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  torch::manual_seed(11);
  std::vector<torch::Tensor> mine, clipped_first;
  for (int64_t n : {1000003, 7, 1}) {
    torch::Tensor p = torch::randn({n}, cuda);
    mine.push_back(p.clone().requires_grad_());
    clipped_first.push_back(p.clone().requires_grad_());
  }
  auto scaled = TwinOptimizers::Make(mine);
  auto reference = TwinOptimizers::Make(clipped_first);
  for (int64_t step = 0; step < 3; ++step) {
    std::vector<torch::Tensor> grads;
    for (size_t i = 0; i < mine.size(); ++i) {
      torch::Tensor g = torch::randn_like(mine[i]);
      mine[i].mutable_grad() = g.clone();
      clipped_first[i].mutable_grad() = g.clone();
      grads.push_back(clipped_first[i].grad());
    }
    const double coefficient = step == 1 ? 1.0 : 0.173;
    if (coefficient < 1.0) at::_foreach_mul_(grads, coefficient);
    ASSERT_TRUE(scaled->ScaleGradientsInNextStep(
        torch::scalar_tensor(coefficient, cuda.dtype(torch::kDouble))));
    scaled->step();
    reference->step();
    for (size_t i = 0; i < mine.size(); ++i) {
      ASSERT_TRUE(torch::allclose(mine[i], clipped_first[i], 1e-6, 1e-7))
          << "step " << step << " param " << i << ": "
          << (mine[i] - clipped_first[i]).abs().max().item<double>();
      auto a = scaled->ExportState(mine[i]), b = reference->ExportState(clipped_first[i]);
      ASSERT_TRUE(torch::allclose(a.at("exp_avg_sq"), b.at("exp_avg_sq"), 1e-5, 1e-12));
    }
  }
  for (size_t i = 0; i < mine.size(); ++i) {  // the scale lasted one step
    torch::Tensor g = torch::randn_like(mine[i]);
    mine[i].mutable_grad() = g.clone();
    clipped_first[i].mutable_grad() = g.clone();
  }
  scaled->step();
  reference->step();
  for (size_t i = 0; i < mine.size(); ++i) {
    EXPECT_TRUE(torch::allclose(mine[i], clipped_first[i], 1e-6, 1e-7)) << "param " << i;
  }
}

// On the CPU kernel's path a step can report each parameter once, in the order of their
// addresses, each already holding its final value; the values are those of a step that reports
// nothing, and the report lasts one step. LibTorch's path says no.
TEST(OptimizerTest, CpuKernelReportsEachParameterInAddressOrderOnce) {
  TwinOptimizers twins({1000003, 7, 1});
  twins.reference->UseCpuKernel(true);
  for (size_t i = 0; i < twins.kernel_params.size(); ++i) {
    twins.kernel_params[i].mutable_grad() =
        i == 1 ? torch::Tensor() : torch::randn_like(twins.kernel_params[i]);
    twins.torch_params[i].mutable_grad() = twins.kernel_params[i].grad().defined()
                                               ? twins.kernel_params[i].grad().clone()
                                               : torch::Tensor();
  }
  twins.reference->step();
  std::vector<const void*> seen;
  std::vector<torch::Tensor> at_report;
  ASSERT_TRUE(twins.kernel->ReportEachParameterInNextStep([&](const torch::Tensor& p) {
    seen.push_back(p.data_ptr());
    at_report.push_back(p.detach().clone());
  }));
  twins.kernel->step();
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_TRUE(std::is_sorted(seen.begin(), seen.end(), std::less<const void*>()));
  for (size_t i = 0; i < twins.kernel_params.size(); ++i) {
    EXPECT_TRUE(torch::equal(twins.kernel_params[i], twins.torch_params[i])) << "param " << i;
    auto it = std::find(seen.begin(), seen.end(), twins.kernel_params[i].data_ptr());
    ASSERT_NE(it, seen.end()) << "param " << i;
    EXPECT_TRUE(torch::equal(at_report[it - seen.begin()], twins.kernel_params[i])) << i;
  }
  twins.kernel->step();  // the next step reports nothing
  EXPECT_EQ(seen.size(), 3u);
  FusedAdamW libtorch_path({torch::zeros({3}, torch::requires_grad())}, {});
  libtorch_path.UseCpuKernel(false);
  EXPECT_FALSE(libtorch_path.ReportEachParameterInNextStep([](const torch::Tensor&) {}));
}

// The CPU kernel's step can also leave each new value rounded to bf16 where the caller says
// (a parameter with no gradient copied as it is, one with no copy skipped), for one step; a copy
// of the wrong dtype is refused.
TEST(OptimizerTest, CpuKernelWritesTheBf16CopiesItIsGiven) {
  TwinOptimizers twins({1000003, 7, 1});
  std::vector<torch::Tensor> copies;
  for (size_t i = 0; i < twins.kernel_params.size(); ++i) {
    copies.push_back(torch::full({twins.kernel_params[i].numel()}, 9.0, torch::kBFloat16));
    twins.kernel_params[i].mutable_grad() =
        i == 1 ? torch::Tensor() : torch::randn_like(twins.kernel_params[i]);
  }
  const auto copy_of = [&](const torch::Tensor& p) {
    for (size_t i = 0; i < 2; ++i) {
      if (p.is_same(twins.kernel_params[i])) return copies[i];
    }
    return torch::Tensor();  // the last parameter: no copy
  };
  ASSERT_TRUE(twins.kernel->WriteBf16CopiesInNextStep(copy_of));
  twins.kernel->step();
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_TRUE(torch::equal(copies[i], twins.kernel_params[i].to(torch::kBFloat16))) << i;
  }
  EXPECT_TRUE(torch::equal(copies[2], torch::full({1}, 9.0, torch::kBFloat16)));
  copies[0].fill_(9.0);
  twins.kernel->step();  // the next step writes none
  EXPECT_TRUE(torch::equal(copies[0], torch::full_like(copies[0], 9.0)));
  ASSERT_TRUE(twins.kernel->WriteBf16CopiesInNextStep(
      [&](const torch::Tensor& p) { return torch::empty({p.numel()}); }));  // fp32: refused
  EXPECT_THROW(twins.kernel->step(), c10::Error);
}

// On CUDA with the CUDA kernels: fp32 parameters with bf16 gradients step through our kernel
// (kernels/cuda_adamw.h), which reads them as they are and writes the bf16 copies it is given,
// as PyTorch's fused kernel on the widened gradients would (within a few ulp); a bf16 model's
// parameters still step through PyTorch's kernel.
TEST(OptimizerTest, CudaStepReadsBf16GradientsOfFp32ParametersAndWritesCopies) {
  if (!torch::cuda::is_available() || !kernels::CudaAdamWBuilt()) {
    GTEST_SKIP() << "needs a CUDA device and a build with the CUDA kernels";
  }
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  torch::manual_seed(13);
  std::vector<torch::Tensor> mine, widened, copies;
  for (int64_t n : {100003, 7, 1}) {
    torch::Tensor p = torch::randn({n}, cuda);
    mine.push_back(p.clone().requires_grad_());
    widened.push_back(p.clone().requires_grad_());
    copies.push_back(torch::zeros({n}, cuda.dtype(torch::kBFloat16)));
  }
  auto ours = TwinOptimizers::Make(mine);
  auto pytorchs = TwinOptimizers::Make(widened);
  EXPECT_TRUE(ours->ReadsBf16Gradients());
  for (int step = 0; step < 3; ++step) {
    for (size_t i = 0; i < mine.size(); ++i) {
      const torch::Tensor g = torch::randn_like(mine[i]).to(torch::kBFloat16);
      mine[i].mutable_grad() = g;
      widened[i].mutable_grad() = g.to(torch::kFloat);
    }
    const torch::Tensor half = torch::scalar_tensor(0.5, cuda.dtype(torch::kDouble));
    ASSERT_TRUE(ours->ScaleGradientsInNextStep(half));
    ASSERT_TRUE(pytorchs->ScaleGradientsInNextStep(half));
    ASSERT_TRUE(ours->WriteBf16CopiesInNextStep([&](const torch::Tensor& p) {
      for (size_t i = 0; i < mine.size(); ++i) {
        if (p.is_same(mine[i])) return copies[i];
      }
      return torch::Tensor();
    }));
    ours->step();
    pytorchs->step();
    for (size_t i = 0; i < mine.size(); ++i) {
      EXPECT_TRUE(torch::allclose(mine[i], widened[i], 1e-6, 1e-7)) << "step " << step << ", " << i;
      EXPECT_TRUE(torch::equal(copies[i], mine[i].detach().to(torch::kBFloat16)));
      EXPECT_EQ(mine[i].grad().scalar_type(), torch::kBFloat16) << "read, not widened in place";
    }
  }
  std::vector<torch::Tensor> bf16_model;
  for (const torch::Tensor& p : widened) {
    bf16_model.push_back(p.detach().to(torch::kBFloat16).requires_grad_());
  }
  auto bf16_optimizer = TwinOptimizers::Make(bf16_model);
  EXPECT_FALSE(bf16_optimizer->ReadsBf16Gradients()) << "a bf16 model is PyTorch's kernel's";
  for (torch::Tensor& p : bf16_model) p.mutable_grad() = torch::randn_like(p);
  const torch::Tensor before = bf16_model[0].detach().clone();
  bf16_optimizer->step();
  EXPECT_FALSE(torch::equal(before, bf16_model[0])) << "it stepped";
}

TEST(OptimizerTest, NonContiguousParameterFallsBackToLibTorch) {
  torch::Tensor base = torch::randn({4, 6});
  torch::Tensor strided = base.t().detach().requires_grad_();  // not contiguous
  torch::Tensor copy = strided.detach().clone().requires_grad_();
  const torch::Tensor before = copy.detach().clone();
  FusedAdamW mine({strided}, torch::optim::AdamWOptions(0.01).weight_decay(0.1));
  torch::optim::AdamW theirs({copy}, torch::optim::AdamWOptions(0.01).weight_decay(0.1));
  torch::Tensor g = torch::randn({6, 4});
  strided.mutable_grad() = g.clone();
  copy.mutable_grad() = g.clone();
  mine.step();
  theirs.step();
  // The kernel on this storage would pair elements with the wrong gradients.
  EXPECT_TRUE(torch::equal(strided, copy));
  EXPECT_FALSE(torch::equal(copy, before));  // the step moved it
}

}  // namespace
}  // namespace cpptrain
