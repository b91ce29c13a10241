// What the Trainer needs from a model: logits for a batch, the summed loss of those logits
// and how many targets that sum covers. The Trainer divides by the count of the whole
// accumulated (and, later, global) batch, so accumulation gives exact gradients.
//
//   torch::Tensor logits = model->Forward(batch);
//   torch::Tensor loss = model->LossSum(logits, batch) / num_targets_in_step;
//   torch::Tensor same = model->ForwardLossSum(batch) / num_targets_in_step;   // no logits kept
#ifndef CPPTRAIN_MODULE_TRAINABLE_MODEL_H_
#define CPPTRAIN_MODULE_TRAINABLE_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "module/batch.h"
#include "module/unit.h"

namespace google::protobuf {
class Message;
}  // namespace google::protobuf

namespace cpptrain {

// A model is the root unit: parameters not in a wrapped child unit belong to it.
class TrainableModel : public Unit {
 public:
  using Unit::Unit;

  virtual torch::Tensor Forward(const Batch& batch) = 0;

  // Sum over the counted targets of the per-target loss (fp32 scalar).
  virtual torch::Tensor LossSum(const torch::Tensor& logits, const Batch& batch) const = 0;

  // LossSum of Forward's logits, for callers that need no logits (training, loss-only
  // evaluation): a model may compute it without them (DecoderLM with fused kernels does).
  virtual torch::Tensor ForwardLossSum(const Batch& batch) {
    return LossSum(Forward(batch), batch);
  }

  // Use the model's fused kernels where it has them (the Trainer sets fused_kernels).
  virtual void SetFusedKernels(bool enabled) { (void)enabled; }

  // How many targets LossSum counts for `batch` (for a causal LM: shifted labels that are
  // not kIgnoreIndex). Reads the labels on the host; call it on host batches.
  virtual int64_t CountLossTargets(const Batch& batch) const = 0;

  // Unit classes a transformer-based wrap policy shards by default (HF _no_split_modules).
  virtual std::vector<std::string> LayerUnitClasses() const { return {}; }

  // Other names a wrap policy may give `unit_class`: Hugging Face's class name for it in the
  // model's architecture ("LlamaDecoderLayer" for a llama-type decoder's "DecoderLayer"), so a
  // transformer_layer_cls_to_wrap written for transformers wraps the same layers here.
  virtual std::vector<std::string> UnitClassAliases(const std::string& unit_class) const {
    (void)unit_class;
    return {};
  }

  // Sets of parameters (named as named_parameters() names them) that one backward node reads
  // together, each in the order it wants them consecutive in memory: the engines that lay the
  // parameters out in one flat buffer (local and DDP with bf16 working copies) keep each set
  // side by side in that order, so that SplitLinear can compute its input's gradient as one
  // matmul over them (DecoderLM: q/k/v and gate/up projections). A layout hint only: names
  // that are not trainable parameters are left out of their set.
  virtual std::vector<std::vector<std::string>> AdjacentParameterGroups() const { return {}; }

  // Parameters outside embedding tables, as Hugging Face's num_parameters(exclude_embeddings=
  // True) counts them for total_flos (6 x this x input tokens); -1: the Trainer counts the
  // registered parameters outside torch::nn::Embedding modules (right unless an engine sharded
  // them before the Trainer saw them, which a model that supports it answers by overriding).
  virtual int64_t NonEmbeddingParameters() const { return -1; }

  // The model's configuration as one JSON object, for dashboards (TensorBoard's model_config
  // text, as Hugging Face writes model.config there); "" when the model has none to show.
  virtual std::string ConfigJson() const { return ""; }

  // The message that describes the model's architecture (DecoderLM: its proto::DecoderConfig),
  // or nullptr. Checkpoints record and compare it, and write Hugging Face's config.json from a
  // DecoderConfig, without knowing the model's class.
  virtual const google::protobuf::Message* ConfigProto() const { return nullptr; }

  // Recompute each layer's activations in backward instead of keeping them.
  virtual void SetGradientCheckpointing(bool enabled) { (void)enabled; }

  // Fills rows [row_begin, row_begin + rows.size(0)) of parameter `name` (as named_parameters()
  // names it) with its initial values, the same whatever the split; `rows` is on the CPU.
  // FullyShard calls it for deferred parameters (module/deferred.h).
  virtual absl::Status InitializeRows(const std::string& name, int64_t row_begin,
                                      torch::Tensor rows) {
    (void)row_begin;
    (void)rows;
    return absl::UnimplementedError(
        absl::StrCat(unit_class(), " cannot initialize parameter ", name,
                     " row by row: build the model with its parameters allocated (not deferred)"));
  }
};

}  // namespace cpptrain

#endif  // CPPTRAIN_MODULE_TRAINABLE_MODEL_H_
