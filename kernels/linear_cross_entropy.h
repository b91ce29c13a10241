// Cross-entropy of a linear layer's logits without the logits: the rows of `hidden` go through
// `weight` a chunk at a time, so the [rows, vocab] logits (and their fp32 copy and gradient)
// never exist whole. The softmax statistics are fp32; the matrix products run in
// compute_dtype (bf16 under autocast), as the eager lm_head + cross_entropy would.
//
//   // hidden [N, H], weight [V, H], targets [N] int64 (ignore_index skipped)
//   at::Tensor loss_sum = kernels::LinearCrossEntropySum(hidden, weight, targets, -100,
//                                                        at::kBFloat16);
//   (loss_sum / num_items).backward();
//
// When grad mode is on and an input requires grad, the gradients to hidden and weight are
// computed during the forward, chunk by chunk, and kept in fp32 until backward, which multiplies
// them by the incoming gradient in fp32 and rounds once to the inputs' dtypes (the eager head
// scales softmax - onehot in fp32 before rounding too). Keeping them fp32 costs 2 bytes per
// weight element more than bf16 between forward and backward. The saved gradients are not
// changed, so a second backward (retain_graph) gives the same gradients again; a backward that
// does not retain the graph lets go of them. Works on every device (ATen operations only).
#ifndef CPPTRAIN_KERNELS_LINEAR_CROSS_ENTROPY_H_
#define CPPTRAIN_KERNELS_LINEAR_CROSS_ENTROPY_H_

#include <ATen/ATen.h>

#include <cstdint>

namespace cpptrain {
namespace kernels {

// Sum over rows whose target is not ignore_index of logsumexp(z) - z[target], z = hidden_row
// @ weight^T, or z = SoftcapReference(hidden_row @ weight^T, softcap) when softcap > 0 (Gemma
// 2's final_logit_softcapping; the cap is applied in fp32). chunk_rows 0 picks chunks of 4096
// rows, fewer where that would hold more than 2^30 logits (a vocabulary over 262144).
at::Tensor LinearCrossEntropySum(const at::Tensor& hidden, const at::Tensor& weight,
                                 const at::Tensor& targets, int64_t ignore_index,
                                 at::ScalarType compute_dtype, int64_t chunk_rows = 0,
                                 double softcap = 0.0);

// The eager path it replaces: logits in compute_dtype (soft-capped there when softcap > 0, as
// transformers does), fp32 cross-entropy summed.
at::Tensor LinearCrossEntropySumReference(const at::Tensor& hidden, const at::Tensor& weight,
                                          const at::Tensor& targets, int64_t ignore_index,
                                          at::ScalarType compute_dtype, double softcap = 0.0);

// softcap * tanh(logits / softcap) in the logits' dtype; the logits themselves when softcap <= 0.
at::Tensor SoftcapReference(const at::Tensor& logits, double softcap);

}  // namespace kernels
}  // namespace cpptrain

#endif  // CPPTRAIN_KERNELS_LINEAR_CROSS_ENTROPY_H_
