#include "models/configs.h"

#include <algorithm>
#include <tuple>
#include <functional>
#include <cmath>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "models/rope_scaling.h"

namespace cpptrain {
namespace {

struct Shape {
  int64_t vocab, hidden, intermediate, layers, heads, kv_heads, head_dim;  // head_dim 0: unset
  double theta, eps;
  bool tied, qk_norm;
  bool qkv_bias = false;       // Qwen2
  int64_t sliding_window = 0;  // Mistral; 0: none
};

proto::DecoderConfig FromShape(const Shape& s) {
  proto::DecoderConfig c;
  c.set_vocab_size(s.vocab);
  c.set_hidden_size(s.hidden);
  c.set_intermediate_size(s.intermediate);
  c.set_num_hidden_layers(s.layers);
  c.set_num_attention_heads(s.heads);
  c.set_num_key_value_heads(s.kv_heads);
  if (s.head_dim > 0) c.set_head_dim(s.head_dim);
  c.set_rope_theta(s.theta);
  c.set_rms_norm_eps(s.eps);
  c.set_tie_word_embeddings(s.tied);
  c.set_qk_norm(s.qk_norm);
  if (s.qkv_bias) c.set_qkv_bias(true);
  if (s.sliding_window > 0) c.set_sliding_window(s.sliding_window);
  return c;
}

// Gemma's pieces beside the shape, as google/gemma-2-2b's and gemma-3-1b-pt's config.json give
// them: Gemma 2 every other layer sliding and soft-capping 50 / 30, Gemma 3 five sliding
// layers to one global and the local rope base 10000 (qk_norm in the shape says which).
void SetGemmaPieces(proto::DecoderConfig& c) {
  c.set_hidden_act("gelu_pytorch_tanh");
  c.set_norm_unit_offset(true);
  c.set_scale_embeddings(true);
  c.set_sandwich_norms(true);
  c.set_query_pre_attn_scalar(256);
  const int64_t every = c.qk_norm() ? 6 : 2;
  for (int64_t i = 0; i < c.num_hidden_layers(); ++i) {
    c.add_layer_types((i + 1) % every != 0 ? "sliding_attention" : "full_attention");
  }
  if (c.qk_norm()) {
    c.set_rope_local_base_freq(10000);
  } else {
    c.set_attn_logit_softcapping(50);
    c.set_final_logit_softcapping(30);
  }
}

// Shapes from the models' Hugging Face config.json files; "tiny" is for unit tests and "demo"
// learns a character-level corpus on two CPU cores in under a minute.
const std::vector<std::pair<std::string, Shape>>& NamedShapes() {
  static const auto* shapes = new std::vector<std::pair<std::string, Shape>>{
      {"qwen3-0.6b", {151936, 1024, 3072, 28, 16, 8, 128, 1e6, 1e-6, true, true}},
      {"llama3-8b", {128256, 4096, 14336, 32, 32, 8, 0, 500000, 1e-5, false, false}},
      {"llama3.2-1b", {128256, 2048, 8192, 16, 32, 8, 64, 500000, 1e-5, true, false}},
      {"llama3.2-3b", {128256, 3072, 8192, 28, 24, 8, 128, 500000, 1e-5, true, false}},
      {"qwen2.5-0.5b", {151936, 896, 4864, 24, 14, 2, 0, 1e6, 1e-6, true, false, true}},
      {"qwen2.5-1.5b", {151936, 1536, 8960, 28, 12, 2, 0, 1e6, 1e-6, true, false, true}},
      {"mistral-7b", {32000, 4096, 14336, 32, 32, 8, 0, 10000, 1e-5, false, false, false, 4096}},
      // Mistral-7B's layers, 8 of its 32 (2.0B parameters): an architecture row that fits one
      // 80 GB GPU with the optimizer's state, where the whole model does not.
      {"mistral-7b-8layers",
       {32000, 4096, 14336, 8, 32, 8, 0, 10000, 1e-5, false, false, false, 4096}},
      {"phi3-mini", {32064, 3072, 8192, 32, 32, 32, 0, 10000, 1e-5, false, false, false, 2047}},
      {"gemma2-2b", {256000, 2304, 9216, 26, 8, 4, 256, 10000, 1e-6, true, false, false, 4096}},
      {"gemma3-1b", {262144, 1152, 6912, 26, 4, 1, 256, 1e6, 1e-6, true, true, false, 512}},
      {"tiny", {64, 32, 64, 2, 4, 2, 8, 10000, 1e-6, true, true}},
      {"demo", {32, 64, 128, 2, 4, 2, 0, 10000, 1e-6, false, false}},
  };
  return *shapes;
}

absl::Status CheckPositive(absl::string_view field, bool has, int64_t value) {
  if (!has) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DecoderConfig.", field, " is not set; set it to a positive size, or use a named "
        "config (ModelSpec.name: ", absl::StrJoin(KnownDecoderConfigNames(), ", "), ")"));
  }
  if (value <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("DecoderConfig.", field, " = ", value,
                                                   " must be positive; set it to a size > 0"));
  }
  return absl::OkStatus();
}

