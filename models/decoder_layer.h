// The pieces of a Llama/Qwen2/Qwen3/Mistral/Phi-3 decoder layer, with Hugging Face's submodule names so that
// named_parameters() reads "self_attn.q_proj.weight", "mlp.gate_proj.weight", ...
// DecoderLM (decoder.h) stacks them; use that rather than these directly.
//
//   RotaryTables rope = ComputeRotary(seq_len, head_dim, theta, device);
//   auto layer = std::make_shared<DecoderLayer>(config, /*layer_index=*/0);
//   torch::Tensor out = layer->Forward(hidden, rope);   // [B, T, hidden], through the hook
#ifndef CPPTRAIN_MODELS_DECODER_LAYER_H_
#define CPPTRAIN_MODELS_DECODER_LAYER_H_

#include <cstdint>
#include <memory>
#include <utility>

#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include "base/torch_compat.h"
#include "proto/model.pb.h"
#include "module/unit.h"

namespace cpptrain {

// The per-head size: head_dim when set, hidden_size / num_attention_heads otherwise (Llama).
int64_t ResolvedHeadDim(const proto::DecoderConfig& config);
// The rotated part of each head: int(head_dim * partial_rotary_factor), as transformers
// truncates it; head_dim without partial rotation.
int64_t ResolvedRotaryDim(const proto::DecoderConfig& config);

// weight * x / sqrt(mean(x^2) + eps) over the last dimension. Like Hugging Face's LlamaRMSNorm,
// the normalization runs in fp32 and is cast back to the input dtype before the weight
// multiplies it (so the result has the promoted dtype of weight and input).
//
// With unit_offset (Gemma), x / rms(x) * (1 + weight) computed in fp32 and cast to the input
// dtype at the end; the fused kernel does not cover it, so it stays eager.
class RmsNorm : public torch::nn::Module {
 public:
  RmsNorm(int64_t size, double eps, bool unit_offset = false);
  // Fused (kernels/fused_ops.h, on CUDA), the result is in the autocast dtype where autocast
  // is on, else in the promoted dtype.
  torch::Tensor Forward(const torch::Tensor& x) const;
  // {Forward(x), x again} for a pre-norm residual block: the residual add takes the second, so
  // on the fused path the norm's backward adds the residual's gradient in its kernel
  // (kernels::RmsNormAndResidual). The same values as {Forward(x), x} everywhere.
  std::pair<torch::Tensor, torch::Tensor> ForwardWithResidual(const torch::Tensor& x) const;
  const torch::Tensor& weight() const { return weight_; }
  double eps() const { return eps_; }
  bool unit_offset() const { return unit_offset_; }
  void set_fused_kernels(bool enabled) { fused_ = enabled; }

 private:
  double eps_;
  bool unit_offset_;
  bool fused_ = false;
  torch::Tensor weight_;
};

// Rotary tables for positions 0..T-1, fp32, [T, head_dim]: Hugging Face's cat(freqs, freqs)
// layout with inv_freq[i] = theta^(-2i / head_dim). Computed per forward, never registered.
struct RotaryTables {
  torch::Tensor cos;
  torch::Tensor sin;
};
RotaryTables ComputeRotary(int64_t seq_len, int64_t head_dim, double theta,
                           const c10::Device& device);
// The same tables for given inverse frequencies [head_dim / 2] (models/rope_scaling.h), cos and
// sin multiplied by `attention_scaling` in fp32 (yarn's and longrope's factor) unless it is 1.
RotaryTables ComputeRotary(int64_t seq_len, const at::Tensor& inv_freq,
                           double attention_scaling = 1.0);
// theta^(-2i / head_dim) for i < head_dim / 2, fp32 (the default rotary's inverse frequencies).
at::Tensor DefaultInverseFrequencies(int64_t head_dim, double theta, const c10::Device& device);
// The tables at given positions ([B, T] int64, Batch::position_ids): [B, 1, T, D], broadcasting
// over the heads of [B, H, T, D]; the same fp32 values as the [T, D] tables at those rows.
RotaryTables ComputeRotaryAt(const at::Tensor& position_ids, const at::Tensor& inv_freq,
                             double attention_scaling = 1.0);
// bool [B, 1, T, T]: query t may attend to key s <= t of its own example, examples split where
// a position is not the previous one plus 1 (transformers' find_packed_sequence_indices and
// its packed-sequence causal mask).
at::Tensor PackedCausalMask(const at::Tensor& position_ids);

// x * cos + rotate_half(x) * sin for x [B, H, T, D], in x's dtype (HF apply_rotary_pos_emb);
// with tables narrower than D (partial rotation) on the first dimensions, the rest unchanged.
torch::Tensor ApplyRotary(const torch::Tensor& x, const RotaryTables& rope);

// One layer's part of a KvCache (decoder.h): the keys (after QK-norm and rotary) and values of
// the positions first_position .. first_position + keys.size(2) - 1, [B, KV, S, D] each. A
// sliding-window layer keeps only the last window - 1 positions: no later query can see older
// ones. Empty (undefined tensors) before the first incremental forward.
struct LayerKvCache {
  at::Tensor keys;
  at::Tensor values;
  int64_t first_position = 0;
  // The position the next token takes: every position before it has gone through this layer.
  int64_t next_position = 0;
};

// Grouped-query causal self-attention: q_proj, k_proj, v_proj, o_proj (bias on all four when
// attention_bias, as in HF Llama/Qwen3; on q, k and v when qkv_bias, as in Qwen2), or o_proj and
// one qkv_proj with fused_projections (Phi-3), Qwen3's per-head q_norm / k_norm when qk_norm,
// the sliding window in layers from first_sliding_layer on, and attention_dropout on the
// probabilities in training mode.
class Attention : public torch::nn::Module {
 public:
  Attention(const proto::DecoderConfig& config, int64_t layer_index);
  // x: [B, T, hidden] -> [B, T, hidden]. A defined `mask` (PackedCausalMask) replaces the
  // causal mask; the QK-norm + rotary then run eagerly, as the fused kernel takes [T, D] tables.
  // With `cache` (and no mask), x holds the positions cache->next_position .. + T - 1 (`rope`
  // has their rows): their keys and values join the cache and the queries attend to every
  // cached position their mask allows.
  torch::Tensor Forward(const torch::Tensor& x, const RotaryTables& rope,
                        const at::Tensor& mask = {}, LayerKvCache* cache = nullptr);
  void set_fused_kernels(bool enabled);
  // 0: the whole causal prefix.
  int64_t window() const { return window_; }
  double dropout() const { return dropout_; }

