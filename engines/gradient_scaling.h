// An optimizer that can multiply the gradients by a factor as its next step reads them, so that
// clipping costs no pass of its own over them. ZeRO-Offload clips its host gradients this way,
// and the local and DDP engines their device gradients (trainer/optimizer.h's FusedAdamW does
// it in its CPU AdamW kernel and in PyTorch's fused CUDA kernel). The factor is a 0-dim tensor,
// so a clip coefficient computed on the device reaches the device step without a host sync:
//
//   at::Tensor coefficient = ClipCoefficient(norm, max_norm);    // engines/grad_utils.h
//   auto* scaling = dynamic_cast<ScalesGradientsInStep*>(&optimizer);
//   if (scaling == nullptr || !scaling->ScaleGradientsInNextStep(coefficient)) {
//     ScaleGradients(grads, coefficient);   // scale them yourself
//   }
//   optimizer.step();   // reads every gradient g as g * coefficient
//
// Until that step the gradients themselves hold their unscaled values.
#ifndef CPPTRAIN_ENGINES_GRADIENT_SCALING_H_
#define CPPTRAIN_ENGINES_GRADIENT_SCALING_H_

#include <ATen/core/Tensor.h>

namespace cpptrain {

class ScalesGradientsInStep {
 public:
  virtual ~ScalesGradientsInStep() = default;

  // The next step() reads each gradient g as g * scale, rounded to its dtype first (what
  // g.mul_(scale) would have left: exactly, or, where an optimizer says so, within one rounding
  // of it), then forgets the scale. `scale` is a 0-dim float64 tensor on the CPU or on the
  // parameters' device (an optimizer stepping on the host reads its value there; one stepping on
  // the device never does); an undefined tensor cancels a pending scale and returns true. False
  // when it cannot for its current parameters: then nothing is pending.
  virtual bool ScaleGradientsInNextStep(const at::Tensor& scale) = 0;

  // Whether its steps read bf16 gradients of fp32 parameters as they are, widening each value in
  // the pass that uses it (and scale them too), so an engine that keeps fp32 masters of bf16
  // working copies can hand it the bf16 gradient of a single micro-batch instead of widening it
  // first. Fixed once the optimizer is built.
  virtual bool ReadsBf16Gradients() { return false; }
};

}  // namespace cpptrain

#endif  // CPPTRAIN_ENGINES_GRADIENT_SCALING_H_
