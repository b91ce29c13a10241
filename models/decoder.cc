#include "models/decoder.h"

#include <ATen/ATen.h>
#include <google/protobuf/util/json_util.h>
#include <torch/nn/init.h>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/torch_compat.h"
#include "kernels/linear_cross_entropy.h"
#include "models/rope_scaling.h"

namespace cpptrain {

DecoderLM::DecoderLM(const proto::DecoderConfig& config, DecoderInit init)
    : TrainableModel("DecoderLM"),
      config_(config),
      init_(init),
      head_dim_(ResolvedHeadDim(config)) {
  TORCH_CHECK(config.num_hidden_layers() > 0 && head_dim_ > 0 && head_dim_ % 2 == 0 &&
                  config.num_key_value_heads() > 0 &&
                  config.num_attention_heads() % config.num_key_value_heads() == 0,
              "DecoderLM: invalid DecoderConfig; build it through BuildDecoder, which says why");
  std::optional<SkipDefaultInit> undrawn;  // deferred: each block is freed once built
  if (init_.mode == DecoderInit::Mode::kDeferred) undrawn.emplace();
  model_ = register_module("model", std::make_shared<torch::nn::Module>("DecoderModel"));
  embed_tokens_ = model_->register_module(
      "embed_tokens", MakeEmbedding(config.vocab_size(), config.hidden_size()));
  Settle(*embed_tokens_);
  layer_list_ = model_->register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.num_hidden_layers(); ++i) {
    layers_.push_back(std::make_shared<DecoderLayer>(config, i));
    Settle(*layers_.back());
    layer_list_->push_back(layers_.back());
  }
  norm_ = model_->register_module(
      "norm", std::make_shared<RmsNorm>(config.hidden_size(), config.rms_norm_eps(),
                                        config.norm_unit_offset()));
  Settle(*norm_);
  if (!config.tie_word_embeddings()) {
    lm_head_ = register_module(
        "lm_head",
        MakeLinear(config.hidden_size(), config.vocab_size(), /*bias=*/false));
    Settle(*lm_head_);
  }
  for (const auto& item : named_parameters()) non_embedding_parameters_ += item.value().numel();
  non_embedding_parameters_ -= embed_tokens_->weight.numel();
  // The initializer of every parameter, by its name.
  const double std = config_.initializer_range();
  for (const auto& module : named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    const std::string prefix = module.key() + ".";
    RowInit weight{InitKind::kZeros, 0};
    if (module.value()->as<torch::nn::Linear>() || module.value()->as<torch::nn::Embedding>()) {
      weight = {InitKind::kNormal, std};
    } else if (const auto* norm = module.value()->as<RmsNorm>()) {
      weight = {norm->unit_offset() ? InitKind::kZeros : InitKind::kOnes, 0};
    } else {
      continue;
    }
    for (const auto& param : module.value()->named_parameters(/*recurse=*/false)) {
      row_init_[prefix + param.key()] = {0, param.key() == "weight" ? weight : RowInit{}};
    }
  }
  int64_t index = 0;
  for (const auto& param : named_parameters(/*recurse=*/true)) {
    auto it = row_init_.find(param.key());
    TORCH_CHECK(it != row_init_.end(), "DecoderLM: no initializer for parameter ", param.key());
    it->second.first = index++;
  }
  InitializeWeights();
}

void DecoderLM::Settle(torch::nn::Module& module) {
  if (init_.mode == DecoderInit::Mode::kDeferred) DeferParameters(module);
}

absl::Status DecoderLM::InitializeRows(const std::string& name, int64_t row_begin,
                                       torch::Tensor rows) {
  auto it = row_init_.find(name);
  if (it == row_init_.end()) {
    return absl::NotFoundError(absl::StrCat("DecoderLM has no parameter ", name));
  }
  FillRows(it->second.second, init_.seed, it->second.first, row_begin, std::move(rows));
  return absl::OkStatus();
}

void DecoderLM::InitializeWeights() {
  torch::NoGradGuard no_grad;
  if (init_.mode == DecoderInit::Mode::kDeferred) return;
  if (init_.mode == DecoderInit::Mode::kRowSeeded) {
    for (const auto& param : named_parameters(/*recurse=*/true)) {
      const auto& [index, rule] = row_init_.at(param.key());
      FillRows(rule, init_.seed, index, /*row_begin=*/0, param.value());
    }
    return;
  }
  const double std = config_.initializer_range();
  // modules() is a pre-order walk in registration order, so the draws are reproducible.
  for (const auto& module : modules(/*include_self=*/false)) {
    if (auto* linear = module->as<torch::nn::Linear>()) {
      torch::nn::init::normal_(linear->weight, 0.0, std);
      if (linear->bias.defined()) torch::nn::init::zeros_(linear->bias);
    } else if (auto* embedding = module->as<torch::nn::Embedding>()) {
      torch::nn::init::normal_(embedding->weight, 0.0, std);
    } else if (auto* norm = module->as<RmsNorm>()) {
      // Gemma's (1 + w) norms start at 0, as transformers' _init_weights.
      if (norm->unit_offset()) {
        torch::nn::init::zeros_(norm->weight());
      } else {
        torch::nn::init::ones_(norm->weight());
      }
    }
  }
}

