// The example's own model: a residual MLP classifier (an input projection, `num_blocks`
// pre-norm residual blocks of LayerNorm -> Linear -> GELU -> Linear, a LayerNorm and a linear
// head) implementing cpptrain::TrainableModel, the interface the Trainer and every engine
// drive. Inputs are float features [B, F]; labels are classes [B] (kIgnoreIndex skipped).
//
//   auto model = std::make_shared<BlobClassifier>(BlobClassifier::Options{16, 64, 2, 4});
//   torch::Tensor logits = model->Forward(batch);  // [B, num_classes]
#ifndef CPPTRAIN_EXAMPLES_BLOB_CLASSIFIER_H_
#define CPPTRAIN_EXAMPLES_BLOB_CLASSIFIER_H_

#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "module/batch.h"
#include "module/trainable_model.h"
#include "module/unit.h"

namespace example {

// x + fc2(gelu(fc1(norm(x)))). A Unit, so a sharding engine (FSDP2) can wrap each block.
class ResidualBlock : public cpptrain::Unit {
 public:
  ResidualBlock(int64_t width, int64_t hidden);
  torch::Tensor Forward(torch::Tensor x);

 private:
  torch::nn::LayerNorm norm_{nullptr};
  torch::nn::Linear fc1_{nullptr};
  torch::nn::Linear fc2_{nullptr};
};

class BlobClassifier : public cpptrain::TrainableModel {
 public:
  struct Options {
    int64_t num_features = 16;
    int64_t width = 64;
    int64_t num_blocks = 2;
    int64_t num_classes = 4;
  };

  explicit BlobClassifier(const Options& options);

  torch::Tensor Forward(const cpptrain::Batch& batch) override;
  // Plain cross-entropy, summed over the counted labels (the Trainer's default ComputeLoss
  // uses it; the example's LabelSmoothingTrainer overrides ComputeLoss instead).
  torch::Tensor LossSum(const torch::Tensor& logits, const cpptrain::Batch& batch) const override;
  int64_t CountLossTargets(const cpptrain::Batch& batch) const override;
  std::vector<std::string> LayerUnitClasses() const override { return {"ResidualBlock"}; }

 private:
  torch::nn::Linear input_{nullptr};
  std::vector<std::shared_ptr<ResidualBlock>> blocks_;
  torch::nn::LayerNorm final_norm_{nullptr};
  torch::nn::Linear head_{nullptr};
};

}  // namespace example

#endif  // CPPTRAIN_EXAMPLES_BLOB_CLASSIFIER_H_
