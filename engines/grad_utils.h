// Parameter and gradient helpers every engine shares: the trainable parameters of a model
// with each tensor once (tied weights are registered under several names), the gradients an
// optimizer steps, their global L2 norm, clipping by a precomputed norm, and clearing them.
// Clipping by a norm that stays on the device (ClipCoefficient of a tensor, ScaleGradients)
// never waits for the device; ClipByNorm takes the norm's host value.
//
//   NamedParameters params = UniqueTrainableParameters(*model);   // optimizer factory input
//   std::vector<at::Tensor> grads = Gradients(optimizer);
//   at::Tensor norm = GlobalNorm(grads);       // fp32 scalar on the gradients' device
//   ScaleGradients(grads, ClipCoefficient(norm, 1.0));            // no host sync
#ifndef CPPTRAIN_ENGINES_GRAD_UTILS_H_
#define CPPTRAIN_ENGINES_GRAD_UTILS_H_

#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

namespace cpptrain {

// The parameters that require grad, each tensor once under the first name
// named_parameters() gives it. LibTorch lists a tensor registered under two names (tied
// weights) twice; an optimizer given both would step it twice.
std::vector<std::pair<std::string, at::Tensor>> UniqueTrainableParameters(
    const torch::nn::Module& model);

// The defined gradients of every parameter in every group of `optimizer`, each tensor once
// (a parameter listed twice would count twice in the norm and be clipped twice).
std::vector<at::Tensor> Gradients(const torch::optim::Optimizer& optimizer);

// sqrt(sum of squares) over all of `grads`, accumulated in fp32. An undefined tensor when
// `grads` is empty is never returned: the norm of nothing is a zero scalar on the CPU.
at::Tensor GlobalNorm(const std::vector<at::Tensor>& grads);

// max_norm / (norm + 1e-6), the factor PyTorch's clip_grad_norm_ scales gradients by when it
// is below 1 (at 1 or above they stay as they are).
double ClipCoefficient(double norm, double max_norm);

// Multiplies every gradient by ClipCoefficient(norm, max_norm) when that is below 1.
void ClipByNorm(const std::vector<at::Tensor>& grads, double norm, double max_norm);

// min(ClipCoefficient(norm, max_norm), 1) as a 0-dim float64 tensor on `norm`'s device (norm: a
// one-element tensor of any floating dtype), computed there in double from the norm's value, so
// bitwise the host function's result, without reading the norm on the host.
at::Tensor ClipCoefficient(const at::Tensor& norm, double max_norm);

// Multiplies every gradient by `coefficient` (a 0-dim tensor, ClipCoefficient's) with
// ClipByNorm's result, bit for bit: CPU gradients through its host value (nothing when it is 1),
// device gradients without reading it back (fp32 ones by a multi-tensor kernel, fp16/bf16 ones
// through an fp32 product rounded once, one tensor at a time).
void ScaleGradients(const std::vector<at::Tensor>& grads, const at::Tensor& coefficient);

// Sets every parameter's gradient to none (undefined), releasing its memory.
void ClearGradients(torch::optim::Optimizer& optimizer);

}  // namespace cpptrain

#endif  // CPPTRAIN_ENGINES_GRAD_UTILS_H_
