// CudaAdamWStep against torch::optim::AdamW (per-parameter, on fp32 gradients) on the GPU:
// more tensors than one launch takes, odd sizes, lists off the 16-byte alignment beside aligned
// ones, fp32 and bf16 gradients, weight decay, a device coefficient and learning rate, the bf16
// copies; then both timed on a large tensor (printed, not asserted: speed is for tools/bench).
// Without a GPU and a CUDA build those cases print SKIPPED; the CPU case checks that such a
// build refuses clearly.
#include "kernels/cuda_adamw.h"

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/optim/adamw.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "base/torch_compat.h"

namespace cpptrain {
namespace kernels {
namespace {

bool RunsHere() { return CudaAdamWBuilt() && torch::cuda::is_available(); }

#define REQUIRE_GPU()                                                                      \
  if (!RunsHere()) {                                                                       \
    GTEST_SKIP() << "CudaAdamWStep needs a CUDA build (CMake with nvcc) and a GPU; this " \
                 << "machine has " << (CudaAdamWBuilt() ? "no GPU" : "a build without it"); \
  }

// max |a - b| / max |b| over the whole tensor, in double.
double RelativeError(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor a64 = a.detach().to(at::kCPU, at::kDouble);
  const at::Tensor b64 = b.detach().to(at::kCPU, at::kDouble);
  const double scale = b64.abs().max().item<double>();
  const double difference = (a64 - b64).abs().max().item<double>();
  return scale == 0 ? difference : difference / scale;
}

struct Case {
  std::vector<int64_t> sizes;
  at::ScalarType grad_type;
  bool coefficient, device_lr, copies;
  bool misaligned = false;  // every other tensor's lists start one value into their buffers
};

// t's values in a tensor that starts one value into a buffer of its dtype when `shift`: its
// address is then off the 16-byte vector alignment, and the kernel must step value by value.
at::Tensor Shifted(const at::Tensor& t, bool shift) {
  if (!shift) return t;
  const int64_t n = t.numel();
  return torch::empty({n + 1}, t.options()).narrow(0, 1, n).copy_(t);
}

// Three steps of both on the same values; each step's gradients are new random values.
void RunCase(const Case& c) {
  const c10::Device cuda(c10::kCUDA, 0);
  const auto f32 = torch::TensorOptions().device(cuda).dtype(at::kFloat);
  torch::manual_seed(7);
  CudaAdamWLists lists;
  std::vector<torch::Tensor> reference;
  for (size_t i = 0; i < c.sizes.size(); ++i) {
    const int64_t n = c.sizes[i];
    const bool shift = c.misaligned && i % 2 == 1;
    at::Tensor p = torch::randn({n}, f32);
    lists.params.push_back(Shifted(p.clone(), shift));
    reference.push_back(p.clone().requires_grad_(true));
    lists.exp_avgs.push_back(Shifted(torch::zeros({n}, f32), shift));
    lists.exp_avg_sqs.push_back(Shifted(torch::zeros({n}, f32), shift));
    lists.steps.push_back(torch::zeros({}, f32));
    if (c.copies) {
      lists.bf16_copies.push_back(Shifted(torch::empty({n}, f32.dtype(at::kBFloat16)), shift));
    }
  }
  const double lr = 3e-3, weight_decay = 0.1, coefficient = 0.37;
  torch::optim::AdamW torch_adamw(
      reference, torch::optim::AdamWOptions(lr).betas({0.9, 0.95}).eps(1e-8).weight_decay(
                     weight_decay));
  CudaAdamWOptions options;
  options.lr = c.device_lr ? 123.0 : lr;  // the device value must win
  if (c.device_lr) options.device_lr = torch::full({}, lr, f32);
  options.beta1 = 0.9;
  options.beta2 = 0.95;
  options.eps = 1e-8;
  options.weight_decay = weight_decay;
  if (c.coefficient) {
    options.grad_coefficient = torch::full({}, coefficient, f32.dtype(at::kDouble));
  }
  for (int step = 0; step < 3; ++step) {
    lists.grads.clear();
    for (size_t i = 0; i < c.sizes.size(); ++i) {
      const at::Tensor g =
          Shifted(torch::randn({c.sizes[i]}, f32).to(c.grad_type), c.misaligned && i % 2 == 1);
      lists.grads.push_back(g);
      reference[i].mutable_grad() = g.to(at::kFloat) * (c.coefficient ? coefficient : 1.0);
    }
    CudaAdamWStep(lists, options);
    torch_adamw.step();
  }
  for (size_t i = 0; i < c.sizes.size(); ++i) {
    SCOPED_TRACE(testing::Message() << "tensor " << i << " of " << c.sizes[i] << " values");
    EXPECT_LT(RelativeError(lists.params[i], reference[i]), 1e-5);
    EXPECT_EQ(lists.steps[i].item<float>(), 3.f);
    if (c.copies) {
      EXPECT_TRUE(torch::equal(lists.bf16_copies[i], lists.params[i].to(at::kBFloat16)));
    }
  }
}

std::vector<int64_t> OddSizes() {
  std::vector<int64_t> sizes;  // 41 tensors: two launches of the kernel
  for (int i = 0; i < 41; ++i) sizes.push_back(1 + (i * 7919) % 5000 + (i % 5 == 0 ? 70001 : 0));
  return sizes;
}

TEST(CudaAdamWTest, Fp32GradientsMatchTorchAdamW) {
  REQUIRE_GPU();
  RunCase({OddSizes(), at::kFloat, false, false, false});
}

TEST(CudaAdamWTest, Bf16GradientsCoefficientDeviceLrAndCopies) {
  REQUIRE_GPU();
  RunCase({OddSizes(), at::kBFloat16, true, true, true});
  RunCase({{1, 2, 3, 1024, 1025}, at::kFloat, true, false, true});
}

// Lists that start off the 16-byte alignment (views into flat buffers, as ZeRO's shards are)
// beside aligned ones in the same launch: the kernel's value-by-value path and its vector path.
TEST(CudaAdamWTest, MisalignedListsMatchTorchAdamW) {
  REQUIRE_GPU();
  RunCase({OddSizes(), at::kBFloat16, true, false, true, /*misaligned=*/true});
  RunCase({{5, 8, 1023, 4096, 4097, 4100}, at::kFloat, false, true, true, /*misaligned=*/true});
}

TEST(CudaAdamWTest, BadListsAreRefusedByName) {
  REQUIRE_GPU();
  const auto f32 = torch::TensorOptions().device(c10::kCUDA).dtype(at::kFloat);
  CudaAdamWLists lists{{torch::zeros({4}, f32)}, {torch::zeros({5}, f32)},
                       {torch::zeros({4}, f32)}, {torch::zeros({4}, f32)},
                       {torch::zeros({}, f32)}, {}};
  try {
    CudaAdamWStep(lists, {});
    FAIL() << "a gradient of the wrong size was taken";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("grads[0]"), std::string::npos) << e.what();
  }
}

// Prints the time of one step over 2^27 values each way (the llm.c dev/cuda pattern's last part).
TEST(CudaAdamWTest, TimedAgainstPyTorchsFusedAdamW) {
  REQUIRE_GPU();
  const int64_t n = int64_t{1} << 27;
  const auto f32 = torch::TensorOptions().device(c10::kCUDA).dtype(at::kFloat);
  CudaAdamWLists lists{{torch::randn({n}, f32)}, {torch::randn({n}, f32).to(at::kBFloat16)},
                       {torch::zeros({n}, f32)}, {torch::zeros({n}, f32)},
                       {torch::zeros({}, f32)}, {torch::empty({n}, f32.dtype(at::kBFloat16))}};
  auto time_ms = [](const std::function<void()>& f) {
    for (int i = 0; i < 3; ++i) f();
    torch::cuda::synchronize();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < 10; ++i) f();
    torch::cuda::synchronize();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
               .count() / 10;
  };
  const double ours = time_ms([&] { CudaAdamWStep(lists, {}); });
  // PyTorch's path for the same work: widen the gradient, fused AdamW, round the copy.
  std::vector<at::Tensor> p{lists.params[0]}, m{lists.exp_avgs[0]}, v{lists.exp_avg_sqs[0]},
      s{lists.steps[0]};
  const double theirs = time_ms([&] {
    std::vector<at::Tensor> g{lists.grads[0].to(at::kFloat)};
    ASSERT_TRUE(FusedAdamWStep(p, g, m, v, s, 1e-3, 0.9, 0.999, 0.0, 1e-8, {}, {}));
    lists.bf16_copies[0].copy_(lists.params[0]);
  });
  std::printf("CudaAdamWStep, 2^27 values, bf16 gradient and copy: %.3f ms (%.0f GB/s at 28 "
              "bytes a value); widen + _fused_adamw_ + copy: %.3f ms\n",
              ours, 28.0 * n / ours / 1e6, theirs);
  EXPECT_GT(ours, 0);
}

TEST(CudaAdamWTest, ABuildWithoutTheKernelRefusesClearly) {
  if (CudaAdamWBuilt()) GTEST_SKIP() << "this build has the kernel (the GPU cases test it)";
  CudaAdamWLists lists{{torch::zeros({2})}, {torch::zeros({2})}, {torch::zeros({2})},
                       {torch::zeros({2})}, {torch::zeros({})}, {}};
  try {
    CudaAdamWStep(lists, {});
    FAIL() << "a build without CUDA kernels stepped";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA kernels"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kernels
}  // namespace cpptrain
