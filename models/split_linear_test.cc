#include "models/split_linear.h"

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/types.h>

#include <functional>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "base/torch_compat.h"
#include "kernels/fused_ops.h"

namespace cpptrain {
namespace {

const std::vector<int64_t> kSizes = {12, 4, 4};  // q, k, v of 3 heads and 1 kv head of 4

struct Result {
  std::vector<at::Tensor> outputs;
  at::Tensor dx, dw, db;
};

// Runs `project` on fresh leaves x, w (and b), back from sum(out_i * g_i) over the blocks named
// in `used` (the others get no gradient), and returns the outputs and the leaves' gradients.
template <typename Project>
Result RunBlocks(Project project, torch::Device device, bool bias, std::vector<bool> used,
           std::optional<at::ScalarType> autocast = std::nullopt) {
  torch::manual_seed(0);
  const auto options = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  at::Tensor x = torch::randn({2, 5, 8}, options).requires_grad_();
  at::Tensor w = (torch::randn({20, 8}, options) * 0.3).requires_grad_();
  at::Tensor b = bias ? torch::randn({20}, options).requires_grad_() : at::Tensor();
  Result r;
  {
    std::optional<AutocastGuard> guard;
    if (autocast) guard.emplace(device.type(), *autocast);
    r.outputs = project(x, w, b);
  }
  at::Tensor loss = torch::zeros({}, options);
  for (size_t i = 0; i < r.outputs.size(); ++i) {
    if (!used[i]) continue;
    torch::manual_seed(10 + static_cast<int64_t>(i));
    loss = loss + (r.outputs[i].to(torch::kFloat32) *
                   torch::randn(r.outputs[i].sizes(), options)).sum();
  }
  loss.backward();
  r.dx = x.grad();
  r.dw = w.grad();
  if (bias) r.db = b.grad();
  for (at::Tensor& out : r.outputs) out = out.detach();
  return r;
}

std::vector<at::Tensor> Split(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  return SplitLinear(x, w, b, kSizes);
}

// The same blocks as weights (and biases) of their own, as Llama's q_proj, k_proj and v_proj
// are: views of the stacked leaves, so the leaves' gradients gather theirs.
std::vector<at::Tensor> Separate(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  std::vector<at::Tensor> weights, biases;
  int64_t offset = 0;
  for (const int64_t size : kSizes) {
    weights.push_back(w.narrow(0, offset, size));
    if (b.defined()) biases.push_back(b.narrow(0, offset, size));
    offset += size;
  }
  return SplitLinear(x, weights, biases);
}

using Project = std::vector<at::Tensor> (*)(const at::Tensor&, const at::Tensor&,
                                            const at::Tensor&);
const std::vector<std::pair<std::string, Project>> kForms = {{"stacked", Split},
                                                            {"separate", Separate}};

// The reference: one linear, its output sliced.
std::vector<at::Tensor> Sliced(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  return at::linear(x, w, b).split_with_sizes(kSizes, -1);
}

void ExpectClose(const at::Tensor& got, const at::Tensor& want, double tolerance,
                 const std::string& what) {
  ASSERT_EQ(got.defined(), want.defined()) << what;
  if (!got.defined()) return;
  EXPECT_EQ(got.scalar_type(), want.scalar_type()) << what;
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const double scale = want.to(torch::kFloat64).abs().max().item<double>() + 1e-12;
  EXPECT_LE((got.to(torch::kFloat64) - want.to(torch::kFloat64)).abs().max().item<double>(),
            tolerance * scale)
      << what;
}

void ExpectSame(const Result& got, const Result& want, double tolerance, const std::string& what) {
  ASSERT_EQ(got.outputs.size(), want.outputs.size());
  for (size_t i = 0; i < got.outputs.size(); ++i) {
    EXPECT_TRUE(got.outputs[i].is_contiguous()) << what << ": block " << i;
    ExpectClose(got.outputs[i], want.outputs[i], tolerance, what + ": block " + std::to_string(i));
  }
  ExpectClose(got.dx, want.dx, tolerance, what + ": dx");
  ExpectClose(got.dw, want.dw, tolerance, what + ": dw");
  ExpectClose(got.db, want.db, tolerance, what + ": db");
}

std::vector<torch::Device> Devices() {
  std::vector<torch::Device> devices = {torch::kCPU};
  if (torch::cuda::is_available()) devices.emplace_back(torch::kCUDA, 0);
  return devices;
}

TEST(SplitLinearTest, EqualsOneLinearSlicedWithAndWithoutBias) {
  for (const torch::Device device : Devices()) {
    for (const auto& [form, project] : kForms) {
      for (const bool bias : {true, false}) {
        const std::string what =
            device.str() + " " + form + (bias ? " with bias" : " without bias");
        const Result got = RunBlocks(project, device, bias, {true, true, true});
        ExpectSame(got, RunBlocks(Sliced, device, bias, {true, true, true}), 1e-5, what);
        ASSERT_EQ(got.outputs[0].sizes(), (std::vector<int64_t>{2, 5, 12})) << what;
      }
    }
  }
}

TEST(SplitLinearTest, ABlockWithoutGradientGivesZeroRows) {
  for (const torch::Device device : Devices()) {
    for (const auto& [form, project] : kForms) {
      const std::string what = device.str() + " " + form;
      const Result got = RunBlocks(project, device, true, {true, false, true});
      ExpectSame(got, RunBlocks(Sliced, device, true, {true, false, true}), 1e-5, what);
      EXPECT_EQ(got.dw.narrow(0, 12, 4).abs().max().item<double>(), 0.0) << what;
      EXPECT_EQ(got.db.narrow(0, 12, 4).abs().max().item<double>(), 0.0) << what;
      EXPECT_GT(got.dw.narrow(0, 16, 4).abs().max().item<double>(), 0.0) << what;
    }
  }
}

TEST(SplitLinearTest, UnderAutocastComputesInItsDtypeAndReturnsGradientsInTheLeaves) {
  for (const torch::Device device : Devices()) {
    for (const auto& [form, project] : kForms) {
      const std::string what = device.str() + " " + form + " bf16 autocast";
      const Result got = RunBlocks(project, device, true, {true, true, true}, torch::kBFloat16);
      EXPECT_EQ(got.outputs[0].scalar_type(), torch::kBFloat16) << what;
      ExpectSame(got, RunBlocks(Sliced, device, true, {true, true, true}, torch::kBFloat16), 1e-2,
                 what);
    }
  }
}

// The blocks joined again by cat: cat's backward hands each block its columns of one gradient
// buffer, side by side, as the fused SwiGLU backward returns dgate and dup.
template <typename Inner>
auto Joined(Inner inner) {
  return [inner](const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
    return std::vector<at::Tensor>{at::cat(inner(x, w, b), -1)};
  };
}

// Copies of the blocks' weights: no longer rows of one buffer.
std::vector<at::Tensor> Apart(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  std::vector<at::Tensor> weights;
  int64_t offset = 0;
  for (const int64_t size : kSizes) {
    weights.push_back(w.narrow(0, offset, size).clone());
    offset += size;
  }
  return SplitLinear(x, weights, {});
}

TEST(SplitLinearTest, GradientsSideBySideTakeOneMatmulOverTheStackedWeight) {
  for (const torch::Device device : Devices()) {
    for (const auto& [form, project] : kForms) {
      for (const bool bias : {true, false}) {
        const std::string what = device.str() + " " + form + (bias ? " with bias" : "");
        const int64_t before = SplitLinearStackedInputGradients();
        const Result got = RunBlocks(Joined(project), device, bias, {true});
        EXPECT_EQ(SplitLinearStackedInputGradients(), before + 1) << what;
        ExpectSame(got, RunBlocks(Joined(Sliced), device, bias, {true}), 1e-5, what);
      }
    }
  }
}

TEST(SplitLinearTest, WeightsApartOrGradientsApartKeepAMatmulPerBlock) {
  for (const torch::Device device : Devices()) {
    const int64_t before = SplitLinearStackedInputGradients();
    const Result apart = RunBlocks(Joined(Apart), device, false, {true});
    ExpectSame(apart, RunBlocks(Joined(Sliced), device, false, {true}), 1e-5,
               device.str() + " weights apart");
    const Result own = RunBlocks(Separate, device, false, {true, true, true});
    ExpectSame(own, RunBlocks(Sliced, device, false, {true, true, true}), 1e-5,
               device.str() + " gradients apart");
    EXPECT_EQ(SplitLinearStackedInputGradients(), before) << device.str();
  }
}

// Why the fused `kernel` cannot run here (the reason a GPU case prints with SKIPPED), or nothing.
std::optional<std::string> WhyNoFusedKernels(const std::string& kernel) {
  if (kernels::CudaKernelsBuilt() && torch::cuda::is_available()) return std::nullopt;
  return "the fused " + kernel + " needs a CUDA build (CMake with nvcc) and a GPU; this machine " +
         "has " + (kernels::CudaKernelsBuilt() ? "no GPU" : "neither");
}

// `run(fused)` gives x's and the weights' gradients. Fused, x's must take the one-matmul path
// (the counter goes up by one); both must equal the eager run's within bf16's rounding.
void ExpectStackedPathAndEagerGradients(
    const std::function<std::pair<at::Tensor, at::Tensor>(bool fused)>& run) {
  const int64_t before = SplitLinearStackedInputGradients();
  const auto [dx, dw] = run(true);
  EXPECT_EQ(SplitLinearStackedInputGradients(), before + 1);
  const auto [want_dx, want_dw] = run(false);
  ExpectClose(dx, want_dx, 2e-2, "dx");
  ExpectClose(dw, want_dw, 2e-2, "dw");
}

// The decoder's MLP as the fused path runs it under the local engine's bf16 working copies:
// gate_proj and up_proj consecutive rows of one bf16 buffer, SplitLinear, then the fused SwiGLU,
// whose backward writes dgate and dup side by side. x's gradient must take the one-matmul path
// and equal the eager MLP's.
TEST(SplitLinearTest, FusedSwiGluBackwardTakesTheStackedPathOnTheGpu) {
  if (const std::optional<std::string> why = WhyNoFusedKernels("SwiGLU")) GTEST_SKIP() << *why;
  torch::manual_seed(5);
  const auto bf16 = torch::TensorOptions().dtype(torch::kBFloat16).device(torch::kCUDA, 0);
  const int64_t hidden = 64, inter = 96;
  const at::Tensor weights = torch::randn({2 * inter, hidden}, bf16) * 0.2;
  const at::Tensor x = torch::randn({2, 7, hidden}, bf16);
  const at::Tensor g = torch::randn({2, 7, inter}, bf16);
  auto run = [&](bool fused) {
    at::Tensor xl = x.clone().requires_grad_();
    at::Tensor both = weights.clone().requires_grad_();  // gate rows, then up rows
    const at::Tensor gate_w = both.narrow(0, 0, inter), up_w = both.narrow(0, inter, inter);
    at::Tensor out;
    if (fused) {
      const std::vector<at::Tensor> gate_up = SplitLinear(xl, {gate_w, up_w}, {});
      out = kernels::SwiGlu(gate_up[0], gate_up[1], /*fused=*/true);
    } else {
      out = kernels::SwiGluReference(at::linear(xl, gate_w), at::linear(xl, up_w));
    }
    (out.to(torch::kFloat32) * g.to(torch::kFloat32)).sum().backward();
    return std::make_pair(xl.grad(), both.grad());
  };
  ExpectStackedPathAndEagerGradients(run);
}

// The attention block as the fused path runs it under the local engine's bf16 working copies:
// q_proj, k_proj and v_proj consecutive rows of one bf16 buffer, SplitLinear, then QkvNormRope,
// whose backward writes the gradients of q, k and v side by side. x's gradient must take the
// one-matmul path and equal the eager projections' through the references.
TEST(SplitLinearTest, FusedQkvNormRopeBackwardTakesTheStackedPathOnTheGpu) {
  if (const std::optional<std::string> why = WhyNoFusedKernels("QK-norm + rotary")) {
    GTEST_SKIP() << *why;
  }
  torch::manual_seed(6);
  const auto bf16 = torch::TensorOptions().dtype(torch::kBFloat16).device(torch::kCUDA, 0);
  const auto f32 = bf16.dtype(torch::kFloat32);
  const int64_t b = 2, t = 9, hidden = 96, hq = 4, hkv = 2, d = 64;
  const at::Tensor weights = torch::randn({(hq + 2 * hkv) * d, hidden}, bf16) * 0.1;  // q, k, v
  const at::Tensor norm_weight = torch::rand({d}, f32) + 0.5;
  const at::Tensor x = torch::randn({b, t, hidden}, bf16);
  const at::Tensor angles = torch::rand({t, d}, f32) * 6;
  const at::Tensor cos = angles.cos(), sin = angles.sin();
  const std::vector<at::Tensor> g = {torch::randn({b, hq, t, d}, f32),
                                     torch::randn({b, hkv, t, d}, f32),
                                     torch::randn({b, hkv, t, d}, f32)};
  auto run = [&](bool fused) {
    at::Tensor xl = x.clone().requires_grad_();
    at::Tensor all = weights.clone().requires_grad_();
    const std::vector<at::Tensor> w = {all.narrow(0, 0, hq * d), all.narrow(0, hq * d, hkv * d),
                                       all.narrow(0, (hq + hkv) * d, hkv * d)};
    std::vector<at::Tensor> proj(3);
    if (fused) {
      proj = SplitLinear(xl, w, {});
    } else {
      for (size_t i = 0; i < 3; ++i) proj[i] = at::linear(xl, w[i]);
    }
    const at::Tensor q = proj[0].view({b, t, hq, d}), k = proj[1].view({b, t, hkv, d});
    const at::Tensor v = proj[2].view({b, t, hkv, d}).transpose(1, 2);
    std::vector<at::Tensor> out(3);
    if (fused) {
      std::tie(out[0], out[1], out[2]) = kernels::QkvNormRope(
          q, k, v, norm_weight, norm_weight, 1e-6, cos, sin, torch::kBFloat16, true);
    } else {
      out = {kernels::QkNormRopeReference(q, norm_weight, 1e-6, cos, sin, torch::kBFloat16),
             kernels::QkNormRopeReference(k, norm_weight, 1e-6, cos, sin, torch::kBFloat16), v};
    }
    at::Tensor loss = torch::zeros({}, f32);
    for (size_t i = 0; i < 3; ++i) loss = loss + (out[i].to(torch::kFloat32) * g[i]).sum();
    loss.backward();
    return std::make_pair(xl.grad(), all.grad());
  };
  ExpectStackedPathAndEagerGradients(run);
}

TEST(SplitLinearTest, OnlyTheGradientsAskedFor) {
  torch::manual_seed(0);
  const at::Tensor x = torch::randn({3, 8});  // no gradient asked
  at::Tensor w = torch::randn({20, 8}).requires_grad_();
  const std::vector<at::Tensor> out = SplitLinear(x, w, at::Tensor(), kSizes);
  (out[0].sum() + out[1].sum() + out[2].sum()).backward();
  const at::Tensor want = torch::ones({3, 20}).t().mm(x);
  EXPECT_LE((w.grad() - want).abs().max().item<double>(), 1e-5);
}

TEST(SplitLinearTest, RefusesAWeightThatDoesNotStackTheBlocks) {
  const at::Tensor x = torch::randn({3, 8});
  try {
    SplitLinear(x, torch::randn({21, 8}), at::Tensor(), kSizes);
    FAIL() << "a [21, 8] weight for blocks of 12 + 4 + 4 rows was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not stack blocks of"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(SplitLinear(x, torch::randn({20, 8}), torch::randn({19}), kSizes), c10::Error);
  // Separate weights: each must map x's 8 features, and biases come one per weight or not at all.
  EXPECT_THROW(SplitLinear(x, {torch::randn({4, 8}), torch::randn({4, 7})}, {}), c10::Error);
  EXPECT_THROW(SplitLinear(x, {torch::randn({4, 8}), torch::randn({4, 8})}, {torch::randn({4})}),
               c10::Error);
}

}  // namespace
}  // namespace cpptrain
