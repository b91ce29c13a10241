// A Hugging Face config.json (transformers' save_pretrained) read into, and written from, the
// reference decoder's DecoderConfig: only JSON and the config proto, no LibTorch tensors, so
// tools and tests that need the configuration alone (and the config.json fuzzer) do not load
// weights. checkpoint/hf_model.h loads the weights beside it.
//
//   CT_ASSIGN_OR_RETURN(proto::DecoderConfig config,
//                       DecoderConfigFromHfConfig(dir + "/config.json"));
//   CT_RETURN_IF_ERROR(WriteHfModelConfigs(config, out_dir));  // + generation_config.json
#ifndef CPPTRAIN_CHECKPOINT_HF_CONFIG_H_
#define CPPTRAIN_CHECKPOINT_HF_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/model.pb.h"

namespace cpptrain {

// The DecoderConfig of a config.json whose model_type is "llama" or "qwen3" (which adds the
// per-head q/k norm). Reads the sizes, head_dim, num_key_value_heads, rms_norm_eps,
// tie_word_embeddings, attention_bias, initializer_range, max_position_embeddings, the token ids
// (bos, eos: one or a list, pad), rope_theta either at the top level (transformers 4.x) or in
// "rope_parameters" (5.x), and RoPE scaling ("linear", "dynamic", "llama3") from
// "rope_parameters" or "rope_scaling" (4.x). A field that is absent or null takes
// transformers' default (head_dim: hidden / heads for Llama, 128 for Qwen3;
// num_key_value_heads: the attention heads; llama3's original_max_position_embeddings:
// max_position_embeddings). Other fields (dtype, ...) do not change the decoder and are not read.
// Errors name the file, the field, the value and what to change: another model_type, a RoPE
// type the decoder does not implement (yarn, longrope, ...), an activation other than silu,
// mlp_bias, sliding-window attention, a wrong JSON type, or a config that fails
// ValidateDecoderConfig.
absl::StatusOr<proto::DecoderConfig> DecoderConfigFromHfConfig(const std::string& config_json_path);

// The weights' dtype config.json names ("dtype" in transformers 5.x, "torch_dtype" in 4.x),
// such as "bfloat16"; "" when neither is set.
absl::StatusOr<std::string> HfConfigDtype(const std::string& config_json_path);

// The config.json of `config` for transformers (4.x and 5.x): model_type "qwen3" with
// architectures ["Qwen3ForCausalLM"] when the config has qk_norm, else "llama" with
// ["LlamaForCausalLM"]; the sizes, rms_norm_eps, tie_word_embeddings, attention_bias,
// initializer_range, max_position_embeddings, the token ids (null when unset), hidden_act
// "silu", dtype "float32", rope_theta at the top level (4.x), the rotary embedding in
// "rope_parameters" (5.x: rope_type, rope_theta and the scaling fields) and, when scaled, in
// "rope_scaling" (4.x). Floating-point values are written with the fewest digits that read back
// as the same double, so DecoderConfigFromHfConfig returns an equal config. head_dim is written
// when set, and for Qwen3 always (transformers' Qwen3 default is 128, not hidden / heads).
// `config` must pass ValidateDecoderConfig (a non-finite number would not be JSON).
std::string HfConfigJson(const proto::DecoderConfig& config);

// generation_config.json for transformers' generate: the token ids and greedy decoding.
std::string HfGenerationConfigJson(const proto::DecoderConfig& config);

// config.json and generation_config.json in `dir` (each atomically): what from_pretrained reads
// beside the weights.
absl::Status WriteHfModelConfigs(const proto::DecoderConfig& config, const std::string& dir);

// HfConfigJson(config) written to `path` atomically. Checks the config with
// ValidateDecoderConfig first.
absl::Status WriteHfConfig(const proto::DecoderConfig& config, const std::string& path);

}  // namespace cpptrain

#endif  // CPPTRAIN_CHECKPOINT_HF_CONFIG_H_
