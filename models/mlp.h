// A small MLP classifier for engine tests and examples: num_layers hidden blocks (unit class
// "MlpBlock", Linear + ReLU) and a linear head. Parameters: layers.{i}.linear.{weight,bias},
// head.{weight,bias}.
//
//   CT_ASSIGN_OR_RETURN(std::shared_ptr<Mlp> model, Mlp::Create(config));
//   torch::Tensor logits = model->Forward(batch);       // inputs [B, F] float -> [B, C]
//   torch::Tensor loss = model->LossSum(logits, batch) / model->CountLossTargets(batch);
//
// The root unit ("Mlp") hook wraps the whole forward (features in, logits out); its
// parameters are the head's.
#ifndef CPPTRAIN_MODELS_MLP_H_
#define CPPTRAIN_MODELS_MLP_H_

#include <memory>
#include <string>
#include <vector>

#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "module/trainable_model.h"
#include "proto/model.pb.h"

namespace cpptrain {

// relu(linear(x)) through the unit hook (inside it, RecomputeInBackward when checkpointing).
class MlpBlock : public Unit {
 public:
  MlpBlock(int64_t in_features, int64_t out_features);
  torch::Tensor Forward(torch::Tensor x);

  void set_gradient_checkpointing(bool enabled) { gradient_checkpointing_ = enabled; }

 private:
  bool gradient_checkpointing_ = false;
  torch::nn::Linear linear_{nullptr};
};

// input_size and num_classes positive; num_layers >= 0; hidden_size positive when
// num_layers > 0.
absl::Status ValidateMlpConfig(const proto::MlpConfig& config);

class Mlp : public TrainableModel {
 public:
  // Validates `config`, then builds with LibTorch's default Linear initialization drawn from
  // the global generator (reproducible under torch::manual_seed).
  static absl::StatusOr<std::shared_ptr<Mlp>> Create(const proto::MlpConfig& config);

  // `config` must pass ValidateMlpConfig; prefer Create.
  explicit Mlp(const proto::MlpConfig& config);

  torch::Tensor Forward(const Batch& batch) override;
  // Cross-entropy summed in fp32 over labels [B], skipping kIgnoreIndex.
  torch::Tensor LossSum(const torch::Tensor& logits, const Batch& batch) const override;
  int64_t CountLossTargets(const Batch& batch) const override;

  std::vector<std::string> LayerUnitClasses() const override { return {"MlpBlock"}; }
  void SetGradientCheckpointing(bool enabled) override;

  const std::vector<std::shared_ptr<MlpBlock>>& blocks() const { return blocks_; }

 private:
  torch::nn::ModuleList layer_list_;
  std::vector<std::shared_ptr<MlpBlock>> blocks_;
  torch::nn::Linear head_{nullptr};
};

}  // namespace cpptrain

#endif  // CPPTRAIN_MODELS_MLP_H_
