#include "kernels/fused_ops.h"
#include "models/decoder_layer.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <limits>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "base/torch_compat.h"
#include "models/gated_down.h"
#include "models/recompute.h"
#include "models/split_linear.h"

namespace cpptrain {
namespace {

thread_local bool skip_default_init = false;  // a SkipDefaultInit is alive

// The window of layer `layer_index`: from layer_types when set, else from first_sliding_layer.
int64_t LayerWindow(const proto::DecoderConfig& config, int64_t layer_index) {
  if (!config.has_sliding_window()) return 0;
  if (config.layer_types_size() > 0) {
    return config.layer_types(layer_index) == "sliding_attention" ? config.sliding_window() : 0;
  }
  return layer_index >= config.first_sliding_layer() ? config.sliding_window() : 0;
}

// The projections of x (q, k and v; gate and up): blocks of `sizes` rows of `stacked`'s weight
// where it is set (Phi-3), else one of `layers` each. The fused path computes them as one
// SplitLinear node (contiguous blocks, x's gradient accumulated in the matmuls); the eager path
// as transformers does, one linear each or the stacked output split.
std::vector<at::Tensor> Projections(const at::Tensor& x, torch::nn::Linear stacked,
                                    const std::vector<torch::nn::Linear>& layers,
                                    std::vector<int64_t> sizes, bool fused) {
  if (!stacked.is_empty()) {
    return fused ? SplitLinear(x, stacked->weight, stacked->bias, std::move(sizes))
                 : stacked->forward(x).split_with_sizes(sizes, -1);
  }
  std::vector<at::Tensor> out, weights, biases;
  for (torch::nn::Linear layer : layers) {  // a handle: forward is not const
    if (!fused) {
      out.push_back(layer->forward(x));
      continue;
    }
    weights.push_back(layer->weight);
    if (layer->bias.defined()) biases.push_back(layer->bias);
  }
  return fused ? SplitLinear(x, weights, biases) : out;
}

// The dtype a fused step writes: autocast's where it is on, else what eager promotion gives.
at::ScalarType FusedOutputType(const at::Tensor& x, const at::Tensor& weight) {
  const at::DeviceType device = x.device().type();
  return AutocastEnabled(device) ? AutocastDtype(device) : at::result_type(x, weight);
}

}  // namespace

SkipDefaultInit::SkipDefaultInit() : was_(skip_default_init) { skip_default_init = true; }
SkipDefaultInit::~SkipDefaultInit() { skip_default_init = was_; }

torch::nn::Linear MakeLinear(int64_t in, int64_t out, bool bias) {
  if (!skip_default_init) return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
  // Built with no rows (its initializers fill nothing, so nothing is drawn), then given its
  // real shape's memory.
  torch::nn::Linear linear(torch::nn::LinearOptions(1, 0).bias(bias));
  linear->options.in_features(in).out_features(out);
  linear->weight.set_data(torch::empty({out, in}));
  if (bias) linear->bias.set_data(torch::empty({out}));
  return linear;
}

torch::nn::Embedding MakeEmbedding(int64_t count, int64_t dim) {
  if (!skip_default_init) return torch::nn::Embedding(count, dim);
  torch::nn::Embedding embedding(0, 1);
  embedding->options.num_embeddings(count).embedding_dim(dim);
  embedding->weight.set_data(torch::empty({count, dim}));
  return embedding;
}

int64_t ResolvedHeadDim(const proto::DecoderConfig& config) {
  if (config.has_head_dim()) return config.head_dim();
  return config.hidden_size() / config.num_attention_heads();
}

int64_t ResolvedRotaryDim(const proto::DecoderConfig& config) {
  return static_cast<int64_t>(static_cast<double>(ResolvedHeadDim(config)) *
                              config.partial_rotary_factor());
}

RmsNorm::RmsNorm(int64_t size, double eps, bool unit_offset)
    : torch::nn::Module("RmsNorm"), eps_(eps), unit_offset_(unit_offset) {
  weight_ = register_parameter("weight", unit_offset ? at::zeros({size}) : at::ones({size}));
}

torch::Tensor RmsNorm::Forward(const torch::Tensor& x) const {
  if (unit_offset_ && !fused_) {
    const at::Tensor x32 = x.to(at::kFloat);
    const at::Tensor normed = x32 * at::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps_);
    return (normed * (weight_.to(at::kFloat) + 1.0)).to(x.scalar_type());
  }
  if (unit_offset_) {
    // Gemma: x / rms(x) * (1 + w) in fp32, rounded once to x's dtype. The kernel rounds
    // x / rms(x) to x's dtype before the weight, so x goes in as fp32 (a cast only where x is
    // 16-bit) and the weight as 1 + w.
    return kernels::RmsNorm(x.to(at::kFloat), weight_.to(at::kFloat) + 1.0, eps_,
                            x.scalar_type(), /*fused=*/true)
        .to(x.scalar_type());
  }
  if (!fused_) return kernels::RmsNormReference(x, weight_, eps_);
  return kernels::RmsNorm(x, weight_, eps_, FusedOutputType(x, weight_), /*fused=*/true);
}

