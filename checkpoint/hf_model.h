// Loads a Hugging Face model directory, as transformers' save_pretrained writes it (config.json
// and model.safetensors, or shards named by model.safetensors.index.json), into the reference
// decoder, for fine-tuning. Llama and Qwen3 checkpoints are supported.
//
//   CT_ASSIGN_OR_RETURN(std::shared_ptr<DecoderLM> model, LoadHfDecoder("/models/Qwen3-0.6B"));
//
// Sharded at load time, each rank reads only the rows it owns (built deferred, no rank ever
// allocates a whole tensor):
//   CT_ASSIGN_OR_RETURN(auto config, DecoderConfigFromHfConfig(dir + "/config.json"));
//   CT_ASSIGN_OR_RETURN(std::shared_ptr<DecoderLM> model,
//                       BuildDecoder(config, {DecoderInit::Mode::kDeferred, 0}));
//   CT_RETURN_IF_ERROR(FullyShard(*model, mesh, options).status());
//   CT_RETURN_IF_ERROR(LoadHfWeights(dir, *model));
//
// The other direction, a model trained here for transformers' from_pretrained:
//   CT_RETURN_IF_ERROR(WriteHfConfig(model->config(), dir + "/config.json"));
//   CT_RETURN_IF_ERROR(WriteSafetensors(dir + "/model.safetensors", <named_parameters()>,
//                                       {{"format", "pt"}}));
#ifndef CPPTRAIN_CHECKPOINT_HF_MODEL_H_
#define CPPTRAIN_CHECKPOINT_HF_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/decoder.h"
#include "module/trainable_model.h"
#include "proto/model.pb.h"

namespace cpptrain {

// The DecoderConfig of a config.json whose model_type is "llama" or "qwen3" (which adds the
// per-head q/k norm). Reads the sizes, head_dim, num_key_value_heads, rms_norm_eps,
// tie_word_embeddings, attention_bias and initializer_range, and rope_theta either at the top
// level (transformers 4.x) or in "rope_parameters" (5.x). A field that is absent or null takes
// transformers' default (head_dim: hidden / heads for Llama, 128 for Qwen3;
// num_key_value_heads: the attention heads). Other fields (dtype, max_position_embeddings, token
// ids, ...) do not change the decoder and are not read.
// Errors name the file, the field, the value and what to change: another model_type, RoPE
// scaling ("rope_scaling" non-null, or a rope_type other than "default"), an activation other
// than silu, mlp_bias, sliding-window attention, a wrong JSON type, or a config that fails
// ValidateDecoderConfig.
absl::StatusOr<proto::DecoderConfig> DecoderConfigFromHfConfig(const std::string& config_json_path);

// The config.json of `config` for transformers (4.x and 5.x): model_type "qwen3" with
// architectures ["Qwen3ForCausalLM"] when the config has qk_norm, else "llama" with
// ["LlamaForCausalLM"]; the sizes, rms_norm_eps, tie_word_embeddings, attention_bias,
// initializer_range, hidden_act "silu", dtype "float32", and rope_theta both at the top level
// (4.x) and in "rope_parameters" with rope_type "default" (5.x). Floating-point values are
// written with the fewest digits that read back as the same double, so
// DecoderConfigFromHfConfig returns an equal config. head_dim is written when set, and for
// Qwen3 always (transformers' Qwen3 default is 128, not hidden / heads). max_position_embeddings,
// which the decoder does not have, is kHfMaxPositionEmbeddings: it does not change the logits.
// `config` must pass ValidateDecoderConfig (a non-finite number would not be JSON).
inline constexpr int64_t kHfMaxPositionEmbeddings = 4096;
std::string HfConfigJson(const proto::DecoderConfig& config);

// HfConfigJson(config) written to `path` atomically. Checks the config with
// ValidateDecoderConfig first.
absl::Status WriteHfConfig(const proto::DecoderConfig& config, const std::string& path);

struct HfLoadOptions {
  // true, like load_state_dict(strict=True): every mismatch below is one error listing them
  // all. false: one warning each; what matches loads, the rest keeps its initial values.
  // Damage (a checksum mismatch, non-finite values) is an error either way.
  bool strict = true;
};

// Copies the tensors of the safetensors model directory `dir` into the model's parameters of
// the same names (DecoderLM uses Hugging Face's names), converting the file's dtype (BF16,
// F16, F32, F64) to each parameter's. Everything is checked before anything is copied, so an
// error leaves the model unchanged: a parameter without a tensor, a tensor without a parameter
// (allowed: lm_head.weight when the model ties it to the embedding, and rotary inv_freq
// buffers), a shape that differs, a non-floating dtype, config.json fields that differ from a
// DecoderLM's config (rope_theta, rms_norm_eps, head_dim, the sizes, ...), a tensor whose
// bytes fail the checksum its file stores (files written here carry one), NaN or infinite
// values in the rows to load. Errors name the tensor (both shapes, both values, the config
// field that probably differs) and what to do.
//
// When FullyShardedOf(model) is set, each parameter is the rank's chunk of rows
// [row_begin, row_begin + local_rows) of the full tensor (ShardInfo): only those rows are read
// from the file. Call it between steps (parameters at rest, not gathered); every rank calls it
// for its own rows, without communication.
absl::Status LoadHfWeights(const std::string& dir, TrainableModel& model,
                           const HfLoadOptions& options = {});

// DecoderConfigFromHfConfig(dir/config.json), BuildDecoder, then LoadHfWeights: the model on
// the CPU, in fp32, with the checkpoint's weights.
absl::StatusOr<std::shared_ptr<DecoderLM>> LoadHfDecoder(const std::string& dir,
                                                         const HfLoadOptions& options = {});

}  // namespace cpptrain

#endif  // CPPTRAIN_CHECKPOINT_HF_MODEL_H_
