// GatedDown against the path it replaces (the activation, then at::linear): values and every
// input's gradient, with and without a bias, SwiGLU and GeGLU, fp32 and under bf16 autocast, on
// the CPU (the references) and, where the CUDA kernels run, on the GPU, where it must also hold
// one product's bytes less from the forward to the backward and hand SplitLinear dgate and dup
// side by side.
#include "models/gated_down.h"

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/types.h>

#include <optional>
#include <string>
#include <vector>

#include "base/torch_compat.h"
#include "kernels/fused_ops.h"
#include "models/split_linear.h"

namespace cpptrain {
namespace {

struct Case {
  bool gelu = false;
  bool bias = false;
  bool fused = false;
};

std::string Name(const Case& c) {
  return std::string(c.gelu ? "GeGLU" : "SwiGLU") + (c.bias ? " with bias" : "") +
         (c.fused ? " fused" : "");
}

// Leaves gate, up [2, 5, inter], weight [hidden, inter] and (c.bias) bias [hidden] of
// `options`, the same values for every call with the same seed.
std::vector<at::Tensor> Leaves(const Case& c, const torch::TensorOptions& options,
                               int64_t inter = 24, int64_t hidden = 16) {
  torch::manual_seed(3);
  std::vector<at::Tensor> leaves = {
      (2 * torch::randn({2, 5, inter})).to(options), torch::randn({2, 5, inter}).to(options),
      (0.3 * torch::randn({hidden, inter})).to(options)};
  if (c.bias) leaves.push_back(torch::randn({hidden}).to(options));
  for (at::Tensor& leaf : leaves) leaf.requires_grad_();
  return leaves;
}

// The output followed by each leaf's gradient, back from sum(out * upstream).
std::vector<at::Tensor> RunMlp(const Case& c, const torch::TensorOptions& options, bool gated_down,
                            std::optional<at::ScalarType> autocast = std::nullopt) {
  std::vector<at::Tensor> leaves = Leaves(c, options);
  const at::Tensor bias = c.bias ? leaves[3] : at::Tensor();
  at::Tensor out;
  {
    std::optional<AutocastGuard> guard;
    if (autocast) guard.emplace(options.device().type(), *autocast);
    if (gated_down) {
      out = GatedDown(leaves[0], leaves[1], leaves[2], bias, c.gelu, c.fused);
    } else {
      const at::Tensor product = c.gelu ? kernels::GeGlu(leaves[0], leaves[1], c.fused)
                                        : kernels::SwiGlu(leaves[0], leaves[1], c.fused);
      out = at::linear(product, leaves[2], bias);
    }
  }
  torch::manual_seed(4);
  const at::Tensor upstream = torch::randn(out.sizes()).to(options.device());
  (out.to(at::kFloat) * upstream).sum().backward();
  std::vector<at::Tensor> result = {out.detach()};
  for (const at::Tensor& leaf : leaves) result.push_back(leaf.grad());
  return result;
}

// Each tensor's dtype equal and its values within `tolerance` relative (0: equal).
void ExpectMatch(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want,
                 double tolerance, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    const std::string which = what + ": tensor " + std::to_string(i) + " (0 = output)";
    ASSERT_TRUE(got[i].defined()) << which;
    EXPECT_EQ(got[i].scalar_type(), want[i].scalar_type()) << which;
    const at::Tensor a = got[i].to(at::kDouble), b = want[i].to(at::kDouble);
    const double error = (a - b).norm().item<double>() / b.norm().item<double>();
    EXPECT_LE(error, tolerance) << which;
  }
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (const bool gelu : {false, true}) {
    for (const bool bias : {false, true}) {
      for (const bool fused : {false, true}) cases.push_back({gelu, bias, fused});
    }
  }
  return cases;
}

TEST(GatedDownTest, EqualsTheActivationThenTheLinearInFp32) {
  for (const Case& c : AllCases()) {
    const auto cpu = torch::TensorOptions().dtype(at::kFloat);
    ExpectMatch(RunMlp(c, cpu, true), RunMlp(c, cpu, false), 1e-6, Name(c));
  }
}

// fp32 leaves under bf16 autocast: the matmuls in bf16 as at::linear's, the gradients back in
// fp32.
TEST(GatedDownTest, UnderAutocastMatchesTheLinearAndGivesGradientsInTheLeavesDtype) {
  for (const Case& c : AllCases()) {
    const auto cpu = torch::TensorOptions().dtype(at::kFloat);
    ExpectMatch(RunMlp(c, cpu, true, at::kBFloat16), RunMlp(c, cpu, false, at::kBFloat16), 1e-6,
                Name(c) + " under autocast");
  }
}

// A frozen down_proj (weight and bias without gradients): gate and up still get theirs, the
// weight and bias none.
TEST(GatedDownTest, AFrozenWeightGetsNoGradientAndTheInputsStillDo) {
  for (const Case& c : AllCases()) {
    if (!c.bias) continue;
    const auto cpu = torch::TensorOptions().dtype(at::kFloat);
    std::vector<at::Tensor> leaves = Leaves(c, cpu);
    leaves[2].requires_grad_(false);
    leaves[3].requires_grad_(false);
    GatedDown(leaves[0], leaves[1], leaves[2], leaves[3], c.gelu, c.fused).sum().backward();
    std::vector<at::Tensor> want = Leaves(c, cpu);
    at::linear(c.gelu ? kernels::GeGluReference(want[0], want[1])
                      : kernels::SwiGluReference(want[0], want[1]),
               want[2].detach(), want[3].detach())
        .sum()
        .backward();
    EXPECT_FALSE(leaves[2].grad().defined()) << Name(c);
    EXPECT_FALSE(leaves[3].grad().defined()) << Name(c);
    EXPECT_TRUE(leaves[0].grad().allclose(want[0].grad(), 1e-6, 1e-7)) << Name(c);
    EXPECT_TRUE(leaves[1].grad().allclose(want[1].grad(), 1e-6, 1e-7)) << Name(c);
  }
}

TEST(GatedDownTest, RefusesShapesThatDoNotFit) {
  const at::Tensor gate = torch::randn({3, 8}), w = torch::randn({4, 8});
  EXPECT_THROW(GatedDown(gate, torch::randn({3, 7}), w, {}, false, false), c10::Error);
  EXPECT_THROW(GatedDown(gate, gate, torch::randn({4, 7}), {}, false, false), c10::Error);
  EXPECT_THROW(GatedDown(gate, gate, w, torch::randn({5}), false, false), c10::Error);
}

std::optional<std::string> WhyNoKernels() {
  if (kernels::CudaKernelsBuilt() && torch::cuda::is_available()) return std::nullopt;
  return std::string("the fused gated kernels need a CUDA build (CMake with nvcc) and a GPU; ") +
         "this machine has " + (kernels::CudaKernelsBuilt() ? "no GPU" : "neither");
}

// bf16 on the GPU: the kernel path's values and gradients, and one [2, 5, inter] product fewer
// held by the graph between forward and backward.
TEST(GatedDownTest, OnTheGpuMatchesTheKernelPathAndHoldsNoProduct) {
  if (const std::optional<std::string> why = WhyNoKernels()) GTEST_SKIP() << *why;
  const auto bf16 = torch::TensorOptions().dtype(at::kBFloat16).device(torch::kCUDA, 0);
  const auto f32 = bf16.dtype(at::kFloat);
  for (const Case& c : AllCases()) {
    if (!c.fused) continue;
    ExpectMatch(RunMlp(c, bf16, true), RunMlp(c, bf16, false), 1e-2, Name(c));
    // fp32 gate and up (the kernels in fp32, the product cast for the bf16 matmul).
    ExpectMatch(RunMlp(c, f32, true, at::kBFloat16), RunMlp(c, f32, false, at::kBFloat16), 1e-2,
                Name(c) + ", fp32 leaves under bf16 autocast");
    // What stays allocated while the graph is alive, beyond the leaves and the output.
    auto held = [&](bool gated_down) {
      std::vector<at::Tensor> leaves = Leaves(c, bf16, 4096, 256);
      const at::Tensor bias = c.bias ? leaves[3] : at::Tensor();
      const int64_t before = AllocatedBytes(leaves[0].device());
      at::Tensor out;  // alive, with its graph, until the count below
      if (gated_down) {
        out = GatedDown(leaves[0], leaves[1], leaves[2], bias, c.gelu, true);
      } else {
        out = at::linear(c.gelu ? kernels::GeGlu(leaves[0], leaves[1], true)
                                : kernels::SwiGlu(leaves[0], leaves[1], true),
                         leaves[2], bias);
      }
      return AllocatedBytes(leaves[0].device()) - before;
    };
    held(false);  // once first, so the matmul library's workspaces exist before counting
    const int64_t product_bytes = 2 * 5 * 4096 * 2;
    EXPECT_EQ(held(false) - held(true), product_bytes) << Name(c);
  }
}

// SplitLinear's gate and up into GatedDown: its backward hands dgate and dup back side by side,
// so the projection's input gradient is one matmul.
TEST(GatedDownTest, OnTheGpuSplitLinearTakesTheStackedPath) {
  if (const std::optional<std::string> why = WhyNoKernels()) GTEST_SKIP() << *why;
  const auto bf16 = torch::TensorOptions().dtype(at::kBFloat16).device(torch::kCUDA, 0);
  torch::manual_seed(8);
  const at::Tensor x = torch::randn({2, 7, 64}, bf16).requires_grad_();
  const at::Tensor both = (0.2 * torch::randn({2 * 96, 64}, bf16)).requires_grad_();
  const at::Tensor down = (0.2 * torch::randn({64, 96}, bf16)).requires_grad_();
  const std::vector<at::Tensor> gate_up =
      SplitLinear(x, {both.narrow(0, 0, 96), both.narrow(0, 96, 96)}, {});
  const int64_t before = SplitLinearStackedInputGradients();
  GatedDown(gate_up[0], gate_up[1], down, {}, false, true).to(at::kFloat).sum().backward();
  EXPECT_EQ(SplitLinearStackedInputGradients(), before + 1);
}

}  // namespace
}  // namespace cpptrain
