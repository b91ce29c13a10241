// Several projections of one input as one autograd node, each output contiguous: a weight that
// stacks them (Phi-3's qkv_proj and gate_up_proj), or a weight each (Llama's q_proj, k_proj and
// v_proj; gate_proj and up_proj):
//
//   std::vector<at::Tensor> qkv = SplitLinear(x, qkv_proj->weight, qkv_proj->bias,
//                                             {q_size, kv_size, kv_size});
//   std::vector<at::Tensor> gate_up = SplitLinear(x, {gate->weight, up->weight}, {});
//   // qkv[0]: [B, T, q_size], qkv[1] and qkv[2]: [B, T, kv_size]
//
// The values are at::linear(x, weight, bias).split_with_sizes(sizes, -1), or one at::linear per
// weight, up to the order of floating-point sums. What differs is memory traffic. Slicing one
// [B, T, sum(sizes)] output gives strided blocks that the fused kernels copy before reading, and
// each slice's backward writes a zero-filled [B, T, sum(sizes)] tensor that autograd then adds
// up; separate linears each return a gradient of x that autograd adds to the others'. Here each
// block has its own matmul, and the backward accumulates x's gradient in the matmuls (addmm)
// and writes a stacked weight's gradient block by block into one tensor: no zeros or adds.
// Under autocast the inputs are cast as at::linear's would be, and the weights' gradients come
// back in the weights' dtype. Where the outputs' gradients arrive side by side in one buffer
// (the fused SwiGLU backward writes dgate and dup so, kernels::QkvNormRope's dq, dk and dv) and
// the weights are consecutive rows of one buffer (a stacked weight, or the bf16 working copies
// of the local and DDP engines, which keep a model's AdjacentParameterGroups side by side), x's
// gradient is one matmul over all blocks: on an H100 0.161 ms in place of
// 0.190 at Qwen3-0.6B's gate/up and 0.115 in place of 0.145 at its q/k/v, micro-batch 4.
#ifndef CPPTRAIN_MODELS_SPLIT_LINEAR_H_
#define CPPTRAIN_MODELS_SPLIT_LINEAR_H_

#include <ATen/ATen.h>

#include <vector>

namespace cpptrain {

// x [..., in]; weight [sum(sizes), in]; bias [sum(sizes)] or undefined.
std::vector<at::Tensor> SplitLinear(const at::Tensor& x, const at::Tensor& weight,
                                    const at::Tensor& bias, std::vector<int64_t> sizes);

// x [..., in]; weights[i] [out_i, in]; biases: one [out_i] per weight, or none.
std::vector<at::Tensor> SplitLinear(const at::Tensor& x, const std::vector<at::Tensor>& weights,
                                    const std::vector<at::Tensor>& biases);

// How many backward passes in this process computed x's gradient as that one matmul (tests).
int64_t SplitLinearStackedInputGradients();

}  // namespace cpptrain

#endif  // CPPTRAIN_MODELS_SPLIT_LINEAR_H_
