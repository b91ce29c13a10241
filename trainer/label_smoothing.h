// Label-smoothed cross-entropy, Hugging Face's LabelSmoother (label_smoothing_factor): each
// counted target's loss is (1 - epsilon) * nll(target) + epsilon * mean over classes of
// -log p(class), summed over targets that are not kIgnoreIndex. Causal LM logits [B, T, V]
// with labels [B, T] are shifted as the model's own loss does (position t predicts label
// t + 1); classifier logits [B, C] pair with labels [B].
//
//   torch::Tensor loss = LabelSmoothedLossSum(model.Forward(batch), batch.labels, 0.1) / n;
#ifndef CPPTRAIN_TRAINER_LABEL_SMOOTHING_H_
#define CPPTRAIN_TRAINER_LABEL_SMOOTHING_H_

#include <ATen/core/Tensor.h>

namespace cpptrain {

// fp32 scalar. Throws c10::Error when the shapes are neither pairing above.
at::Tensor LabelSmoothedLossSum(const at::Tensor& logits, const at::Tensor& labels, double epsilon);

}  // namespace cpptrain

#endif  // CPPTRAIN_TRAINER_LABEL_SMOOTHING_H_
