// How closely kernels/cpu_adamw.h's step agrees with torch::optim::AdamW's on the same inputs,
// for its test and tools/cpu_adamw_bench:
//
//   const at::Tensor before = param.clone();
//   ... one step of each: `libtorch` (torch::optim::AdamW) and `kernel` (CpuAdamWStep) ...
//   if (!kernels::AgreesWithLibTorchAdamW(libtorch, kernel, before)) { ... }
//
// LibTorch 1.13: bit for bit. On 2.x within 4 ulp of the largest of the value before the step,
// after it and the update: 2.x's addcdiv_ forms the update as lr' * (m / d) where the kernel
// (like 1.13) has (lr' * m) / d, a few ulp of the update apart, which the sum keeps where the
// update is the larger operand (measured against PyTorch 2.15's C++ AdamW: up to 3 ulp; the
// moments stay bitwise equal).
#ifndef CPPTRAIN_KERNELS_CPU_ADAMW_AGREEMENT_H_
#define CPPTRAIN_KERNELS_CPU_ADAMW_AGREEMENT_H_

#include <ATen/core/Tensor.h>

namespace cpptrain {
namespace kernels {

bool AgreesWithLibTorchAdamW(const at::Tensor& libtorch, const at::Tensor& kernel,
                             const at::Tensor& before);

}  // namespace kernels
}  // namespace cpptrain

#endif  // CPPTRAIN_KERNELS_CPU_ADAMW_AGREEMENT_H_
