// Gradient helpers every engine shares: collect the gradients an optimizer steps, their
// global L2 norm, clipping by a precomputed norm, and clearing them (set to none).
//
//   std::vector<at::Tensor> grads = Gradients(optimizer);
//   at::Tensor norm = GlobalNorm(grads);       // fp32 scalar on the gradients' device
//   ClipByNorm(grads, norm.item<double>(), 1.0);
#ifndef CPPTRAIN_ENGINES_GRAD_UTILS_H_
#define CPPTRAIN_ENGINES_GRAD_UTILS_H_

#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

namespace cpptrain {

// The defined gradients of every parameter in every group of `optimizer`.
std::vector<at::Tensor> Gradients(const torch::optim::Optimizer& optimizer);

// sqrt(sum of squares) over all of `grads`, accumulated in fp32. An undefined tensor when
// `grads` is empty is never returned: the norm of nothing is a zero scalar on the CPU.
at::Tensor GlobalNorm(const std::vector<at::Tensor>& grads);

// Multiplies every gradient by max_norm / (norm + 1e-6) when that is below 1 (PyTorch's
// clip_grad_norm_ rule).
void ClipByNorm(const std::vector<at::Tensor>& grads, double norm, double max_norm);

// Sets every parameter's gradient to none (undefined), releasing its memory.
void ClearGradients(torch::optim::Optimizer& optimizer);

}  // namespace cpptrain

#endif  // CPPTRAIN_ENGINES_GRAD_UTILS_H_
