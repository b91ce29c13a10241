// //tools:cpu_adamw_bench: the CPU AdamW of kernels/cpu_adamw.h against torch::optim::AdamW on
// one fp32 parameter of --numel elements, for each thread count in --threads:
//
//   bazel-bin/tools/cpu_adamw_bench --numel=100000000 --threads=1,2
//
// Each step reads param, grad, exp_avg, exp_avg_sq and writes param, exp_avg, exp_avg_sq: 28
// bytes per element with fp32 gradients (24 with bf16), so GB/s = 28 * numel / seconds per
// step / 1e9. Before timing, it checks that one step of each gives the same parameters (bitwise
// on LibTorch 1.13, within kernels/cpu_adamw_agreement.h's few ulp on 2.x). --bf16_copy also
// writes the bf16 copy of the parameters in the kernel's pass (ZeRO-Offload's path; 2 bytes more
// per element, counted in its GB/s).
// Prints a table and one JSON line per row.
#include <torch/optim/adamw.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "kernels/cpu_adamw.h"
#include "kernels/cpu_adamw_agreement.h"

ABSL_FLAG(int64_t, numel, 100000000, "elements of the parameter");
ABSL_FLAG(std::string, threads, "1,2", "comma-separated intra-op thread counts");
ABSL_FLAG(int, steps, 5, "timed steps per side (after one untimed)");
ABSL_FLAG(bool, bf16_grads, false, "bf16 gradients for the kernel (LibTorch gets them widened)");
ABSL_FLAG(bool, bf16_copy, false, "the kernel also writes the parameters rounded to bf16");

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

cpptrain::kernels::AdamWHyper Hyper() {
  cpptrain::kernels::AdamWHyper h;
  h.lr = 1e-4;
  h.weight_decay = 0.01;
  return h;
}

struct Buffers {
  torch::Tensor param, grad, grad_bf16, exp_avg, exp_avg_sq, copy;
};

Buffers MakeBuffers(int64_t n) {
  torch::manual_seed(0);
  Buffers b{torch::randn({n}), torch::randn({n}), {}, torch::zeros({n}), torch::zeros({n})};
  b.grad_bf16 = b.grad.to(torch::kBFloat16);
  b.grad = b.grad_bf16.to(torch::kFloat);  // the same values on both sides
  if (absl::GetFlag(FLAGS_bf16_copy)) b.copy = torch::empty({n}, torch::kBFloat16);
  return b;
}

void KernelStep(Buffers& b, int64_t step, bool bf16) {
  auto* copy = b.copy.defined() ? reinterpret_cast<uint16_t*>(b.copy.data_ptr()) : nullptr;
  if (bf16) {
    cpptrain::kernels::CpuAdamWStep(
        {b.param.data_ptr<float>(), reinterpret_cast<const uint16_t*>(b.grad_bf16.data_ptr()),
         b.exp_avg.data_ptr<float>(), b.exp_avg_sq.data_ptr<float>(), b.param.numel(), copy},
        Hyper(), step);
  } else {
    cpptrain::kernels::CpuAdamWStep(
        {b.param.data_ptr<float>(), b.grad.data_ptr<float>(), b.exp_avg.data_ptr<float>(),
         b.exp_avg_sq.data_ptr<float>(), b.param.numel(), copy},
        Hyper(), step);
  }
}

// Seconds per step of the kernel; `first` gets the parameter after its first step, which fails
// (exit 1) where the bf16 copy is not its rounding.
double TimeKernel(int64_t n, int steps, bool bf16, torch::Tensor* first) {
  Buffers b = MakeBuffers(n);
  KernelStep(b, 1, bf16);
  *first = b.param.clone();
  if (b.copy.defined() && !torch::equal(b.copy, b.param.to(torch::kBFloat16))) {
    std::fprintf(stderr, "the kernel's bf16 copy is not the parameter's bf16 rounding\n");
    std::exit(1);
  }
  const auto start = Clock::now();
  for (int s = 0; s < steps; ++s) KernelStep(b, s + 2, bf16);
  return Seconds(start) / steps;
}

double TimeLibTorch(int64_t n, int steps, torch::Tensor* first) {
  Buffers b = MakeBuffers(n);
  torch::Tensor param = b.param.requires_grad_();
  param.mutable_grad() = b.grad;
  const auto h = Hyper();
  torch::optim::AdamW adamw({param}, torch::optim::AdamWOptions(h.lr)
                                         .betas({h.beta1, h.beta2})
                                         .eps(h.eps)
                                         .weight_decay(h.weight_decay));
  adamw.step();
  *first = param.detach().clone();
  const auto start = Clock::now();
  for (int s = 0; s < steps; ++s) adamw.step();
  return Seconds(start) / steps;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int64_t n = absl::GetFlag(FLAGS_numel);
  const int steps = absl::GetFlag(FLAGS_steps);
  const bool bf16 = absl::GetFlag(FLAGS_bf16_grads);
  const bool copy = absl::GetFlag(FLAGS_bf16_copy);
  const double bytes = static_cast<double>(n) * ((bf16 ? 24 : 28) + (copy ? 2 : 0));
  std::printf("numel %lld, %s gradients%s, vectorized body: %s\n", static_cast<long long>(n),
              bf16 ? "bf16" : "fp32", copy ? ", bf16 copy written" : "",
              cpptrain::kernels::CpuAdamWVectorized() ? "yes" : "no");
  std::printf(
      "| threads | kernel ms/step | kernel GB/s | LibTorch ms/step | LibTorch GB/s | "
      "speedup |\n|---|---|---|---|---|---|\n");
  for (absl::string_view field : absl::StrSplit(absl::GetFlag(FLAGS_threads), ',')) {
    int threads = 0;
    if (!absl::SimpleAtoi(field, &threads) || threads < 1) {
      std::fprintf(stderr, "--threads: '%s' is not a positive integer\n",
                   std::string(field).c_str());
      return 2;
    }
    at::set_num_threads(threads);
    torch::Tensor mine, theirs;
    const double kernel_s = TimeKernel(n, steps, bf16, &mine);
    const double torch_s = TimeLibTorch(n, steps, &theirs);
    if (!cpptrain::kernels::AgreesWithLibTorchAdamW(theirs, mine, MakeBuffers(n).param)) {
      std::fprintf(stderr, "the kernel's first step differs from torch::optim::AdamW's\n");
      return 1;
    }
    std::printf("| %d | %.1f | %.2f | %.1f | %.2f | %.2fx |\n", threads, kernel_s * 1e3,
                bytes / kernel_s / 1e9, torch_s * 1e3, 28.0 * n / torch_s / 1e9,
                torch_s / kernel_s);
    std::printf(
        "{\"bench\": \"cpu_adamw\", \"numel\": %lld, \"bf16_grads\": %s, \"threads\": %d, "
        "\"kernel_s_per_step\": %.6f, \"kernel_gb_per_s\": %.3f, \"libtorch_s_per_step\": %.6f, "
        "\"libtorch_gb_per_s\": %.3f, \"bf16_copy\": %s, \"agrees\": true}\n",
        static_cast<long long>(n), bf16 ? "true" : "false", threads, kernel_s,
        bytes / kernel_s / 1e9, torch_s, 28.0 * n / torch_s / 1e9, copy ? "true" : "false");
  }
  return 0;
}
