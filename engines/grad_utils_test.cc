// Clipping by a norm kept on the device gives what clipping by its host value gives: the
// coefficient bit for bit, and the scaled gradients bit for bit (fp32).
#include "engines/grad_utils.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/types.h>
#include <torch/utils.h>

namespace cpptrain {
namespace {

TEST(GradUtilsTest, CoefficientTensorIsTheHostCoefficientClampedAtOne) {
  for (double max_norm : {1.0, 0.3, 7.5}) {
    for (float norm : {0.0f, 1e-7f, 0.29999f, 0.3f, 0.5f, 0.9999999f, 1.0f, 3.7f, 1e10f}) {
      const at::Tensor on_device = ClipCoefficient(torch::full({}, norm), max_norm);
      EXPECT_EQ(on_device.scalar_type(), torch::kDouble);
      EXPECT_EQ(on_device.dim(), 0);
      const double host = std::min(ClipCoefficient(static_cast<double>(norm), max_norm), 1.0);
      EXPECT_EQ(on_device.item<double>(), host) << "norm " << norm << " max_norm " << max_norm;
    }
  }
  // A one-element [1] norm (an all-reduced sum's shape) is accepted too.
  EXPECT_EQ(ClipCoefficient(torch::full({1}, 2.0f), 1.0).item<double>(), ClipCoefficient(2.0, 1.0));
}

// bf16 gradients (the local engine's, kept as they came) count in fp32: the norm is not rounded
// to bf16, and a mixed list (some widened by accumulation) sums both kinds.
TEST(GradUtilsTest, GlobalNormOfBf16GradientsIsReducedInFp32) {
  torch::manual_seed(9);
  const at::Tensor a = torch::randn({1001}).to(torch::kBFloat16);
  const at::Tensor b = torch::randn({37});
  const double a2 = a.to(torch::kDouble).pow(2).sum().item<double>();
  const double b2 = b.to(torch::kDouble).pow(2).sum().item<double>();
  const at::Tensor norm = GlobalNorm({a});
  EXPECT_EQ(norm.scalar_type(), torch::kFloat);
  EXPECT_NEAR(norm.item<double>(), std::sqrt(a2), std::sqrt(a2) * 1e-6);
  EXPECT_NE(norm.item<float>(), norm.to(torch::kBFloat16).item<float>()) << "not rounded to bf16";
  EXPECT_NEAR(GlobalNorm({a, b}).item<double>(), std::sqrt(a2 + b2), std::sqrt(a2 + b2) * 1e-6);
}

std::vector<at::Tensor> RandomGradients(c10::Device device, at::ScalarType dtype) {
  torch::manual_seed(5);
  std::vector<at::Tensor> grads;
  for (int64_t n : {1000003, 17, 1}) {
    grads.push_back(torch::randn({n}, torch::TensorOptions().device(device)).to(dtype));
  }
  return grads;
}

std::vector<at::Tensor> Clones(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& t : tensors) out.push_back(t.clone());
  return out;
}

void ExpectScaleGradientsEqualsClipByNorm(c10::Device device, at::ScalarType dtype) {
  for (double max_norm : {0.5, 1e6}) {  // clipping, and a coefficient of exactly 1
    std::vector<at::Tensor> by_host = RandomGradients(device, dtype);
    std::vector<at::Tensor> by_tensor = Clones(by_host);
    const at::Tensor norm = GlobalNorm(by_host);
    ClipByNorm(by_host, norm.item<double>(), max_norm);
    ScaleGradients(by_tensor, ClipCoefficient(norm, max_norm));
    for (size_t i = 0; i < by_host.size(); ++i) {
      EXPECT_TRUE(torch::equal(by_tensor[i], by_host[i]))
          << "tensor " << i << " max_norm " << max_norm << " on " << device << " " << dtype;
    }
  }
}

TEST(GradUtilsTest, ScaleGradientsEqualsClipByNormOnTheCpu) {
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    ExpectScaleGradientsEqualsClipByNorm(c10::Device(c10::kCPU), dtype);
  }
}

// On a device the coefficient is read there (fp32 gradients by a multi-tensor kernel, bf16 ones
// through an fp32 product): still ClipByNorm's bits.
TEST(GradUtilsTest, ScaleGradientsEqualsClipByNormOnCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a CUDA device";
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    ExpectScaleGradientsEqualsClipByNorm(c10::Device(c10::kCUDA, 0), dtype);
  }
}

}  // namespace
}  // namespace cpptrain
