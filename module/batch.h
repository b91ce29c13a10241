// A collated micro-batch: what the loader yields, the model consumes and the loss reads.
//
//   Batch b = collator.Collate(examples);
//   Batch on_device = b.To(torch::Device("cuda:0"), /*non_blocking=*/true);
#ifndef CPPTRAIN_MODULE_BATCH_H_
#define CPPTRAIN_MODULE_BATCH_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace cpptrain {

// Label value that contributes nothing to the loss (Hugging Face / PyTorch convention).
inline constexpr int64_t kIgnoreIndex = -100;

struct Batch {
  // [B, T] int64 token ids, or [B, F] float features.
  at::Tensor inputs;
  // [B, T] int64 token labels, unshifted (the causal loss shifts), kIgnoreIndex where ignored;
  // or [B] int64 classes.
  at::Tensor labels;
  // [B, T] int64, 1 for real tokens and 0 for padding; undefined for feature inputs.
  at::Tensor attention_mask;
  // [B, T] int64 position of each token in its own example; undefined means 0..T-1 in every
  // row. Set for packed and padding-free batches (several examples in one row): positions
  // restart at 0 where an example starts, and a token attends only to the tokens of its own
  // example (a new example begins wherever a position is not the previous one plus 1, as in
  // transformers' find_packed_sequence_indices).
  at::Tensor position_ids;

  int64_t size() const { return inputs.defined() ? inputs.size(0) : 0; }

  // Copies every defined tensor to `device`. With non_blocking and pinned host memory the
  // copies are asynchronous on the device's current stream.
  Batch To(const c10::Device& device, bool non_blocking) const {
    Batch out;
    if (inputs.defined()) out.inputs = inputs.to(device, non_blocking);
    if (labels.defined()) out.labels = labels.to(device, non_blocking);
    if (attention_mask.defined()) out.attention_mask = attention_mask.to(device, non_blocking);
    if (position_ids.defined()) out.position_ids = position_ids.to(device, non_blocking);
    return out;
  }

  // Page-locked copies of every defined tensor (only meaningful when CUDA is present).
  Batch PinMemory() const {
    Batch out;
    if (inputs.defined()) out.inputs = inputs.pin_memory();
    if (labels.defined()) out.labels = labels.pin_memory();
    if (attention_mask.defined()) out.attention_mask = attention_mask.pin_memory();
    if (position_ids.defined()) out.position_ids = position_ids.pin_memory();
    return out;
  }
};

}  // namespace cpptrain

#endif  // CPPTRAIN_MODULE_BATCH_H_