std::pair<torch::Tensor, torch::Tensor> RmsNorm::ForwardWithResidual(
    const torch::Tensor& x) const {
  if (unit_offset_ || !fused_) return {Forward(x), x};
  return kernels::RmsNormAndResidual(x, weight_, eps_, FusedOutputType(x, weight_),
                                     /*fused=*/true);
}

at::Tensor DefaultInverseFrequencies(int64_t head_dim, double theta, const c10::Device& device) {
  // Same fp32 operations as HF's _compute_default_rope_parameters.
  const at::Tensor exponents =
      at::arange(0, head_dim, 2, at::TensorOptions().dtype(at::kLong).device(device))
          .to(at::kFloat) /
      head_dim;
  return 1.0 / at::pow(theta, exponents);
}

RotaryTables ComputeRotary(int64_t seq_len, int64_t head_dim, double theta,
                           const c10::Device& device) {
  // Same fp32 operations as HF's LlamaRotaryEmbedding.
  return ComputeRotary(seq_len, DefaultInverseFrequencies(head_dim, theta, device));
}

RotaryTables ComputeRotaryAt(const at::Tensor& position_ids, const at::Tensor& inv_freq,
                             double attention_scaling) {
  // position * inv_freq, one fp32 product per element as in outer() (and in HF's matmul over a
  // dimension of 1), so a row equals the [T, D] table's row at that position.
  const at::Tensor freqs = position_ids.to(inv_freq.scalar_type()).unsqueeze(-1) * inv_freq;
  const at::Tensor emb = at::cat({freqs, freqs}, -1).unsqueeze(1);  // [B, 1, T, D]
  if (attention_scaling == 1.0) return {emb.cos(), emb.sin()};
  return {emb.cos() * attention_scaling, emb.sin() * attention_scaling};
}

at::Tensor PackedCausalMask(const at::Tensor& position_ids) {
  const int64_t t = position_ids.size(1);
  // Example index of each token: a new example wherever the position is not previous + 1.
  const at::Tensor starts =
      at::cat({at::ones({position_ids.size(0), 1}, position_ids.options().dtype(at::kLong)),
               (position_ids.slice(1, 1) - position_ids.slice(1, 0, t - 1)).ne(1).to(at::kLong)},
              1);
  const at::Tensor example = starts.cumsum(1);  // [B, T]
  const at::Tensor same = example.unsqueeze(2).eq(example.unsqueeze(1));  // [B, T, T]
  const at::Tensor index = at::arange(t, position_ids.options().dtype(at::kLong));
  const at::Tensor causal = index.unsqueeze(0).le(index.unsqueeze(1));  // key <= query
  return same.logical_and(causal).unsqueeze(1);
}

RotaryTables ComputeRotary(int64_t seq_len, const at::Tensor& inv_freq,
                           double attention_scaling) {
  const at::Tensor positions = at::arange(seq_len, inv_freq.options());
  const at::Tensor freqs = at::outer(positions, inv_freq);  // [T, D/2]
  const at::Tensor emb = at::cat({freqs, freqs}, -1);       // [T, D]
  if (attention_scaling == 1.0) return {emb.cos(), emb.sin()};
  return {emb.cos() * attention_scaling, emb.sin() * attention_scaling};
}

