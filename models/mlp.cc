#include "models/mlp.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "models/recompute.h"

namespace cpptrain {

MlpBlock::MlpBlock(int64_t in_features, int64_t out_features) : Unit("MlpBlock") {
  linear_ = register_module("linear", torch::nn::Linear(in_features, out_features));
}

torch::Tensor MlpBlock::Forward(torch::Tensor x) {
  return Hooked(std::move(x), [this](const torch::Tensor& h) {
    auto body = [this](const torch::Tensor& in) { return at::relu(linear_->forward(in)); };
    return gradient_checkpointing_ ? RecomputeInBackward(body, h) : body(h);
  });
}

absl::Status ValidateMlpConfig(const proto::MlpConfig& config) {
  if (!(config.input_size() > 0) || !(config.num_classes() > 0) || config.num_layers() < 0 ||
      (config.num_layers() > 0 && !(config.hidden_size() > 0))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MlpConfig needs input_size > 0, num_classes > 0, num_layers >= 0 and, with hidden "
        "layers, hidden_size > 0; got input_size = ",
        config.input_size(), ", num_classes = ", config.num_classes(),
        ", num_layers = ", config.num_layers(), ", hidden_size = ", config.hidden_size()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Mlp>> Mlp::Create(const proto::MlpConfig& config) {
  CT_RETURN_IF_ERROR(ValidateMlpConfig(config));
  return CatchTorch([&] { return std::make_shared<Mlp>(config); });
}

Mlp::Mlp(const proto::MlpConfig& config) : TrainableModel("Mlp") {
  layer_list_ = register_module("layers", torch::nn::ModuleList());
  int64_t width = config.input_size();
  for (int64_t i = 0; i < config.num_layers(); ++i) {
    blocks_.push_back(std::make_shared<MlpBlock>(width, config.hidden_size()));
    layer_list_->push_back(blocks_.back());
    width = config.hidden_size();
  }
  head_ = register_module("head", torch::nn::Linear(width, config.num_classes()));
}

torch::Tensor Mlp::Forward(const Batch& batch) {
  return Hooked(batch.inputs, [this](const torch::Tensor& features) {
    at::Tensor h = features;
    for (const auto& block : blocks_) h = block->Forward(std::move(h));
    return head_->forward(h);
  });
}

torch::Tensor Mlp::LossSum(const torch::Tensor& logits, const Batch& batch) const {
  return at::cross_entropy_loss(logits.to(at::kFloat), batch.labels, /*weight=*/{},
                                at::Reduction::Sum, kIgnoreIndex);
}

int64_t Mlp::CountLossTargets(const Batch& batch) const {
  return batch.labels.ne(kIgnoreIndex).sum().item<int64_t>();
}

void Mlp::SetGradientCheckpointing(bool enabled) {
  for (const auto& block : blocks_) block->set_gradient_checkpointing(enabled);
}

}  // namespace cpptrain
