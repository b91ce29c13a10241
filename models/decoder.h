// A Llama/Qwen2/Qwen3/Mistral/Phi-3/Gemma 2/Gemma 3-family causal decoder LM whose named_parameters() match Hugging
// Face's (model.embed_tokens.weight, model.layers.{i}.self_attn.q_proj.weight, ...,
// lm_head.weight).
// Build it through BuildDecoder (configs.h), which validates the config first.
//
//   CT_ASSIGN_OR_RETURN(std::shared_ptr<DecoderLM> model, BuildDecoder(config));
//   model->SetGradientCheckpointing(true);
//   torch::Tensor logits = model->Forward(batch);              // [B, T, vocab]
//   torch::Tensor loss = model->LossSum(logits, batch) / model->CountLossTargets(batch);
//
// Initialized straight into shards, never whole on any rank (DecoderInit):
//   CT_ASSIGN_OR_RETURN(auto model, BuildDecoder(config, {DecoderInit::Mode::kDeferred, seed}));
//   CT_RETURN_IF_ERROR(FullyShard(*model, mesh, options).status());
//
// Units: the model itself (class "DecoderLM", the root) and each layer ("DecoderLayer").
// The root hook wraps the whole forward: its PreForward sees the [B, T] int64 token ids (they
// carry no gradient, so a hook passes them through unchanged) and its PostForward the logits.
// The root's parameters are embed_tokens, norm and, untied, lm_head.
//
// attention_mask is not read: the mask describes right padding only, and under causal
// attention tokens after the real ones never change the real tokens' logits. Labels of
// padding must be kIgnoreIndex so LossSum ignores them.
//
// position_ids (packed or padding-free batches, module/batch.h) are read: the rotary tables
// are taken at those positions and attention is confined to each example by a block-diagonal
// causal mask [B, 1, T, T] (PackedCausalMask), as transformers 5 does for eager and sdpa
// attention. Such a batch takes the eager QK-norm + rotary (the fused kernel takes [T, D]
// tables) and, in LibTorch 2.x, scaled_dot_product_attention with a boolean mask (memory-efficient
// or math kernel, never flash or cuDNN, and no variable-length kernel: the mask costs T * T
// per row).
#ifndef CPPTRAIN_MODELS_DECODER_H_
#define CPPTRAIN_MODELS_DECODER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include "models/decoder_layer.h"
#include "module/trainable_model.h"
#include "models/row_init.h"
#include "proto/model.pb.h"

namespace cpptrain {

// How DecoderLM initializes its weights: normal(0, initializer_range) for linear and
// embedding weights, ones for norms, zeros for biases (HF's _init_weights), drawn...
struct DecoderInit {
  enum class Mode {
    // ...from the global generator, whole tensors (torch::manual_seed makes them
    // reproducible).
    kGlobalGenerator,
    // ...row-seeded from `seed` (models/row_init.h): the values do not depend on how the
    // rows are later split, so the model equals one built kDeferred and sharded.
    kRowSeeded,
    // ...not at all: every parameter is deferred (no memory; each module is released as soon
    // as it is built, so the host never holds more than one). FullyShard allocates each
    // rank's chunks and fills them row-seeded from `seed`; LoadHfWeights allocates each tensor
    // as it loads it. Other engines refuse the model.
    kDeferred,
  };
  Mode mode = Mode::kGlobalGenerator;
  uint64_t seed = 0;
};

// The Hugging Face model_type of `config`: config.model_type when set; otherwise "gemma3_text"
// or "gemma2" with norm_unit_offset (with and without qk_norm), "qwen3" with qk_norm, "phi3"
// with fused_projections, "qwen2" with qkv_bias, "mistral" with a sliding
// window, else "llama".
std::string ResolvedModelType(const proto::DecoderConfig& config);

// What DecoderLM::Logits(ids, cache) keeps between calls: each layer's keys and values, so the
// next call runs only the new tokens. One cache per batch of sequences; start a new one (or
// Clear it) for a new batch.
struct KvCache {
  std::vector<LayerKvCache> layers;
  // The tokens seen so far: the position the next token takes.
  int64_t length() const { return layers.empty() ? 0 : layers.front().next_position; }
  void Clear() { layers.clear(); }
};

class DecoderLM : public TrainableModel {
 public:
  // `config` must pass ValidateDecoderConfig (configs.h).
  explicit DecoderLM(const proto::DecoderConfig& config, DecoderInit init = {});

  // batch.inputs: [B, T] int64 token ids; batch.position_ids as above. Returns logits
  // [B, T, vocab].
  torch::Tensor Forward(const Batch& batch) override;
  torch::Tensor Logits(const torch::Tensor& input_ids);
  // The incremental forward: input_ids [B, T] are the tokens at positions cache.length() ..
  // + T - 1 of B sequences whose earlier tokens `cache` holds (an empty cache: from position
  // 0). Runs only these T tokens, appends their keys and values to `cache`, and returns their
  // logits [B, T, vocab]: the last T rows of Logits over the whole sequences. Rotary tables are
  // those of the sequence length so far, as transformers' generate computes them: "dynamic" and
  // "longrope" scaling, which change with the length, rotate the cached keys at the length they
  // had when they were cached (so past max_position_embeddings resp.
  // original_max_position_embeddings the two forwards differ, as they do in transformers).
  torch::Tensor Logits(const torch::Tensor& input_ids, KvCache& cache);
  // With fused kernels: the final hidden states go through the LM head a chunk of rows at a
  // time into the loss (kernels/linear_cross_entropy.h), never materializing the logits.
  torch::Tensor ForwardLossSum(const Batch& batch) override;