torch::Tensor DecoderLM::Forward(const Batch& batch) {
  return LogitsAt(batch.inputs, batch.position_ids);
}

at::Tensor DecoderLM::Hidden(const at::Tensor& ids, const at::Tensor& position_ids,
                             KvCache* cache) {
  at::Tensor h = embed_tokens_->forward(ids);
  if (config_.scale_embeddings()) {
    // Gemma: sqrt(hidden) as an fp32 scalar, rounded to the embedding's dtype, times it.
    const at::Tensor scale =
        at::scalar_tensor(std::sqrt(static_cast<double>(config_.hidden_size())),
                          at::TensorOptions().dtype(at::kFloat).device(h.device()));
    h = h * scale.to(embed_tokens_->weight.scalar_type());
  }
  TORCH_CHECK(!position_ids.defined() || cache == nullptr,
              "DecoderLM: position_ids with a KV cache; the incremental forward takes one "
              "sequence per row, from the cache's length on");
  const int64_t past = cache == nullptr ? 0 : cache->length();
  const LayerTables tables = position_ids.defined()
                                 ? TablesAt(position_ids, ids, h.device())
                                 : TablesFrom(past, ids.size(1), h.device());
  if (cache != nullptr && cache->layers.empty()) cache->layers.resize(layers_.size());
  for (size_t i = 0; i < layers_.size(); ++i) {
    const auto& layer = layers_[i];
    const RotaryTables& rope = layer->self_attn()->window() > 0 ? tables.local : tables.rope;
    h = cache == nullptr ? layer->Forward(std::move(h), rope, tables.mask)
                         : layer->Forward(std::move(h), rope, cache->layers[i]);
  }
  return norm_->Forward(h);
}

DecoderLM::LayerTables DecoderLM::TablesFrom(int64_t past, int64_t t,
                                             const c10::Device& device) const {
  const int64_t length = past + t;
  // The tables of positions 0 .. length - 1, of which the new tokens take the last t rows.
  auto rows = [&](RotaryTables tables) {
    if (past == 0) return tables;
    return RotaryTables{tables.cos.slice(0, past), tables.sin.slice(0, past)};
  };
  LayerTables out;
  out.rope = rows(ComputeRotary(
      length, RopeInverseFrequencies(config_, ResolvedRotaryDim(config_), length, device),
      RopeAttentionScaling(config_)));
  // Gemma 3's sliding layers: the default rotary embedding over rope_local_base_freq.
  out.local = out.rope;
  if (config_.has_rope_local_base_freq()) {
    out.local = rows(ComputeRotary(length, head_dim_, config_.rope_local_base_freq(), device));
  }
  return out;
}

DecoderLM::LayerTables DecoderLM::TablesAt(const at::Tensor& position_ids, const at::Tensor& ids,
                                           const c10::Device& device) const {
  TORCH_CHECK(position_ids.sizes() == ids.sizes(), "DecoderLM: position_ids of shape ",
              position_ids.sizes(), " for input ids of shape ", ids.sizes(),
              ": give one position per token");
  const at::Tensor positions = position_ids.to(device, at::kLong);
  // A length-dependent rotary reads the longest example (a host read of the positions).
  const int64_t rope_len =
      RopeDependsOnLength(config_) ? positions.max().item<int64_t>() + 1 : ids.size(1);
  LayerTables out;
  out.rope = ComputeRotaryAt(
      positions, RopeInverseFrequencies(config_, ResolvedRotaryDim(config_), rope_len, device),
      RopeAttentionScaling(config_));
  out.local = out.rope;
  if (config_.has_rope_local_base_freq()) {
    out.local = ComputeRotaryAt(
        positions, DefaultInverseFrequencies(head_dim_, config_.rope_local_base_freq(), device));
  }
  out.mask = PackedCausalMask(positions);
  return out;
}

at::Tensor DecoderLM::SoftcapLogits(const at::Tensor& logits) const {
  return kernels::SoftcapReference(logits, config_.final_logit_softcapping());
}

const at::Tensor& DecoderLM::HeadWeight() const {
  return lm_head_ ? lm_head_->weight : embed_tokens_->weight;
}

namespace {

void CheckInputIds(const torch::Tensor& input_ids) {
  TORCH_CHECK(input_ids.dim() == 2 && input_ids.scalar_type() == at::kLong,
              "DecoderLM expects [B, T] int64 token ids, got ", input_ids.sizes(), " ",
              input_ids.scalar_type());
}

}  // namespace

torch::Tensor DecoderLM::Logits(const torch::Tensor& input_ids) {
  return LogitsAt(input_ids, at::Tensor());
}

torch::Tensor DecoderLM::LogitsAt(const torch::Tensor& input_ids, const at::Tensor& position_ids) {
  CheckInputIds(input_ids);
  return Hooked(input_ids, [this, &position_ids](const torch::Tensor& ids) {
    return SoftcapLogits(at::linear(Hidden(ids, position_ids), HeadWeight()));
  });
}

