// A Llama/Qwen3-family causal decoder LM whose named_parameters() match Hugging Face's
// (model.embed_tokens.weight, model.layers.{i}.self_attn.q_proj.weight, ..., lm_head.weight).
// Build it through BuildDecoder (configs.h), which validates the config first.
//
//   CT_ASSIGN_OR_RETURN(std::shared_ptr<DecoderLM> model, BuildDecoder(config));
//   model->SetGradientCheckpointing(true);
//   torch::Tensor logits = model->Forward(batch);              // [B, T, vocab]
//   torch::Tensor loss = model->LossSum(logits, batch) / model->CountLossTargets(batch);
//
// Units: the model itself (class "DecoderLM", the root) and each layer ("DecoderLayer").
// The root hook wraps the whole forward: its PreForward sees the [B, T] int64 token ids (they
// carry no gradient, so a hook passes them through unchanged) and its PostForward the logits.
// The root's parameters are embed_tokens, norm and, untied, lm_head.
//
// attention_mask is not read: the mask describes right padding only, and under causal
// attention tokens after the real ones never change the real tokens' logits. Labels of
// padding must be kIgnoreIndex so LossSum ignores them.
#ifndef CPPTRAIN_MODELS_DECODER_H_
#define CPPTRAIN_MODELS_DECODER_H_

#include <memory>
#include <string>
#include <vector>

#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include "models/decoder_layer.h"
#include "models/model.h"
#include "proto/model.pb.h"

namespace cpptrain {

class DecoderLM : public TrainableModel {
 public:
  // `config` must pass ValidateDecoderConfig (configs.h). Weights are drawn from the global
  // generator: normal(0, initializer_range) for linear and embedding weights, ones for norms,
  // zeros for biases (HF's _init_weights), so torch::manual_seed makes them reproducible.
  explicit DecoderLM(const proto::DecoderConfig& config);

  // batch.inputs: [B, T] int64 token ids. Returns logits [B, T, vocab].
  torch::Tensor Forward(const Batch& batch) override;
  torch::Tensor Logits(const torch::Tensor& input_ids);

  // Cross-entropy summed in fp32 over logits[:, :-1] against labels[:, 1:], skipping
  // kIgnoreIndex.
  torch::Tensor LossSum(const torch::Tensor& logits, const Batch& batch) const override;
  int64_t CountLossTargets(const Batch& batch) const override;

  std::vector<std::string> LayerUnitClasses() const override { return {"DecoderLayer"}; }
  void SetGradientCheckpointing(bool enabled) override;

  const proto::DecoderConfig& config() const { return config_; }
  const std::vector<std::shared_ptr<DecoderLayer>>& layers() const { return layers_; }

 private:
  void InitializeWeights();

  proto::DecoderConfig config_;
  int64_t head_dim_;
  std::shared_ptr<torch::nn::Module> model_;  // "model": embed_tokens, layers, norm
  torch::nn::Embedding embed_tokens_{nullptr};
  torch::nn::ModuleList layer_list_;
  std::shared_ptr<RmsNorm> norm_;
  torch::nn::Linear lm_head_{nullptr};  // null when tied to embed_tokens
  std::vector<std::shared_ptr<DecoderLayer>> layers_;
};

}  // namespace cpptrain

#endif  // CPPTRAIN_MODELS_DECODER_H_
