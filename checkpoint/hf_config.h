// A Hugging Face config.json (transformers' save_pretrained) read into, and written from, the
// reference decoder's DecoderConfig: only JSON and the config proto, no LibTorch tensors, so
// tools and tests that need the configuration alone (and the config.json fuzzer) do not load
// weights. checkpoint/hf_model.h loads the weights beside it.
//
//   CT_ASSIGN_OR_RETURN(proto::DecoderConfig config,
//                       DecoderConfigFromHfConfig(dir + "/config.json"));
//   CT_RETURN_IF_ERROR(WriteHfModelConfigs(config, out_dir));  // + generation_config.json
//
// For a model whose class the caller does not know (checkpoints, the Trainer):
//   if (const proto::DecoderConfig* c = AsDecoderConfig(model.ConfigProto())) ...
//   CT_RETURN_IF_ERROR(WriteHfModelConfigsFor(model.ConfigProto(), out_dir));
#ifndef CPPTRAIN_CHECKPOINT_HF_CONFIG_H_
#define CPPTRAIN_CHECKPOINT_HF_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/model.pb.h"

namespace cpptrain {

// The DecoderConfig of a config.json whose model_type is "llama", "qwen2" (q/k/v biases),
// "qwen3" (the per-head q/k norm), "mistral" (a sliding window in every layer) or "phi3" (fused
// qkv_proj and gate_up_proj, resid_pdrop, a window in every layer when sliding_window is set,
// "su"/"yarn" scaling read as longrope with the top-level original_max_position_embeddings,
// default 4096; partial_rotary_factor), "gemma2" or "gemma3_text" (GeGLU, (1 + w) norms, the embedding scale,
// sandwich norms, query_pre_attn_scalar, soft-capping with Gemma 2's defaults 50 and 30,
// layer_types or the sliding pattern, QK-norm and the two rope objects of Gemma 3; tied by
// default). Reads the
// sizes, head_dim, num_key_value_heads, rms_norm_eps, tie_word_embeddings, attention_bias (llama,
// qwen3), mlp_bias (llama), attention_dropout, initializer_range, max_position_embeddings, the
// token ids (bos, eos: one or a list, pad), rope_theta either at the top level (transformers 4.x)
// or in "rope_parameters" (5.x), RoPE scaling ("linear", "dynamic", "llama3", "yarn",
// "longrope") from
// "rope_parameters" or "rope_scaling" (4.x), and the sliding window as transformers applies it:
// mistral's sliding_window (absent: 4096; null: none); qwen2's and qwen3's only with
// use_sliding_window, in the layers from max_window_layers on or those layer_types names
// "sliding_attention" (which must be the last ones). A field that is absent or null takes
// transformers' default (head_dim: hidden / heads, 128 for Qwen3; num_key_value_heads: the
// attention heads; llama3's original_max_position_embeddings: max_position_embeddings). Other
// fields (dtype, ...) do not change the decoder and are not read.
// Errors name the file, the field, the value and what to change: another model_type (the
// message lists the supported ones), a RoPE type the decoder does not implement, an
// activation other than silu, a partial_rotary_factor other than 1 outside phi3, mlp_bias outside llama, sliding layers before
// full ones, a wrong JSON type, or a config that fails ValidateDecoderConfig.
absl::StatusOr<proto::DecoderConfig> DecoderConfigFromHfConfig(const std::string& config_json_path);

// The weights' dtype config.json names ("dtype" in transformers 5.x, "torch_dtype" in 4.x),
// such as "bfloat16"; "" when neither is set.
absl::StatusOr<std::string> HfConfigDtype(const std::string& config_json_path);

// The config.json of `config` for transformers (4.x and 5.x): model_type and architectures of
// ResolvedModelType(config) ("qwen3" / Qwen3ForCausalLM, "qwen2" / Qwen2ForCausalLM, "mistral" /
// MistralForCausalLM, "phi3" / Phi3ForCausalLM with resid_pdrop and the top-level
// original_max_position_embeddings, "llama" / LlamaForCausalLM); the sizes, rms_norm_eps,
// tie_word_embeddings, attention_bias (llama, qwen3), mlp_bias (llama), attention_dropout,
// initializer_range, max_position_embeddings, the token ids (null when unset), hidden_act
// "silu", dtype "float32", rope_theta at the top level (4.x), the rotary embedding in
// "rope_parameters" (5.x: rope_type, rope_theta and the scaling fields) and, when scaled, in
// "rope_scaling" (4.x); the window as sliding_window (mistral) or use_sliding_window,
// sliding_window, max_window_layers and layer_types (qwen2, qwen3). Floating-point values are
// written with the fewest digits that read back as the same double, so DecoderConfigFromHfConfig
// returns an equivalent config. head_dim is written when set, and for Qwen3 (whose default is
// 128, not hidden / heads) and Mistral always. `config` must pass ValidateDecoderConfig (a
// non-finite number would not be JSON).
std::string HfConfigJson(const proto::DecoderConfig& config);

// generation_config.json for transformers' generate: the token ids and greedy decoding.
std::string HfGenerationConfigJson(const proto::DecoderConfig& config);

// config.json and generation_config.json in `dir` (each atomically): what from_pretrained reads
// beside the weights.
absl::Status WriteHfModelConfigs(const proto::DecoderConfig& config, const std::string& dir);

// `config` (a model's TrainableModel::ConfigProto()) as a DecoderConfig, or nullptr when it is
// null or another message.
const proto::DecoderConfig* AsDecoderConfig(const google::protobuf::Message* config);

// WriteHfModelConfigs when `config` is a DecoderConfig; nothing (OK) for other models, whose
// checkpoints then hold the weights without a config.json.
absl::Status WriteHfModelConfigsFor(const google::protobuf::Message* config,
                                    const std::string& dir);

// HfConfigJson(config) written to `path` atomically. Checks the config with
// ValidateDecoderConfig first.
absl::Status WriteHfConfig(const proto::DecoderConfig& config, const std::string& path);

}  // namespace cpptrain

#endif  // CPPTRAIN_CHECKPOINT_HF_CONFIG_H_