// Gemma's pieces: all of them for gemma2 and gemma3_text, none elsewhere.
absl::Status CheckGemmaFeatures(
    const proto::DecoderConfig& c, const std::string& type,
    const std::function<absl::Status(absl::string_view)>& refuse) {
  const bool gemma = type == "gemma2" || type == "gemma3_text";
  const bool gelu = c.hidden_act() == "gelu_pytorch_tanh";
  if (!gelu && c.hidden_act() != "silu") {
    return absl::InvalidArgumentError(absl::StrCat(
        "DecoderConfig.hidden_act = \"", c.hidden_act(),
        "\" is not implemented; use \"silu\" (SwiGLU) or \"gelu_pytorch_tanh\" (Gemma's GeGLU)"));
  }
  const bool has_all = gelu && c.norm_unit_offset() && c.scale_embeddings() && c.sandwich_norms();
  if (gemma && !has_all) {
    return refuse("lacks one of hidden_act \"gelu_pytorch_tanh\", norm_unit_offset, "
                  "scale_embeddings and sandwich_norms (Gemma has all four)");
  }
  const bool has_any = gelu || c.norm_unit_offset() || c.scale_embeddings() ||
                       c.sandwich_norms() || c.has_query_pre_attn_scalar() ||
                       c.has_attn_logit_softcapping() || c.has_final_logit_softcapping() ||
                       c.layer_types_size() > 0;
  if (!gemma && has_any) {
    return refuse("sets a Gemma feature (GeGLU, (1 + w) norms, embedding scale, sandwich norms, "
                  "query_pre_attn_scalar, soft-capping or layer_types); use model_type "
                  "\"gemma2\" or \"gemma3_text\"");
  }
  if (c.has_rope_local_base_freq() && type != "gemma3_text") {
    return refuse("sets rope_local_base_freq (only gemma3_text has it)");
  }
  return absl::OkStatus();
}

// Gemma's layer_types, soft-capping and scale: in range.
absl::Status CheckGemmaOptions(const proto::DecoderConfig& c) {
  if (c.layer_types_size() > 0) {
    if (c.layer_types_size() != c.num_hidden_layers()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "DecoderConfig.layer_types has ", c.layer_types_size(), " entries for ",
          c.num_hidden_layers(), " layers; give one per layer"));
    }
    for (const std::string& type : c.layer_types()) {
      if (type != "full_attention" && type != "sliding_attention") {
        return absl::InvalidArgumentError(absl::StrCat(
            "DecoderConfig.layer_types has \"", type,
            "\"; each is \"full_attention\" or \"sliding_attention\""));
      }
      if (type == "sliding_attention" && !c.has_sliding_window()) {
        return absl::InvalidArgumentError(
            "DecoderConfig.layer_types names sliding_attention layers but sliding_window is "
            "unset; set the window");
      }
    }
  }
  for (const auto& [field, has, value] :
       {std::tuple<const char*, bool, double>{"query_pre_attn_scalar",
                                              c.has_query_pre_attn_scalar(),
                                              c.query_pre_attn_scalar()},
        {"attn_logit_softcapping", c.has_attn_logit_softcapping(), c.attn_logit_softcapping()},
        {"final_logit_softcapping", c.has_final_logit_softcapping(), c.final_logit_softcapping()},
        {"rope_local_base_freq", c.has_rope_local_base_freq(), c.rope_local_base_freq()}}) {
    if (has && !(value > 0 && std::isfinite(value))) {
      return absl::InvalidArgumentError(absl::StrCat("DecoderConfig.", field, " = ", value,
                                                     " must be finite and > 0, or unset"));
    }
  }
  return absl::OkStatus();
}

