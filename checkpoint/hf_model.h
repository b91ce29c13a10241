// Loads a Hugging Face model directory, as transformers' save_pretrained writes it (config.json
// and model.safetensors, or shards named by model.safetensors.index.json), into the reference
// decoder, for fine-tuning. Llama and Qwen3 checkpoints are supported.
//
//   CT_ASSIGN_OR_RETURN(std::shared_ptr<DecoderLM> model, LoadHfDecoder("/models/Qwen3-0.6B"));
//
// Sharded at load time, each rank reads only the rows it owns:
//   CT_ASSIGN_OR_RETURN(auto config, DecoderConfigFromHfConfig(dir + "/config.json"));
//   CT_ASSIGN_OR_RETURN(std::shared_ptr<DecoderLM> model, BuildDecoder(config));
//   CT_RETURN_IF_ERROR(FullyShard(*model, mesh, options).status());
//   CT_RETURN_IF_ERROR(LoadHfWeights(dir, *model));
#ifndef CPPTRAIN_CHECKPOINT_HF_MODEL_H_
#define CPPTRAIN_CHECKPOINT_HF_MODEL_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/decoder.h"
#include "models/model.h"
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

// Copies the tensors of the safetensors model directory `dir` into the model's parameters of
// the same names (DecoderLM uses Hugging Face's names), converting the file's dtype (BF16,
// F16, F32, F64) to each parameter's. Everything is checked before anything is copied, so an
// error leaves the model unchanged: a parameter without a tensor, a tensor without a parameter
// (allowed: lm_head.weight when the model ties it to the embedding, and rotary inv_freq
// buffers), a shape that differs, a non-floating dtype. Errors name the tensor, both shapes
// and what to do.
//
// When FullyShardedOf(model) is set, each parameter is the rank's chunk of rows
// [row_begin, row_begin + local_rows) of the full tensor (ShardInfo): only those rows are read
// from the file. Call it between steps (parameters at rest, not gathered); every rank calls it
// for its own rows, without communication.
absl::Status LoadHfWeights(const std::string& dir, TrainableModel& model);

// DecoderConfigFromHfConfig(dir/config.json), BuildDecoder, then LoadHfWeights: the model on
// the CPU, in fp32, with the checkpoint's weights.
absl::StatusOr<std::shared_ptr<DecoderLM>> LoadHfDecoder(const std::string& dir);

}  // namespace cpptrain

#endif  // CPPTRAIN_CHECKPOINT_HF_MODEL_H_
