#include "trainer/label_smoothing.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "module/batch.h"

namespace cpptrain {

at::Tensor LabelSmoothedLossSum(const at::Tensor& logits, const at::Tensor& labels,
                                double epsilon) {
  at::Tensor scores = logits;
  at::Tensor targets = labels;
  if (logits.dim() == 3 && labels.dim() == 2) {
    scores = logits.slice(1, 0, logits.size(1) - 1);
    targets = labels.slice(1, 1, labels.size(1));
  } else {
    TORCH_CHECK(logits.dim() == 2 && labels.dim() == 1,
                "label smoothing needs logits [B, T, V] with labels [B, T], or [B, C] with [B]; "
                "got logits ",
                logits.sizes(), " and labels ", labels.sizes());
  }
  at::Tensor log_probs = at::log_softmax(scores.to(at::kFloat), /*dim=*/-1);
  at::Tensor counted = targets.ne(kIgnoreIndex);
  // Ignored targets gather class 0 and are then masked out.
  at::Tensor safe = at::where(counted, targets, at::zeros_like(targets));
  at::Tensor nll = -log_probs.gather(-1, safe.unsqueeze(-1)).squeeze(-1);
  at::Tensor uniform = -log_probs.mean(-1);
  at::Tensor per_target = (1.0 - epsilon) * nll + epsilon * uniform;
  return (per_target * counted).sum();
}

}  // namespace cpptrain