// What the model type's transformers class can build: each feature set is one that class has.
absl::Status CheckModelTypeFeatures(const proto::DecoderConfig& c) {
  const std::string type = ResolvedModelType(c);
  const std::vector<std::string> types = SupportedModelTypes();
  if (std::find(types.begin(), types.end(), type) == types.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DecoderConfig.model_type = \"", type, "\" is not implemented; supported: ",
        absl::StrJoin(types, ", "), " (Gemma 1, mixture-of-experts, multimodal and "
        "encoder-decoder models are not)"));
  }
  auto refuse = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("DecoderConfig with model_type \"", type,
                                                   "\" ", what,
                                                   "; transformers' class for that type has no "
                                                   "such model: change the field or model_type"));
  };
  if (c.attention_bias() && c.qkv_bias()) {
    return absl::InvalidArgumentError(
        "DecoderConfig sets both attention_bias (biases on q, k, v and o) and qkv_bias (q, k and "
        "v only); set one");
  }
  if ((type == "qwen3" || type == "gemma3_text") && !c.qk_norm()) {
    return refuse("has qk_norm false (Qwen3 and Gemma 3 always have it)");
  }
  if (type != "qwen3" && type != "gemma3_text" && c.qk_norm()) {
    return refuse("has qk_norm true (only qwen3 and gemma3_text have it)");
  }
  CT_RETURN_IF_ERROR(CheckGemmaFeatures(c, type, refuse));
  if (type == "qwen2" && !c.qkv_bias()) {
    return refuse("has qkv_bias false (Qwen2 always has q/k/v biases)");
  }
  if (type != "qwen2" && c.qkv_bias()) return refuse("has qkv_bias true (only qwen2 has it)");
  if ((type == "qwen2" || type == "mistral") && c.attention_bias()) {
    return refuse("has attention_bias true");
  }
  if (type != "llama" && c.mlp_bias()) return refuse("has mlp_bias true (only llama has it)");
  if (type == "phi3" && !c.fused_projections()) {
    return refuse("has fused_projections false (Phi-3 stores qkv_proj and gate_up_proj)");
  }
  if (type != "phi3" && c.fused_projections()) {
    return refuse("has fused_projections true (only phi3 has it)");
  }
  if (type == "phi3" && c.attention_bias()) return refuse("has attention_bias true");
  if (type != "phi3" && c.partial_rotary_factor() != 1) {
    return refuse(absl::StrCat("has partial_rotary_factor = ", c.partial_rotary_factor(),
                               " (only phi3 rotates part of the head)"));
  }
  if (type != "phi3" && c.residual_dropout() != 0) {
    return refuse(absl::StrCat("has residual_dropout = ", c.residual_dropout(),
                               " (only phi3 has it, as resid_pdrop)"));
  }
  if (type == "llama" && c.has_sliding_window()) {
    return refuse("has a sliding_window (use model_type \"mistral\")");
  }
  if ((type == "mistral" || type == "phi3") && c.first_sliding_layer() != 0) {
    return refuse("has first_sliding_layer > 0 (the window is in every layer)");
  }
  return absl::OkStatus();
}