 private:
  // Gemma's attention: scores scaled by query_pre_attn_scalar^-0.5 and soft-capped, in
  // transformers' eager order (q: [B, H, T, D]; k, v: [B, KV, T, D]).
  at::Tensor EagerAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& mask) const;
  // Gemma 2's attention on the fused path (causal or windowed, no packed mask, no dropout):
  // each key/value head's query heads in one matmul (no expanded keys) and the soft-capped
  // softmax in one kernel each way (kernels::SoftcapSoftmax).
  at::Tensor SoftcapAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) const;
  // The scores' scale of the eager and soft-capped attention: scale_, or head_dim^-0.5.
  double ScoreScale() const;
  // Attention of the queries at positions query_position .. + T - 1 over the keys at
  // key_position .. + S - 1 (causal, or `mask` where defined; the window, Gemma's scale and
  // soft-capping), eager.
  at::Tensor OffsetAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             int64_t query_position, int64_t key_position,
                             const at::Tensor& mask) const;
  // Appends k and v ([B, KV, T, D]) to `cache`; returns every cached key and value.
  std::pair<at::Tensor, at::Tensor> Remember(const at::Tensor& k, const at::Tensor& v,
                                             LayerKvCache& cache) const;

  struct Projected {
    at::Tensor q, k, v;  // [B, T, heads, D], v [B, KV, T, D]
  };
  Projected Project(const torch::Tensor& x);
  AttentionOptions Options(const at::Tensor& mask = {}) const;

  bool fused_ = false;
  int64_t window_ = 0;
  double dropout_ = 0;
  double scale_ = 0;    // 0: head_dim^-0.5
  double softcap_ = 0;  // 0: none
  // The QK-norm + rotary eager on the fused path too: Gemma 3's (1 + w) QK-norm, or a partial
  // rotation (the fused kernel turns whole heads with a plain w norm).
  bool eager_rope_ = false;
  // Gemma's attention in transformers' eager order on the eager path. On the fused path only
  // soft-capping keeps it (no fused kernel caps the scores); Gemma's scale goes to
  // CausalAttention's options.
  bool gemma_attention_ = false;
  int64_t num_heads_;
  int64_t num_kv_heads_;
  int64_t head_dim_;
  torch::nn::Linear q_proj_{nullptr};
  torch::nn::Linear k_proj_{nullptr};
  torch::nn::Linear v_proj_{nullptr};
  torch::nn::Linear o_proj_{nullptr};
  torch::nn::Linear qkv_proj_{nullptr};  // fused_projections: q_proj, k_proj, v_proj null
  std::shared_ptr<RmsNorm> q_norm_;  // null without qk_norm
  std::shared_ptr<RmsNorm> k_norm_;
};

// down_proj(silu(gate_proj(x)) * up_proj(x)), with biases when mlp_bias (Llama); with
// fused_projections gate and up are the two halves of one gate_up_proj (Phi-3).
class SwiGluMlp : public torch::nn::Module {
 public:
  explicit SwiGluMlp(const proto::DecoderConfig& config);
  torch::Tensor Forward(const torch::Tensor& x);
  void set_fused_kernels(bool enabled) { fused_ = enabled; }
  // With fused kernels: the activation and down_proj as one GatedDown node (models/gated_down.h),
  // which keeps gate and up but not their product for the backward.
  void set_recompute_product(bool enabled) { recompute_product_ = enabled; }