torch::Tensor ApplyRotary(const torch::Tensor& x, const RotaryTables& rope) {
  const int64_t rotary = rope.cos.size(-1);
  if (rotary == x.size(-1)) return kernels::ApplyRotaryReference(x, rope.cos, rope.sin);
  return at::cat({kernels::ApplyRotaryReference(x.slice(-1, 0, rotary), rope.cos, rope.sin),
                  x.slice(-1, rotary)},
                 -1);
}

Attention::Attention(const proto::DecoderConfig& config, int64_t layer_index)
    : torch::nn::Module("Attention"),
      window_(LayerWindow(config, layer_index)),
      dropout_(config.attention_dropout()),
      scale_(config.has_query_pre_attn_scalar() ? std::pow(config.query_pre_attn_scalar(), -0.5)
                                                : 0.0),
      softcap_(config.attn_logit_softcapping()),
      // The fused QK-norm + rotary kernel turns the whole head.
      eager_rope_((config.qk_norm() && config.norm_unit_offset()) ||
                  ResolvedRotaryDim(config) != ResolvedHeadDim(config)),
      gemma_attention_(config.norm_unit_offset() || config.has_query_pre_attn_scalar() ||
                       config.has_attn_logit_softcapping()),
      num_heads_(config.num_attention_heads()),
      num_kv_heads_(config.num_key_value_heads()),
      head_dim_(ResolvedHeadDim(config)) {
  const int64_t hidden = config.hidden_size();
  const bool bias = config.attention_bias() || config.qkv_bias();
  const int64_t q_size = num_heads_ * head_dim_;
  const int64_t kv_size = num_kv_heads_ * head_dim_;
  if (config.fused_projections()) {
    // Phi-3's order: o_proj, then qkv_proj.
    o_proj_ = register_module("o_proj", MakeLinear(q_size, hidden, config.attention_bias()));
    qkv_proj_ = register_module("qkv_proj", MakeLinear(hidden, q_size + 2 * kv_size, bias));
  } else {
    q_proj_ = register_module("q_proj", MakeLinear(hidden, q_size, bias));
    k_proj_ = register_module("k_proj", MakeLinear(hidden, kv_size, bias));
    v_proj_ = register_module("v_proj", MakeLinear(hidden, kv_size, bias));
    o_proj_ = register_module("o_proj", MakeLinear(q_size, hidden, config.attention_bias()));
  }
  if (config.qk_norm()) {
    const double eps = config.rms_norm_eps();
    const bool offset = config.norm_unit_offset();
    q_norm_ = register_module("q_norm", std::make_shared<RmsNorm>(head_dim_, eps, offset));
    k_norm_ = register_module("k_norm", std::make_shared<RmsNorm>(head_dim_, eps, offset));
  }
}

Attention::Projected Attention::Project(const torch::Tensor& x) {
  const int64_t b = x.size(0);
  const int64_t t = x.size(1);
  const int64_t q_size = num_heads_ * head_dim_;
  const int64_t kv_size = num_kv_heads_ * head_dim_;
  // [B, T, q_size], then two [B, T, kv_size].
  const std::vector<at::Tensor> qkv =
      Projections(x, qkv_proj_, {q_proj_, k_proj_, v_proj_}, {q_size, kv_size, kv_size}, fused_);
  return {qkv[0].view({b, t, num_heads_, head_dim_}), qkv[1].view({b, t, num_kv_heads_, head_dim_}),
          qkv[2].view({b, t, num_kv_heads_, head_dim_}).transpose(1, 2)};
}