  // Cross-entropy summed in fp32 over logits[:, :-1] against labels[:, 1:], skipping
  // kIgnoreIndex.
  torch::Tensor LossSum(const torch::Tensor& logits, const Batch& batch) const override;
  int64_t CountLossTargets(const Batch& batch) const override;

  std::vector<std::string> LayerUnitClasses() const override { return {"DecoderLayer"}; }
  // "DecoderLayer" is also transformers' layer class of the model's type (ResolvedModelType):
  // LlamaDecoderLayer, MistralDecoderLayer, Phi3DecoderLayer, Qwen2DecoderLayer,
  // Qwen3DecoderLayer, Gemma2DecoderLayer or Gemma3DecoderLayer.
  std::vector<std::string> UnitClassAliases(const std::string& unit_class) const override;
  void SetGradientCheckpointing(bool enabled) override;
  // Per layer, the q/k/v projections' weights and the gate/up projections' weights, each read
  // by one SplitLinear; none with fused_projections (Phi-3), whose qkv_proj and gate_up_proj
  // are one weight each already.
  std::vector<std::vector<std::string>> AdjacentParameterGroups() const override;
  // The norms, QK-norm + rotary and SwiGLU as fused CUDA kernels (eager on the CPU), and the
  // LM head fused with the loss (every device).
  void SetFusedKernels(bool enabled) override;
  // Rows per chunk of the fused LM head + loss (LinearCrossEntropySum's chunk_rows; 0, the
  // default: 4096 rows, at most 2^30 logits a chunk). Fewer, larger chunks read and write the
  // fp32 head weight gradient fewer times (once per chunk) and hold more logits at once.
  void set_loss_chunk_rows(int64_t rows) { loss_chunk_rows_ = rows; }
  // With fused kernels: each layer's MLP keeps gate and up but not act(gate) * up for the
  // backward, which writes the product again (SwiGluMlp::set_recompute_product). Off by default.
  void SetRecomputeMlpProduct(bool enabled);
  // Row-seeded from the DecoderInit seed (whatever the mode the model was built with).
  absl::Status InitializeRows(const std::string& name, int64_t row_begin,
                              torch::Tensor rows) override;

  const proto::DecoderConfig& config() const { return config_; }
  // Every parameter but embed_tokens (a tied head is the embedding): Hugging Face's
  // num_parameters(exclude_embeddings=True), counted at construction, before any sharding.
  int64_t NonEmbeddingParameters() const override { return non_embedding_parameters_; }
  // The DecoderConfig as JSON with its proto field names (Hugging Face's config.json names;
  // protobuf's JSON mapping, which quotes 64-bit integers), fields that are set only.
  std::string ConfigJson() const override;
  const google::protobuf::Message* ConfigProto() const override { return &config_; }
  const std::vector<std::shared_ptr<DecoderLayer>>& layers() const { return layers_; }

 private:
  void InitializeWeights();
  // Embedding, layers and the final norm: [B, T, hidden] (call inside the root hook).
  // position_ids: Batch::position_ids, or undefined for 0..T-1. With `cache` (and no
  // position_ids), the incremental form (Logits(ids, cache)).
  at::Tensor Hidden(const at::Tensor& input_ids, const at::Tensor& position_ids,
                    KvCache* cache = nullptr);
  // What every layer reads besides its input: the rotary tables (`local`: Gemma 3's sliding
  // layers'), and for a packed batch the mask confining attention to each example.
  struct LayerTables {
    RotaryTables rope;
    RotaryTables local;
    at::Tensor mask;
  };
  // Positions past .. past + t - 1 of every row.
  LayerTables TablesFrom(int64_t past, int64_t t, const c10::Device& device) const;
  // Packed rows: the positions Batch::position_ids gives, attention within each example.
  LayerTables TablesAt(const at::Tensor& position_ids, const at::Tensor& input_ids,
                       const c10::Device& device) const;
  torch::Tensor LogitsAt(const torch::Tensor& input_ids, const at::Tensor& position_ids);
  const at::Tensor& HeadWeight() const;
  // cap * tanh(logits / cap) with final_logit_softcapping (Gemma 2), else the logits.
  at::Tensor SoftcapLogits(const at::Tensor& logits) const;
  // Releases `module`'s parameters when building kDeferred.
  void Settle(torch::nn::Module& module);

  proto::DecoderConfig config_;
  int64_t non_embedding_parameters_ = 0;
  DecoderInit init_;
  // Every parameter's position in named_parameters() and its initializer.
  std::unordered_map<std::string, std::pair<int64_t, RowInit>> row_init_;
  int64_t head_dim_;
  bool fused_ = false;
  int64_t loss_chunk_rows_ = 0;
  std::shared_ptr<torch::nn::Module> model_;  // "model": embed_tokens, layers, norm
  torch::nn::Embedding embed_tokens_{nullptr};
  torch::nn::ModuleList layer_list_;
  std::shared_ptr<RmsNorm> norm_;
  torch::nn::Linear lm_head_{nullptr};  // null when tied to embed_tokens
  std::vector<std::shared_ptr<DecoderLayer>> layers_;
};

}  // namespace cpptrain

#endif  // CPPTRAIN_MODELS_DECODER_H_
