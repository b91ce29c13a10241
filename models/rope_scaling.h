// The inverse frequencies of the decoder's rotary embedding, with transformers' RoPE scaling
// types (DecoderConfig.rope_scaling): none, "linear", "dynamic", "llama3", "yarn" and
// "longrope", and the factor yarn and longrope put on cos and sin. Each follows the fp32
// operations of transformers' modeling_rope_utils, so logits match its eager forward.
//
//   CT_RETURN_IF_ERROR(ValidateRopeScaling(config, head_dim));  // at config time
//   at::Tensor inv_freq = RopeInverseFrequencies(config, head_dim, seq_len, device);
//   double scale = RopeAttentionScaling(config);                 // cos, sin *= scale
#ifndef CPPTRAIN_MODELS_ROPE_SCALING_H_
#define CPPTRAIN_MODELS_ROPE_SCALING_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "proto/model.pb.h"

namespace cpptrain {

// The rope_type values RopeInverseFrequencies implements.
std::vector<std::string> SupportedRopeTypes();

// OK when config has no rope_scaling, or one whose type is supported and whose fields that type
// needs are set and in range (factor >= 1, which yarn and longrope may leave unset;
// attention_factor > 0 when set; llama3, yarn, longrope: original_max_position_embeddings > 0;
// llama3: high_freq_factor > low_freq_factor > 0; longrope: head_dim / 2 short and long
// factors; dynamic: max_position_embeddings > 0). `head_dim` is the rotated size. Errors name
// the field, its value and what to set.
absl::Status ValidateRopeScaling(const proto::DecoderConfig& config, int64_t head_dim);

// The factor transformers' rotary embedding multiplies cos and sin by ("attention_scaling"):
// 1 except for yarn (attention_factor, else 0.1 * ln(factor) + 1, or YaRN's mscale ratio) and
// longrope (attention_factor, else sqrt(1 + ln(factor) / ln(original_max_position_embeddings))
// for factor > 1).
double RopeAttentionScaling(const proto::DecoderConfig& config);

// [head_dim / 2] fp32 on `device`, for a forward over positions 0..seq_len-1. "dynamic" depends
// on seq_len like transformers' first forward of that length: beyond max_position_embeddings
// the base is theta * (factor * seq_len / max_pos - (factor - 1))^(dim / (dim - 2)); transformers
// caches the grown frequencies across calls, this is the stateless form of one call. "longrope"
// uses long_factor when seq_len > original_max_position_embeddings, as transformers' forward.
at::Tensor RopeInverseFrequencies(const proto::DecoderConfig& config, int64_t head_dim,
                                  int64_t seq_len, const c10::Device& device);

// Whether RopeInverseFrequencies reads seq_len ("dynamic", "longrope"): then a forward over
// given position ids passes max(position_ids) + 1, as transformers does.
bool RopeDependsOnLength(const proto::DecoderConfig& config);

}  // namespace cpptrain

#endif  // CPPTRAIN_MODELS_ROPE_SCALING_H_
