// A gated MLP's down projection, linear(act(gate) * up, weight, bias), as one autograd node
// that keeps gate and up (which the activation's backward reads anyway) but not their product:
// the backward writes the product again in the same pass that computes dgate and dup
// (kernels::GatedBackwardRecomputing), over the buffer of its own gradient.
//
//   at::Tensor y = GatedDown(gate, up, down_proj->weight, down_proj->bias,
//                            /*gelu_tanh=*/false, /*fused=*/true);
//
// Against kernels::SwiGlu followed by down_proj->forward: the same values (the product is the
// forward's, rounded once in the kernel or by the reference), one [..., intermediate] tensor
// less held from the forward to the backward per layer (at Llama-3.2-1B, micro-batch 4 x 2,048
// tokens, 128 MiB a layer), and one more write of that size in the backward. dgate and dup
// come back side by side in one buffer where the kernel runs, as SwiGlu's do. Under autocast
// the inputs are cast as at::linear's would be, and the gradients come back in the inputs'
// dtypes. gate, up: [..., intermediate] of one shape; weight [hidden, intermediate]; bias
// [hidden] or undefined. gate and up are held as given: a strided view keeps its whole base
// alive, and the backward reads a contiguous copy (SplitLinear's outputs are contiguous).
#ifndef CPPTRAIN_MODELS_GATED_DOWN_H_
#define CPPTRAIN_MODELS_GATED_DOWN_H_

#include <ATen/ATen.h>

namespace cpptrain {

at::Tensor GatedDown(const at::Tensor& gate, const at::Tensor& up, const at::Tensor& weight,
                     const at::Tensor& bias, bool gelu_tanh, bool fused);

}  // namespace cpptrain

#endif  // CPPTRAIN_MODELS_GATED_DOWN_H_