torch::Tensor Attention::Forward(const torch::Tensor& x, const RotaryTables& rope,
                                 const at::Tensor& mask, LayerKvCache* cache) {
  const int64_t b = x.size(0);
  const int64_t t = x.size(1);
  auto [q, k, v] = Project(x);
  // A packed batch's rotary tables are per token; the fused kernel takes [T, D] ones.
  const bool fused_rope = fused_ && !eager_rope_ && !mask.defined();
  if (fused_rope) {
    // Norm, rotary, the [B, H, T, D] layout and the attention dtype in one kernel each for q
    // and k; their backward lays the gradients of q, k and v side by side for Project's
    // SplitLinear (one matmul for x's gradient).
    const at::Tensor no_weight;
    const double eps = q_norm_ ? q_norm_->eps() : 0.0;
    std::tie(q, k, v) = kernels::QkvNormRope(q, k, v, q_norm_ ? q_norm_->weight() : no_weight,
                                             k_norm_ ? k_norm_->weight() : no_weight, eps,
                                             rope.cos, rope.sin, v.scalar_type(), /*fused=*/true);
  } else {
    if (q_norm_ != nullptr) {
      q = q_norm_->Forward(q);
      k = k_norm_->Forward(k);
    }
    // Under autocast the norms promote q and k to fp32 while v stays in the compute dtype; the
    // attention kernels want one dtype.
    q = ApplyRotary(q.transpose(1, 2), rope).to(v.scalar_type());
    k = ApplyRotary(k.transpose(1, 2), rope).to(v.scalar_type());
  }
  at::Tensor out;  // [B, H, T, D]
  if (cache != nullptr) {
    const int64_t query_position = cache->next_position;
    auto [keys, values] = Remember(k, v, *cache);
    out = OffsetAttention(q, keys, values, query_position,
                          cache->next_position - keys.size(2), /*mask=*/at::Tensor());
    // Only now: OffsetAttention needed the keys' first position before trimming.
    if (window_ > 0 && cache->keys.size(2) > window_ - 1) {
      const int64_t keep = window_ - 1;
      cache->keys = cache->keys.slice(2, cache->keys.size(2) - keep).contiguous();
      cache->values = cache->values.slice(2, cache->values.size(2) - keep).contiguous();
      cache->first_position = cache->next_position - keep;
    }
  } else if (softcap_ > 0 && fused_ && !mask.defined() && Options().dropout == 0) {
    out = SoftcapAttention(q, k, v);
  } else if (softcap_ > 0 || (gemma_attention_ && !fused_)) {
    out = EagerAttention(q, k, v, mask);
  } else {
    out = CausalAttention(q, k, v, Options(mask));
  }
  return o_proj_->forward(out.transpose(1, 2).reshape({b, t, num_heads_ * head_dim_}));
}

std::pair<at::Tensor, at::Tensor> Attention::Remember(const at::Tensor& k, const at::Tensor& v,
                                                      LayerKvCache& cache) const {
  if (cache.keys.defined()) {
    TORCH_CHECK(cache.keys.size(0) == k.size(0), "the KV cache holds a batch of ",
                cache.keys.size(0), " sequences, the forward has ", k.size(0),
                ": use one cache per batch");
    cache.keys = at::cat({cache.keys, k}, 2);
    cache.values = at::cat({cache.values, v}, 2);
  } else {
    cache.keys = k.contiguous();
    cache.values = v.contiguous();
    cache.first_position = cache.next_position;
  }
  cache.next_position += k.size(2);
  return {cache.keys, cache.values};
}

at::Tensor Attention::OffsetAttention(const at::Tensor& q, const at::Tensor& k,
                                      const at::Tensor& v, int64_t query_position,
                                      int64_t key_position, const at::Tensor& mask) const {
  const int64_t groups = num_heads_ / num_kv_heads_;
  const at::Tensor keys = groups == 1 ? k : k.repeat_interleave(groups, 1);
  const at::Tensor values = groups == 1 ? v : v.repeat_interleave(groups, 1);
  at::Tensor scores = at::matmul(q, keys.transpose(2, 3)) * ScoreScale();
  if (softcap_ > 0) scores = at::tanh(scores / softcap_) * softcap_;
  const auto options = at::TensorOptions().dtype(at::kLong).device(q.device());
  const at::Tensor query = at::arange(query_position, query_position + q.size(2), options)
                               .unsqueeze(1);
  const at::Tensor key = at::arange(key_position, key_position + k.size(2), options).unsqueeze(0);
  at::Tensor allowed = mask.defined() ? mask : key <= query;
  if (window_ > 0) allowed = allowed.logical_and(key > query - window_);
  scores = scores.masked_fill(allowed.logical_not(), -std::numeric_limits<double>::infinity());
  at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(q.scalar_type());
  const double dropout = Options().dropout;
  if (dropout > 0) probs = at::dropout(probs, dropout, /*train=*/true);
  return at::matmul(probs, values);
}

double Attention::ScoreScale() const {
  // transformers: query_pre_attn_scalar**-0.5, or head_dim**-0.5.
  return scale_ > 0 ? scale_ : std::pow(static_cast<double>(head_dim_), -0.5);
}