torch::Tensor DecoderLM::Logits(const torch::Tensor& input_ids, KvCache& cache) {
  CheckInputIds(input_ids);
  TORCH_CHECK(cache.layers.empty() || cache.layers.size() == layers_.size(), "the KV cache has ",
              cache.layers.size(), " layers, the model ", layers_.size(),
              ": use a cache filled by this model");
  return Hooked(input_ids, [this, &cache](const torch::Tensor& ids) {
    return SoftcapLogits(at::linear(Hidden(ids, at::Tensor(), &cache), HeadWeight()));
  });
}

torch::Tensor DecoderLM::ForwardLossSum(const Batch& batch) {
  if (!fused_) {
    return TrainableModel::ForwardLossSum(batch);
  }
  CheckInputIds(batch.inputs);
  // Position t predicts labels[t + 1]; the last position predicts nothing.
  const at::Tensor& labels = batch.labels;
  const at::Tensor targets =
      at::cat({labels.slice(1, 1), at::full({labels.size(0), 1}, kIgnoreIndex, labels.options())},
              1)
          .reshape({-1});
  return Hooked(batch.inputs, [&](const torch::Tensor& ids) {
    const at::Tensor h = Hidden(ids, batch.position_ids);
    const at::Tensor& w = HeadWeight();
    const at::DeviceType device = h.device().type();
    const at::ScalarType dtype =
        AutocastEnabled(device) ? AutocastDtype(device) : at::result_type(h, w);
    return kernels::LinearCrossEntropySum(h.reshape({-1, h.size(-1)}), w, targets, kIgnoreIndex,
                                          dtype, loss_chunk_rows_,
                                          config_.final_logit_softcapping());
  });
}

torch::Tensor DecoderLM::LossSum(const torch::Tensor& logits, const Batch& batch) const {
  const int64_t t = logits.size(1);
  const at::Tensor shifted_logits =
      logits.slice(1, 0, t - 1).reshape({-1, logits.size(-1)}).to(at::kFloat);
  const at::Tensor shifted_labels = batch.labels.slice(1, 1).reshape({-1});
  return at::cross_entropy_loss(shifted_logits, shifted_labels, /*weight=*/{}, at::Reduction::Sum,
                                kIgnoreIndex);
}

int64_t DecoderLM::CountLossTargets(const Batch& batch) const {
  return batch.labels.slice(1, 1).ne(kIgnoreIndex).sum().item<int64_t>();
}

void DecoderLM::SetFusedKernels(bool enabled) {
  fused_ = enabled;
  for (const auto& layer : layers_) layer->set_fused_kernels(enabled);
  norm_->set_fused_kernels(enabled);
}

void DecoderLM::SetRecomputeMlpProduct(bool enabled) {
  for (const auto& layer : layers_) layer->mlp()->set_recompute_product(enabled);
}

void DecoderLM::SetGradientCheckpointing(bool enabled) {
  for (const auto& layer : layers_) layer->set_gradient_checkpointing(enabled);
}

std::string ResolvedModelType(const proto::DecoderConfig& c) {
  if (c.has_model_type()) return c.model_type();
  if (c.norm_unit_offset()) return c.qk_norm() ? "gemma3_text" : "gemma2";
  if (c.qk_norm()) return "qwen3";
  if (c.fused_projections()) return "phi3";
  if (c.qkv_bias()) return "qwen2";
  if (c.has_sliding_window()) return "mistral";
  return "llama";
}

std::string DecoderLM::ConfigJson() const {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  std::string json;
  // A DecoderConfig has no Any fields, the only thing that fails to print.
  if (!google::protobuf::util::MessageToJsonString(config_, &json, options).ok()) return "";
  return json;
}

std::vector<std::vector<std::string>> DecoderLM::AdjacentParameterGroups() const {
  std::vector<std::vector<std::string>> groups;
  if (config_.fused_projections()) return groups;  // qkv_proj and gate_up_proj: one weight each
  for (size_t i = 0; i < layers_.size(); ++i) {
    const std::string layer = absl::StrCat("model.layers.", i, ".");
    auto weight = [&](const char* module) { return absl::StrCat(layer, module, ".weight"); };
    groups.push_back({weight("self_attn.q_proj"), weight("self_attn.k_proj"),
                      weight("self_attn.v_proj")});
    groups.push_back({weight("mlp.gate_proj"), weight("mlp.up_proj")});
  }
  return groups;
}

std::vector<std::string> DecoderLM::UnitClassAliases(const std::string& unit_class) const {
  if (unit_class != "DecoderLayer") return {};
  const std::string type = ResolvedModelType(config_);
  if (type == "qwen2") return {"Qwen2DecoderLayer"};
  if (type == "qwen3") return {"Qwen3DecoderLayer"};
  if (type == "mistral") return {"MistralDecoderLayer"};
  if (type == "phi3") return {"Phi3DecoderLayer"};
  if (type == "gemma2") return {"Gemma2DecoderLayer"};
  if (type == "gemma3_text") return {"Gemma3DecoderLayer"};
  return {"LlamaDecoderLayer"};
}

}  // namespace cpptrain
