// The inverse frequencies of the decoder's rotary embedding, with transformers' RoPE scaling
// types (DecoderConfig.rope_scaling): none, "linear", "dynamic" and "llama3". Each follows the
// fp32 operations of transformers' modeling_rope_utils, so logits match its eager forward.
//
//   CT_RETURN_IF_ERROR(ValidateRopeScaling(config));            // at config time
//   at::Tensor inv_freq = RopeInverseFrequencies(config, head_dim, seq_len, device);
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
// needs are set and in range (factor >= 1; llama3: high_freq_factor > low_freq_factor > 0 and
// original_max_position_embeddings > 0; dynamic: max_position_embeddings > 0). Errors name the
// field, its value and what to set.
absl::Status ValidateRopeScaling(const proto::DecoderConfig& config);

// [head_dim / 2] fp32 on `device`, for a forward over positions 0..seq_len-1. "dynamic" depends
// on seq_len like transformers' first forward of that length: beyond max_position_embeddings
// the base is theta * (factor * seq_len / max_pos - (factor - 1))^(dim / (dim - 2)); transformers
// caches the grown frequencies across calls, this is the stateless form of one call.
at::Tensor RopeInverseFrequencies(const proto::DecoderConfig& config, int64_t head_dim,
                                  int64_t seq_len, const c10::Device& device);

}  // namespace cpptrain

#endif  // CPPTRAIN_MODELS_ROPE_SCALING_H_