absl::Status CheckAttentionOptions(const proto::DecoderConfig& c) {
  if (c.has_sliding_window() && c.sliding_window() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("DecoderConfig.sliding_window = ", c.sliding_window(),
                     " must be positive; leave it unset for attention to the whole prefix"));
  }
  if (c.first_sliding_layer() < 0 || c.first_sliding_layer() > c.num_hidden_layers()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DecoderConfig.first_sliding_layer = ", c.first_sliding_layer(),
        " is outside [0, num_hidden_layers = ", c.num_hidden_layers(), "]"));
  }
  if (!(c.attention_dropout() >= 0 && c.attention_dropout() < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("DecoderConfig.attention_dropout = ",
                                                   c.attention_dropout(),
                                                   " must be in [0, 1)"));
  }
  if (!(c.residual_dropout() >= 0 && c.residual_dropout() < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("DecoderConfig.residual_dropout = ",
                                                   c.residual_dropout(), " must be in [0, 1)"));
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<std::string> SupportedModelTypes() {
  return {"gemma2", "gemma3_text", "llama", "mistral", "phi3", "qwen2", "qwen3"};
}


std::vector<std::string> KnownDecoderConfigNames() {
  std::vector<std::string> names;
  for (const auto& [name, shape] : NamedShapes()) names.push_back(name);
  return names;
}

absl::StatusOr<proto::DecoderConfig> NamedDecoderConfig(absl::string_view name) {
  for (const auto& [known, shape] : NamedShapes()) {
    if (known != name) continue;
    proto::DecoderConfig config = FromShape(shape);
    if (absl::StartsWith(name, "phi3")) config.set_fused_projections(true);
    if (absl::StartsWith(name, "gemma")) SetGemmaPieces(config);
    return config;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown model config name \"", name, "\"; known names: ",
                   absl::StrJoin(KnownDecoderConfigNames(), ", "),
                   " (or give a DecoderConfig in ModelSpec.decoder)"));
}

absl::StatusOr<proto::DecoderConfig> ResolveModelSpec(const proto::ModelSpec& spec) {
  proto::DecoderConfig config;
  switch (spec.model_case()) {
    case proto::ModelSpec::kName: {
      CT_ASSIGN_OR_RETURN(config, NamedDecoderConfig(spec.name()));
      break;
    }
    case proto::ModelSpec::kDecoder:
      config = spec.decoder();
      break;
    case proto::ModelSpec::MODEL_NOT_SET:
      return absl::InvalidArgumentError(absl::StrCat(
          "ModelSpec sets neither name nor decoder; set name to one of ",
          absl::StrJoin(KnownDecoderConfigNames(), ", "), " or give a DecoderConfig"));
  }
  CT_RETURN_IF_ERROR(ValidateDecoderConfig(config));
  return config;
}

absl::Status ValidateDecoderConfig(const proto::DecoderConfig& c) {
  CT_RETURN_IF_ERROR(CheckPositive("vocab_size", c.has_vocab_size(), c.vocab_size()));
  CT_RETURN_IF_ERROR(CheckPositive("hidden_size", c.has_hidden_size(), c.hidden_size()));
  CT_RETURN_IF_ERROR(CheckPositive("intermediate_size", c.has_intermediate_size(),
                                   c.intermediate_size()));
  CT_RETURN_IF_ERROR(CheckPositive("num_hidden_layers", c.has_num_hidden_layers(),
                                   c.num_hidden_layers()));
  CT_RETURN_IF_ERROR(CheckPositive("num_attention_heads", c.has_num_attention_heads(),
                                   c.num_attention_heads()));
  CT_RETURN_IF_ERROR(CheckPositive("num_key_value_heads", c.has_num_key_value_heads(),
                                   c.num_key_value_heads()));
  if (c.num_attention_heads() % c.num_key_value_heads() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DecoderConfig.num_attention_heads = ", c.num_attention_heads(),
        " is not a multiple of num_key_value_heads = ", c.num_key_value_heads(),
        "; choose num_key_value_heads dividing num_attention_heads"));
  }
  if (c.has_head_dim()) {
    CT_RETURN_IF_ERROR(CheckPositive("head_dim", true, c.head_dim()));
  } else if (c.hidden_size() % c.num_attention_heads() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DecoderConfig.hidden_size = ", c.hidden_size(),
        " is not a multiple of num_attention_heads = ", c.num_attention_heads(),
        " and head_dim is unset; set head_dim explicitly or make hidden_size divisible"));
  }
  const int64_t head_dim = ResolvedHeadDim(c);
  if (head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("DecoderConfig head_dim = ", head_dim,
                     " is odd; rotary embeddings rotate pairs, so use an even head_dim"));
  }
  const int64_t rotary_dim = ResolvedRotaryDim(c);
  if (!(c.partial_rotary_factor() > 0 && c.partial_rotary_factor() <= 1) || rotary_dim <= 0 ||
      rotary_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DecoderConfig.partial_rotary_factor = ", c.partial_rotary_factor(),
        " turns int(head_dim * factor) = ", rotary_dim, " of head_dim = ", head_dim,
        " dimensions; use a factor in (0, 1] that gives an even, positive count"));
  }
  if (!(c.rope_theta() > 0) || !(c.rms_norm_eps() > 0) || !(c.initializer_range() >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DecoderConfig needs rope_theta > 0, rms_norm_eps > 0 and initializer_range >= 0; got ",
        c.rope_theta(), ", ", c.rms_norm_eps(), ", ", c.initializer_range()));
  }
  CT_RETURN_IF_ERROR(CheckAttentionOptions(c));
  CT_RETURN_IF_ERROR(CheckGemmaOptions(c));
  CT_RETURN_IF_ERROR(CheckModelTypeFeatures(c));
  return ValidateRopeScaling(c, ResolvedRotaryDim(c));
}

