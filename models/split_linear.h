// A linear layer whose weight stacks several projections (Phi-3's qkv_proj and gate_up_proj),
// computed as one output per stacked block, each contiguous:
//
//   std::vector<at::Tensor> qkv = SplitLinear(x, qkv_proj->weight, qkv_proj->bias,
//                                             {q_size, kv_size, kv_size});
//   // qkv[0]: [B, T, q_size], qkv[1] and qkv[2]: [B, T, kv_size]
//
// The values are at::linear(x, weight, bias).split_with_sizes(sizes, -1), up to the order of
// floating-point sums. What differs is memory traffic. Slicing one [B, T, sum(sizes)] output
// gives strided blocks that the fused kernels copy before reading, and each slice's backward
// writes a zero-filled [B, T, sum(sizes)] tensor that autograd then adds up. Here each block
// has its own matmul, and the backward writes the weight's gradient block by block into one
// tensor and accumulates the input's gradient in the matmuls (addmm), with no zeros or adds.
// Under autocast the inputs are cast as at::linear's would be, and the weight's gradient comes
// back in the weight's dtype.
#ifndef CPPTRAIN_MODELS_SPLIT_LINEAR_H_
#define CPPTRAIN_MODELS_SPLIT_LINEAR_H_

#include <ATen/ATen.h>

#include <vector>

namespace cpptrain {

// x [..., in]; weight [sum(sizes), in]; bias [sum(sizes)] or undefined.
std::vector<at::Tensor> SplitLinear(const at::Tensor& x, const at::Tensor& weight,
                                    const at::Tensor& bias, std::vector<int64_t> sizes);

}  // namespace cpptrain

#endif  // CPPTRAIN_MODELS_SPLIT_LINEAR_H_
