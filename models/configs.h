// Named decoder shapes ("qwen3-0.6b", "llama3-8b", "qwen2.5-0.5b", "qwen2.5-1.5b",
// "mistral-7b", "mistral-7b-8layers", "phi3-mini", "gemma2-2b", "gemma3-1b", "tiny", "demo"),
// their validation, the builder, and the parameter / FLOP counts benchmarks report.
//
//   CT_ASSIGN_OR_RETURN(proto::DecoderConfig config, ResolveModelSpec(job.model()));
//   CT_ASSIGN_OR_RETURN(std::shared_ptr<DecoderLM> model, BuildDecoder(config));
//   double flops = DecoderTrainingFlopsPerToken(config, seq_len) * tokens_per_second;
#ifndef CPPTRAIN_MODELS_CONFIGS_H_
#define CPPTRAIN_MODELS_CONFIGS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "models/decoder.h"
#include "proto/model.pb.h"

namespace cpptrain {

// The names NamedDecoderConfig knows, in a stable order.
std::vector<std::string> KnownDecoderConfigNames();

// The config registered under `name`; InvalidArgument naming the known ones otherwise.
absl::StatusOr<proto::DecoderConfig> NamedDecoderConfig(absl::string_view name);

// The spec's named or inline config, validated. An empty spec is InvalidArgument.
absl::StatusOr<proto::DecoderConfig> ResolveModelSpec(const proto::ModelSpec& spec);

// Every size is set and positive; heads are a multiple of KV heads; without head_dim,
// hidden_size is a multiple of num_attention_heads; head_dim is even (rotary pairs);
// sliding_window, first_sliding_layer and attention_dropout are in range; and the model type
// (ResolvedModelType) has the features set: qwen3 has qk_norm, qwen2 has qkv_bias, only llama
// has mlp_bias, llama has no sliding window, mistral has no biases, phi3 (and only phi3) has
// fused_projections and residual_dropout, gemma2 and gemma3_text (and only they) have GeGLU,
// (1 + w) norms, the embedding scale and sandwich norms, soft-capping, query_pre_attn_scalar
// and layer_types, gemma3_text also qk_norm and rope_local_base_freq.
absl::Status ValidateDecoderConfig(const proto::DecoderConfig& config);

// The Hugging Face model types the decoder implements, for error messages:
// "gemma2", "gemma3_text", "llama", "mistral", "phi3", "qwen2", "qwen3".
std::vector<std::string> SupportedModelTypes();

// Validates `config` and builds the model on the CPU, initialized as `init` says (default:
// from the global generator).
absl::StatusOr<std::shared_ptr<DecoderLM>> BuildDecoder(const proto::DecoderConfig& config,
                                                        DecoderInit init = {});

// The counts below take a valid config and allocate nothing.

// Number of parameters DecoderLM registers (a tied LM head is counted once, in the embedding).
int64_t DecoderParameterCount(const proto::DecoderConfig& config);

// Weights multiplied by each token's activations: attention and MLP projections and the LM
// head (counted even when tied); not the embedding lookup, norms or biases.
int64_t DecoderMatmulParameterCount(const proto::DecoderConfig& config);

// Training FLOPs per token at sequence length `seq_len` (PaLM, appendix B):
//   6 * matmul parameters + 12 * layers * heads * head_dim * seq_len,
// with min(seq_len, sliding_window) in place of seq_len for the sliding-window layers.
double DecoderTrainingFlopsPerToken(const proto::DecoderConfig& config, int64_t seq_len);

}  // namespace cpptrain

#endif  // CPPTRAIN_MODELS_CONFIGS_H_
