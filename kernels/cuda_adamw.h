// AdamW on CUDA tensors in one pass over each value (kernels/fused_kernels_cuda.cu's
// LaunchAdamW): it reads fp32 or bf16 gradients as they are (a bf16 gradient is widened in the
// pass, not in one of its own), can scale them by a device coefficient (gradient clipping), and
// can write each new value rounded to bf16 in the same pass (the working copies of
// engines/working_parameters.h). PyTorch's formula, in fp32 arithmetic; trainer/optimizer.h's
// FusedAdamW steps with it where its gradients are bf16 or it is asked for the copies.
//
//   kernels::CudaAdamWLists lists{params, grads, exp_avgs, exp_avg_sqs, steps, bf16_copies};
//   kernels::CudaAdamWOptions options;
//   options.lr = 1e-4;
//   options.grad_coefficient = clip_coefficient;   // optional, on the device
//   kernels::CudaAdamWStep(lists, options);
#ifndef CPPTRAIN_KERNELS_CUDA_ADAMW_H_
#define CPPTRAIN_KERNELS_CUDA_ADAMW_H_

#include <ATen/core/Tensor.h>

#include <vector>

namespace cpptrain {
namespace kernels {

struct CudaAdamWLists {
  // One entry per tensor, all on one CUDA device: fp32 contiguous params and moments, fp32 or
  // bf16 gradients of the same numel, fp32 one-value step counts (incremented by the step
  // before it uses them, as PyTorch's fused AdamW does).
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, steps;
  // Empty, or one per tensor: undefined (no copy) or a contiguous bf16 tensor of its numel.
  std::vector<at::Tensor> bf16_copies;
};

struct CudaAdamWOptions {
  double lr = 1e-3;
  at::Tensor device_lr;  // a one-value fp32 tensor on the device, read instead of lr where set
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  at::Tensor grad_coefficient;  // one value; each gradient is read as g * it where set
};

// Whether this build has the kernel (CMake with nvcc on a CUDA LibTorch).
bool CudaAdamWBuilt();

// One step on the current stream; nothing is read back to the host, so a CUDA graph can capture
// it. Throws c10::Error naming the list and entry that does not fit, or when not built.
void CudaAdamWStep(const CudaAdamWLists& lists, const CudaAdamWOptions& options);

}  // namespace kernels
}  // namespace cpptrain

#endif  // CPPTRAIN_KERNELS_CUDA_ADAMW_H_