at::Tensor Attention::SoftcapAttention(const at::Tensor& q, const at::Tensor& k,
                                       const at::Tensor& v) const {
  const int64_t b = q.size(0), t = q.size(2), groups = num_heads_ / num_kv_heads_;
  // Query head h reads key/value head h / groups: [B, H, T, D] is [B, KV, groups * T, D].
  const at::Tensor grouped = q.reshape({b, num_kv_heads_, groups * t, head_dim_});
  const at::Tensor scores =
      at::matmul(grouped, k.transpose(2, 3)).view({b, num_heads_, t, k.size(2)});
  const at::Tensor probs = kernels::SoftcapSoftmax(scores, ScoreScale(), softcap_, window_, true);
  return at::matmul(probs.view({b, num_kv_heads_, groups * t, k.size(2)}), v)
      .view({b, num_heads_, t, head_dim_});
}

at::Tensor Attention::EagerAttention(const at::Tensor& q, const at::Tensor& k,
                                     const at::Tensor& v, const at::Tensor& mask) const {
  return OffsetAttention(q, k, v, /*query_position=*/0, /*key_position=*/0, mask);
}

AttentionOptions Attention::Options(const at::Tensor& mask) const {
  // transformers passes dropout=0.0 outside training, as nn.functional.dropout does.
  return {window_, is_training() ? dropout_ : 0.0, mask, scale_};
}

void Attention::set_fused_kernels(bool enabled) {
  fused_ = enabled;
  if (q_norm_) q_norm_->set_fused_kernels(enabled);
  if (k_norm_) k_norm_->set_fused_kernels(enabled);
}

SwiGluMlp::SwiGluMlp(const proto::DecoderConfig& config)
    : torch::nn::Module("SwiGluMlp"), gelu_tanh_(config.hidden_act() == "gelu_pytorch_tanh") {
  const int64_t hidden = config.hidden_size();
  const int64_t inter = config.intermediate_size();
  const bool bias = config.mlp_bias();
  if (config.fused_projections()) {
    gate_up_proj_ = register_module("gate_up_proj", MakeLinear(hidden, 2 * inter, bias));
  } else {
    gate_proj_ = register_module("gate_proj", MakeLinear(hidden, inter, bias));
    up_proj_ = register_module("up_proj", MakeLinear(hidden, inter, bias));
  }
  down_proj_ = register_module("down_proj", MakeLinear(inter, hidden, bias));
}

torch::Tensor SwiGluMlp::Forward(const torch::Tensor& x) {
  const int64_t inter = down_proj_->weight.size(1);
  const std::vector<at::Tensor> gate_up =
      Projections(x, gate_up_proj_, {gate_proj_, up_proj_}, {inter, inter}, fused_);
  if (fused_ && recompute_product_) {
    return GatedDown(gate_up[0], gate_up[1], down_proj_->weight, down_proj_->bias, gelu_tanh_,
                     true);
  }
  return down_proj_->forward(kernels::Gated(gate_up[0], gate_up[1], gelu_tanh_, fused_));
}

// Registration order follows HF's LlamaDecoderLayer.__init__, so named_parameters() lists
// parameters in the same order as Hugging Face does.
DecoderLayer::DecoderLayer(const proto::DecoderConfig& config, int64_t layer_index)
    : Unit("DecoderLayer"), residual_dropout_(config.residual_dropout()) {
  self_attn_ = register_module("self_attn", std::make_shared<Attention>(config, layer_index));
  mlp_ = register_module("mlp", std::make_shared<SwiGluMlp>(config));
  auto norm = [&] {
    return std::make_shared<RmsNorm>(config.hidden_size(), config.rms_norm_eps(),
                                     config.norm_unit_offset());
  };
  input_layernorm_ = register_module("input_layernorm", norm());
  post_attention_layernorm_ = register_module("post_attention_layernorm", norm());
  if (config.sandwich_norms()) {
    pre_feedforward_layernorm_ = register_module("pre_feedforward_layernorm", norm());
    post_feedforward_layernorm_ = register_module("post_feedforward_layernorm", norm());
  }
}