absl::StatusOr<std::shared_ptr<DecoderLM>> BuildDecoder(const proto::DecoderConfig& config,
                                                        DecoderInit init) {
  CT_RETURN_IF_ERROR(ValidateDecoderConfig(config));
  return CatchTorch([&] { return std::make_shared<DecoderLM>(config, init); });
}

int64_t DecoderParameterCount(const proto::DecoderConfig& c) {
  const int64_t hidden = c.hidden_size();
  const int64_t head_dim = ResolvedHeadDim(c);
  const int64_t q_size = c.num_attention_heads() * head_dim;
  const int64_t kv_size = c.num_key_value_heads() * head_dim;
  int64_t per_layer = hidden * (q_size + 2 * kv_size) + q_size * hidden +
                      3 * hidden * c.intermediate_size() + 2 * hidden;
  if (c.qk_norm()) per_layer += 2 * head_dim;
  if (c.sandwich_norms()) per_layer += 2 * hidden;
  if (c.attention_bias()) per_layer += q_size + 2 * kv_size + hidden;
  if (c.qkv_bias()) per_layer += q_size + 2 * kv_size;
  if (c.mlp_bias()) per_layer += 2 * c.intermediate_size() + hidden;
  const int64_t embedding = c.vocab_size() * hidden;
  const int64_t lm_head = c.tie_word_embeddings() ? 0 : c.vocab_size() * hidden;
  return embedding + c.num_hidden_layers() * per_layer + hidden + lm_head;
}

int64_t DecoderMatmulParameterCount(const proto::DecoderConfig& c) {
  const int64_t hidden = c.hidden_size();
  const int64_t head_dim = ResolvedHeadDim(c);
  const int64_t q_size = c.num_attention_heads() * head_dim;
  const int64_t kv_size = c.num_key_value_heads() * head_dim;
  const int64_t per_layer = hidden * (q_size + 2 * kv_size) + q_size * hidden +
                            3 * hidden * c.intermediate_size();
  return c.num_hidden_layers() * per_layer + c.vocab_size() * hidden;
}

double DecoderTrainingFlopsPerToken(const proto::DecoderConfig& c, int64_t seq_len) {
  // A sliding-window layer attends to at most `sliding_window` keys.
  int64_t sliding_layers =
      c.has_sliding_window() ? c.num_hidden_layers() - c.first_sliding_layer() : 0;
  if (c.layer_types_size() > 0) {
    sliding_layers = std::count(c.layer_types().begin(), c.layer_types().end(),
                                std::string("sliding_attention"));
  }
  const double context =
      static_cast<double>(c.num_hidden_layers() - sliding_layers) * static_cast<double>(seq_len) +
      static_cast<double>(sliding_layers) *
          static_cast<double>(std::min(seq_len, c.has_sliding_window() ? c.sliding_window()
                                                                       : seq_len));
  return 6.0 * static_cast<double>(DecoderMatmulParameterCount(c)) +
         12.0 * static_cast<double>(c.num_attention_heads()) *
             static_cast<double>(ResolvedHeadDim(c)) * context;
}

}  // namespace cpptrain
