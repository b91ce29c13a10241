#include "label_smoothing_trainer.h"

#include <ATen/ATen.h>

namespace example {

torch::Tensor LabelSmoothingTrainer::ComputeLoss(cpptrain::TrainableModel& model,
                                                 const cpptrain::Batch& batch,
                                                 int64_t num_items_in_batch) {
  torch::Tensor logits = model.Forward(batch);
  torch::Tensor log_probs = at::log_softmax(logits.to(at::kFloat), /*dim=*/-1);  // [B, C]
  torch::Tensor counted = batch.labels.ne(cpptrain::kIgnoreIndex);               // [B]
  // Ignored labels gather class 0 and are then masked out.
  torch::Tensor targets = at::where(counted, batch.labels, at::zeros_like(batch.labels));
  torch::Tensor nll = -log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1);  // [B]
  torch::Tensor uniform = -log_probs.mean(-1);                                   // [B]
  torch::Tensor per_target = (1.0 - epsilon_) * nll + epsilon_ * uniform;
  return (per_target * counted).sum() / static_cast<double>(num_items_in_batch);
}

}  // namespace example