void DecoderLayer::set_fused_kernels(bool enabled) {
  fused_kernels_ = enabled;
  self_attn_->set_fused_kernels(enabled);
  mlp_->set_fused_kernels(enabled);
  input_layernorm_->set_fused_kernels(enabled);
  post_attention_layernorm_->set_fused_kernels(enabled);
  if (pre_feedforward_layernorm_) pre_feedforward_layernorm_->set_fused_kernels(enabled);
  if (post_feedforward_layernorm_) post_feedforward_layernorm_->set_fused_kernels(enabled);
}

torch::Tensor DecoderLayer::Forward(torch::Tensor x, const RotaryTables& rope,
                                    const at::Tensor& mask) {
  return Hooked(std::move(x), [&](const torch::Tensor& h) {
    if (!gradient_checkpointing_) return Body(h, rope, mask);
    if (!Draws() || !at::GradMode::is_enabled()) {
      // The body is kept until backward: capture the tables by value.
      return RecomputeInBackward(
          [this, rope, mask](const torch::Tensor& in) { return Body(in, rope, mask); }, h);
    }
    // Dropout draws from the default generator: the recomputation must draw the forward's masks
    // (torch.utils.checkpoint's preserve_rng_state). Done for the CPU generator; a CUDA one's
    // state cannot be set while a graph is captured, so CUDA is refused.
    TORCH_CHECK(h.device().is_cpu(), "attention_dropout = ", self_attn_->dropout(),
                " and residual_dropout = ", residual_dropout_,
                " with gradient checkpointing are supported on the CPU only (the recomputation "
                "must replay the forward's dropout masks), not on ", h.device(),
                ". Turn gradient_checkpointing off, or set both dropouts to 0");
    auto forward_state = std::make_shared<at::Tensor>();
    return RecomputeInBackward(
        [this, rope, mask, forward_state](const torch::Tensor& in) {
          at::Generator generator = at::detail::getDefaultCPUGenerator();
          if (!forward_state->defined()) {  // the forward
            {
              std::lock_guard<std::mutex> lock(generator.mutex());
              *forward_state = generator.get_state();
            }
            return Body(in, rope, mask);
          }
          at::Tensor now;
          {
            std::lock_guard<std::mutex> lock(generator.mutex());
            now = generator.get_state();
            generator.set_state(*forward_state);
          }
          at::Tensor out = Body(in, rope, mask);
          std::lock_guard<std::mutex> lock(generator.mutex());
          generator.set_state(now);
          return out;
        },
        h);
  });
}

torch::Tensor DecoderLayer::Forward(torch::Tensor x, const RotaryTables& rope,
                                   LayerKvCache& cache) {
  return Hooked(std::move(x),
                [&](const torch::Tensor& h) { return Body(h, rope, at::Tensor(), &cache); });
}

bool DecoderLayer::Draws() const {
  return is_training() && (self_attn_->dropout() > 0 || residual_dropout_ > 0);
}

at::Tensor DecoderLayer::ResidualDropout(const at::Tensor& x) const {
  if (!is_training() || residual_dropout_ == 0) return x;
  return at::dropout(x, residual_dropout_, /*train=*/true);
}

torch::Tensor DecoderLayer::Body(const torch::Tensor& x, const RotaryTables& rope,
                                 const at::Tensor& mask, LayerKvCache* cache) {
  const bool fused = fused_kernels_;
  if (pre_feedforward_layernorm_) {
    const at::Tensor attn = self_attn_->Forward(input_layernorm_->Forward(x), rope, mask, cache);
    const at::Tensor h =
        kernels::ResidualAdd(x, post_attention_layernorm_->Forward(attn), fused);
    const at::Tensor mlp = mlp_->Forward(pre_feedforward_layernorm_->Forward(h));
    return kernels::ResidualAdd(h, post_feedforward_layernorm_->Forward(mlp), fused);
  }
  const auto [normed, residual] = input_layernorm_->ForwardWithResidual(x);
  const at::Tensor attn = self_attn_->Forward(normed, rope, mask, cache);
  const at::Tensor h = kernels::ResidualAdd(residual, ResidualDropout(attn), fused);
  const auto [normed_h, residual_h] = post_attention_layernorm_->ForwardWithResidual(h);
  const at::Tensor mlp = mlp_->Forward(normed_h);
  return kernels::ResidualAdd(residual_h, ResidualDropout(mlp), fused);
}

}  // namespace cpptrain
