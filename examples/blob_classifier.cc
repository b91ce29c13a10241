#include "blob_classifier.h"

#include <ATen/ATen.h>

#include <utility>

namespace example {

ResidualBlock::ResidualBlock(int64_t width, int64_t hidden) : Unit("ResidualBlock") {
  norm_ = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})));
  fc1_ = register_module("fc1", torch::nn::Linear(width, hidden));
  fc2_ = register_module("fc2", torch::nn::Linear(hidden, width));
}

torch::Tensor ResidualBlock::Forward(torch::Tensor x) {
  return Hooked(std::move(x), [this](const torch::Tensor& h) {
    return h + fc2_->forward(at::gelu(fc1_->forward(norm_->forward(h))));
  });
}

BlobClassifier::BlobClassifier(const Options& options) : TrainableModel("BlobClassifier") {
  input_ = register_module("input", torch::nn::Linear(options.num_features, options.width));
  for (int64_t i = 0; i < options.num_blocks; ++i) {
    blocks_.push_back(
        register_module("blocks_" + std::to_string(i),
                        std::make_shared<ResidualBlock>(options.width, 2 * options.width)));
  }
  final_norm_ = register_module("final_norm",
                                torch::nn::LayerNorm(torch::nn::LayerNormOptions({options.width})));
  head_ = register_module("head", torch::nn::Linear(options.width, options.num_classes));
}

torch::Tensor BlobClassifier::Forward(const cpptrain::Batch& batch) {
  // The root unit's hook wraps the whole forward (what engines hook on the model itself).
  return Hooked(batch.inputs, [this](const torch::Tensor& features) {
    torch::Tensor h = input_->forward(features);
    for (const auto& block : blocks_) h = block->Forward(std::move(h));
    return head_->forward(final_norm_->forward(h));
  });
}

torch::Tensor BlobClassifier::LossSum(const torch::Tensor& logits,
                                      const cpptrain::Batch& batch) const {
  return at::cross_entropy_loss(logits.to(at::kFloat), batch.labels, /*weight=*/{},
                                at::Reduction::Sum, cpptrain::kIgnoreIndex);
}

int64_t BlobClassifier::CountLossTargets(const cpptrain::Batch& batch) const {
  return batch.labels.ne(cpptrain::kIgnoreIndex).sum().item<int64_t>();
}

}  // namespace example