 private:
  bool fused_ = false;
  bool recompute_product_ = false;
  bool gelu_tanh_ = false;  // GeGLU (Gemma's gelu_pytorch_tanh), else SwiGLU
  torch::nn::Linear gate_proj_{nullptr};
  torch::nn::Linear up_proj_{nullptr};
  torch::nn::Linear down_proj_{nullptr};
  torch::nn::Linear gate_up_proj_{nullptr};  // fused_projections: gate_proj, up_proj null
};

// While one is alive on this thread, MakeLinear and MakeEmbedding skip LibTorch's default
// initializers (kaiming-uniform, normal): the parameters get memory of the right shape and
// nothing is drawn. For a deferred build (DecoderInit::Mode::kDeferred), whose parameters are
// freed as each block is built and filled later by a loader or a sharding engine, those draws
// were about 40% of loading a Hugging Face directory. Other builds overwrite every parameter in
// DecoderLM::InitializeWeights, but after drawing, so they keep the draws (the seeded initial
// weights stay what they were).
class SkipDefaultInit {
 public:
  SkipDefaultInit();
  ~SkipDefaultInit();
  SkipDefaultInit(const SkipDefaultInit&) = delete;
  SkipDefaultInit& operator=(const SkipDefaultInit&) = delete;

 private:
  bool was_ = false;
};

// torch::nn::Linear and torch::nn::Embedding of the given sizes, initialized by LibTorch's
// defaults unless a SkipDefaultInit is alive (then their values are whatever memory held).
torch::nn::Linear MakeLinear(int64_t in, int64_t out, bool bias);
torch::nn::Embedding MakeEmbedding(int64_t count, int64_t dim);

// Pre-norm residual block, unit class "DecoderLayer":
//   h = x + self_attn(input_layernorm(x)); out = h + mlp(post_attention_layernorm(h)),
// with residual_dropout on self_attn's and mlp's outputs in training mode (Phi-3). With
// sandwich_norms (Gemma 2/3):
//   h = x + post_attention_layernorm(self_attn(input_layernorm(x)));
//   out = h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h))).
class DecoderLayer : public Unit {
 public:
  // `layer_index` (from 0) decides whether the layer has the sliding window.
  DecoderLayer(const proto::DecoderConfig& config, int64_t layer_index);

  // Runs the block through the unit hook. With checkpointing, the block runs inside the hook
  // through RecomputeInBackward, so a hook that gathers parameters before the forward (and
  // again before the backward) has them in place for the recomputation too. With attention
  // dropout in training mode the recomputation replays the forward's masks (the CPU generator's
  // state is kept from the forward and set around the recomputation); on CUDA that combination
  // throws.
  // `mask`: Attention::Forward's.
  torch::Tensor Forward(torch::Tensor x, const RotaryTables& rope, const at::Tensor& mask = {});
  // The incremental forward (Attention::Forward with a cache), through the hook, never
  // recomputed: generation runs without gradients.
  torch::Tensor Forward(torch::Tensor x, const RotaryTables& rope, LayerKvCache& cache);

  void set_gradient_checkpointing(bool enabled) { gradient_checkpointing_ = enabled; }
  bool gradient_checkpointing() const { return gradient_checkpointing_; }
  // The fused CUDA kernels of kernels/fused_ops.h for the norms, QK-norm + rotary and SwiGLU
  // (each falls back to its eager reference where it does not apply, e.g. on the CPU).
  void set_fused_kernels(bool enabled);
  const std::shared_ptr<Attention>& self_attn() const { return self_attn_; }
  const std::shared_ptr<SwiGluMlp>& mlp() const { return mlp_; }

 private:
  torch::Tensor Body(const torch::Tensor& x, const RotaryTables& rope, const at::Tensor& mask,
                     LayerKvCache* cache = nullptr);

  // The dropout before a residual add: none outside training.
  at::Tensor ResidualDropout(const at::Tensor& x) const;
  // Whether a forward in this mode draws random numbers (attention or residual dropout).
  bool Draws() const;

  bool gradient_checkpointing_ = false;
  bool fused_kernels_ = false;
  double residual_dropout_ = 0;
  std::shared_ptr<Attention> self_attn_;
  std::shared_ptr<SwiGluMlp> mlp_;
  std::shared_ptr<RmsNorm> input_layernorm_;
  std::shared_ptr<RmsNorm> post_attention_layernorm_;
  std::shared_ptr<RmsNorm> pre_feedforward_layernorm_;  // null without sandwich_norms
  std::shared_ptr<RmsNorm> post_feedforward_layernorm_;
};

}  // namespace cpptrain

#endif  // CPPTRAIN_MODELS_DECODER_LAYER_H_
