#include "checkpoint/hf_config.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "base/logging.h"
#include "base/status.h"
#include "checkpoint/files.h"
#include "checkpoint/internal/json.h"
#include "models/configs.h"

namespace cpptrain {
namespace {

using checkpoint_internal::JsonGrammar;
using checkpoint_internal::JsonToString;
using checkpoint_internal::JsonValue;

// transformers' defaults for the fields a config.json may leave out.
struct HfDefaults {
  int64_t head_dim;  // 0: hidden_size / num_attention_heads
  double rope_theta;
  double rms_norm_eps;
  double initializer_range;
};

std::optional<HfDefaults> DefaultsFor(absl::string_view model_type) {
  if (model_type == "llama") return HfDefaults{0, 10000, 1e-6, 0.02};
  if (model_type == "qwen2") return HfDefaults{0, 10000, 1e-6, 0.02};
  if (model_type == "qwen3") return HfDefaults{128, 10000, 1e-6, 0.02};
  if (model_type == "mistral") return HfDefaults{0, 10000, 1e-6, 0.02};
  if (model_type == "phi3") return HfDefaults{0, 10000, 1e-5, 0.02};
  if (model_type == "gemma2") return HfDefaults{256, 10000, 1e-6, 0.02};
  if (model_type == "gemma3_text") return HfDefaults{256, 1e6, 1e-6, 0.02};
  return std::nullopt;
}

// "\"llama\", \"mistral\", \"qwen2\", \"qwen3\"".
std::string QuotedModelTypes() {
  std::vector<std::string> quoted;
  for (const std::string& type : SupportedModelTypes()) quoted.push_back(absl::StrCat("\"", type, "\""));
  return absl::StrJoin(quoted, ", ");
}

absl::StatusOr<std::string> ReadTextFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::ErrnoToStatus(
        errno != 0 ? errno : EIO,
        absl::StrCat("cannot read '", path,
                     "'; expected the config.json that save_pretrained writes beside the weights"));
  }
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Typed access to the fields of one JSON object of config.json, with errors that name the file
// and the field. A field that is absent or null reads as nullopt: transformers treats both as
// "use the default".
class ConfigFields {
 public:
  ConfigFields(std::string path, const JsonValue& object, std::string prefix = "")
      : path_(std::move(path)), object_(object), prefix_(std::move(prefix)) {}

  // Whether the key is present at all (null included): for defaults transformers applies only
  // to an absent key.
  bool Has(absl::string_view key) const { return object_.Find(key) != nullptr; }

  const JsonValue* Find(absl::string_view key) const {
    const JsonValue* value = object_.Find(key);
    return value == nullptr || value->is_null() ? nullptr : value;
  }

  absl::StatusOr<std::optional<int64_t>> Int(absl::string_view key) const {
    const JsonValue* value = Find(key);
    if (value == nullptr) return std::nullopt;
    if (!value->is_integer()) return Error(key, *value, "expected an integer");
    return value->integer;
  }

  absl::StatusOr<std::optional<double>> Number(absl::string_view key) const {
    const JsonValue* value = Find(key);
    if (value == nullptr) return std::nullopt;
    if (!value->is_number()) return Error(key, *value, "expected a number");
    return value->AsDouble();
  }

  absl::StatusOr<std::optional<bool>> Bool(absl::string_view key) const {
    const JsonValue* value = Find(key);
    if (value == nullptr) return std::nullopt;
    if (!value->is_bool()) return Error(key, *value, "expected true or false");
    return value->boolean;
  }

  absl::StatusOr<std::optional<std::string>> String(absl::string_view key) const {
    const JsonValue* value = Find(key);
    if (value == nullptr) return std::nullopt;
    if (!value->is_string()) return Error(key, *value, "expected a string");
    return value->string;
  }

  // A size transformers has no sensible default for.
  absl::StatusOr<int64_t> RequiredInt(absl::string_view key) const {
    CT_ASSIGN_OR_RETURN(std::optional<int64_t> value, Int(key));
    if (!value.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(), "\"", prefix_, key,
                       "\" is missing or null; expected a positive integer (is this a transformers "
                       "config.json for a causal LM?)"));
    }
    return *value;
  }

  // "config 'PATH': "KEY" is VALUE; PROBLEM".
  absl::Status Error(absl::string_view key, const JsonValue& value,
                     absl::string_view problem) const {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(), "\"", prefix_, key, "\" is ", JsonToString(value), "; ", problem));
  }

  std::string Where() const { return absl::StrCat("config '", path_, "': "); }

 private:
  std::string path_;
  const JsonValue& object_;
  std::string prefix_;  // "rope_parameters." for fields of that object
};

// Fields whose values the decoder does not implement: each must be absent, null or the value
// that means "off".
bool IsGemma(absl::string_view model_type) {
  return model_type == "gemma2" || model_type == "gemma3_text";
}

// Gemma's MLP reads hidden_activation (GELU with the tanh approximation by default).
absl::Status CheckGemmaActivation(const ConfigFields& fields) {
  CT_ASSIGN_OR_RETURN(std::optional<std::string> act, fields.String("hidden_activation"));
  if (act.has_value() && *act != "gelu_pytorch_tanh") {
    return fields.Error("hidden_activation", *fields.Find("hidden_activation"),
                        "Gemma's MLP is GeGLU: only \"gelu_pytorch_tanh\" is supported");
  }
  CT_ASSIGN_OR_RETURN(std::optional<bool> bidirectional,
                      fields.Bool("use_bidirectional_attention"));
  if (bidirectional.value_or(false)) {
    return fields.Error("use_bidirectional_attention",
                        *fields.Find("use_bidirectional_attention"),
                        "the decoder is causal: only false is supported");
  }
  return absl::OkStatus();
}

absl::Status CheckUnsupportedFeatures(const ConfigFields& fields, absl::string_view model_type) {
  if (IsGemma(model_type)) CT_RETURN_IF_ERROR(CheckGemmaActivation(fields));
  CT_ASSIGN_OR_RETURN(std::optional<std::string> act, fields.String("hidden_act"));
  if (!IsGemma(model_type) && act.has_value() && *act != "silu") {
    return fields.Error("hidden_act", *fields.Find("hidden_act"),
                        "the decoder's MLP is SwiGLU: only \"silu\" is supported");
  }
  CT_ASSIGN_OR_RETURN(std::optional<bool> mlp_bias, fields.Bool("mlp_bias"));
  if (model_type != "llama" && mlp_bias.value_or(false)) {
    return fields.Error("mlp_bias", *fields.Find("mlp_bias"),
                        absl::StrCat("transformers' ", model_type,
                                     " MLP has no biases (only llama reads mlp_bias): only false "
                                     "is supported"));
  }
  CT_ASSIGN_OR_RETURN(std::optional<double> partial, fields.Number("partial_rotary_factor"));
  if (model_type != "phi3" && partial.has_value() && *partial != 1.0) {
    return fields.Error("partial_rotary_factor", *fields.Find("partial_rotary_factor"),
                        "the decoder rotates part of the head for phi3 only: only 1.0 is "
                        "supported here");
  }
  return absl::OkStatus();
}

// Phi-3: the fused projections, and resid_pdrop as the residual dropout (transformers 5's
// Phi3Model applies no embedding dropout, so embd_pdrop is not read).
absl::Status ReadPhi3Fields(const ConfigFields& fields, proto::DecoderConfig& config) {
  config.set_fused_projections(true);
  CT_ASSIGN_OR_RETURN(std::optional<double> resid_pdrop, fields.Number("resid_pdrop"));
  if (resid_pdrop.value_or(0.0) != 0.0) config.set_residual_dropout(*resid_pdrop);
  return absl::OkStatus();
}

// Gemma's layer_types: the list when given, else transformers' pattern (Gemma 2: every other
// layer sliding, from layer 0; Gemma 3: sliding_window_pattern, default 6, each sixth global).
absl::Status ReadGemmaLayerTypes(const ConfigFields& fields, absl::string_view model_type,
                                 int64_t layers, proto::DecoderConfig& config) {
  if (const JsonValue* types = fields.Find("layer_types"); types != nullptr) {
    if (!types->is_array() || static_cast<int64_t>(types->values.size()) != layers) {
      return fields.Error("layer_types", *types,
                          absl::StrCat("expected an array of num_hidden_layers = ", layers,
                                       " strings"));
    }
    for (const JsonValue& type : types->values) {
      if (!type.is_string()) return fields.Error("layer_types", *types, "expected strings");
      config.add_layer_types(type.string);
    }
    return absl::OkStatus();
  }
  CT_ASSIGN_OR_RETURN(std::optional<int64_t> pattern, fields.Int("sliding_window_pattern"));
  const int64_t every = model_type == "gemma2" ? 2 : pattern.value_or(6);
  if (every <= 0) {
    return fields.Error("sliding_window_pattern", *fields.Find("sliding_window_pattern"),
                        "expected a positive integer");
  }
  for (int64_t i = 0; i < layers; ++i) {
    config.add_layer_types((i + 1) % every != 0 ? "sliding_attention" : "full_attention");
  }
  return absl::OkStatus();
}

// Gemma 2 and 3: GeGLU, (1 + w) norms, the embedding scale and sandwich norms always;
// query_pre_attn_scalar (default 256), the soft-capping (Gemma 2's defaults 50 and 30, Gemma
// 3's none; null is none), QK-norm (Gemma 3), the window (default 4096) in the sliding layers.
absl::Status ReadGemmaFields(const ConfigFields& fields, absl::string_view model_type,
                             int64_t layers, proto::DecoderConfig& config) {
  config.set_hidden_act("gelu_pytorch_tanh");
  config.set_norm_unit_offset(true);
  config.set_scale_embeddings(true);
  config.set_sandwich_norms(true);
  config.set_qk_norm(model_type == "gemma3_text");
  CT_ASSIGN_OR_RETURN(std::optional<double> scalar, fields.Number("query_pre_attn_scalar"));
  config.set_query_pre_attn_scalar(scalar.value_or(256));
  const bool gemma2 = model_type == "gemma2";
  for (const auto& [key, fallback] : {std::pair<const char*, double>{"attn_logit_softcapping", 50},
                                      {"final_logit_softcapping", 30}}) {
    CT_ASSIGN_OR_RETURN(std::optional<double> cap, fields.Number(key));
    if (!fields.Has(key) && gemma2) cap = fallback;
    if (!cap.has_value()) continue;
    if (std::string(key) == "attn_logit_softcapping") config.set_attn_logit_softcapping(*cap);
    if (std::string(key) == "final_logit_softcapping") config.set_final_logit_softcapping(*cap);
  }
  CT_RETURN_IF_ERROR(ReadGemmaLayerTypes(fields, model_type, layers, config));
  CT_ASSIGN_OR_RETURN(std::optional<int64_t> window, fields.Int("sliding_window"));
  if (!fields.Has("sliding_window")) window = 4096;
  if (window.has_value()) config.set_sliding_window(*window);
  return absl::OkStatus();
}

// Which layers attend through a window, as transformers decides it:
//  - mistral: every layer, when sliding_window is not null (absent: transformers' 4096);
//  - qwen2, qwen3: with use_sliding_window, the layers from max_window_layers (default 28) on, or
//    those layer_types names "sliding_attention" (they must be the last ones);
//  - llama: none (layer_types, when present, must be all "full_attention").
absl::Status ReadSlidingWindow(const ConfigFields& fields, absl::string_view model_type,
                               int64_t layers, proto::DecoderConfig& config) {
  CT_ASSIGN_OR_RETURN(std::optional<int64_t> window, fields.Int("sliding_window"));
  if (model_type == "mistral" || model_type == "phi3") {
    // Mistral's default is 4096, Phi-3's none.
    if (model_type == "mistral" && !fields.Has("sliding_window")) window = 4096;
    if (window.has_value()) config.set_sliding_window(*window);
    return absl::OkStatus();
  }
  std::optional<int64_t> first_sliding;  // from layer_types
  if (const JsonValue* layer_types = fields.Find("layer_types"); layer_types != nullptr) {
    if (!layer_types->is_array() || static_cast<int64_t>(layer_types->values.size()) != layers) {
      return fields.Error("layer_types", *layer_types,
                          absl::StrCat("expected an array of num_hidden_layers = ", layers,
                                       " strings"));
    }
    for (int64_t i = 0; i < layers; ++i) {
      const JsonValue& type = layer_types->values[i];
      const bool sliding = type.is_string() && type.string == "sliding_attention";
      if (!sliding && !(type.is_string() && type.string == "full_attention")) {
        return fields.Error("layer_types", *layer_types,
                            absl::StrCat("found ", JsonToString(type),
                                         "; the decoder supports \"full_attention\" and "
                                         "\"sliding_attention\" layers"));
      }
      if (sliding && !first_sliding.has_value()) first_sliding = i;
      if (!sliding && first_sliding.has_value()) {
        return fields.Error("layer_types", *layer_types,
                            absl::StrCat("layer ", i, " attends to the whole prefix after "
                                         "sliding-window layer ", *first_sliding,
                                         "; the decoder supports windows in the last layers "
                                         "only (Qwen2's max_window_layers)"));
      }
    }
  }
  if (model_type == "llama") {
    if (first_sliding.has_value()) {
      return fields.Error("layer_types", *fields.Find("layer_types"),
                          "transformers' Llama has no sliding-window layers");
    }
    return absl::OkStatus();
  }
  // qwen2, qwen3.
  CT_ASSIGN_OR_RETURN(std::optional<bool> use_sliding, fields.Bool("use_sliding_window"));
  CT_ASSIGN_OR_RETURN(std::optional<int64_t> max_window_layers, fields.Int("max_window_layers"));
  if (!use_sliding.value_or(false)) {
    if (first_sliding.has_value()) {
      return fields.Error("layer_types", *fields.Find("layer_types"),
                          "names sliding_attention layers but use_sliding_window is false");
    }
    return absl::OkStatus();
  }
  if (!fields.Has("sliding_window")) window = 4096;
  if (!window.has_value()) {
    if (first_sliding.has_value()) {
      return fields.Error("layer_types", *fields.Find("layer_types"),
                          "names sliding_attention layers but sliding_window is null");
    }
    return absl::OkStatus();  // transformers: no sliding layers
  }
  const int64_t first = first_sliding.has_value() ? *first_sliding
                        : fields.Find("layer_types") != nullptr
                            ? layers
                            : std::min(layers, std::max<int64_t>(0, max_window_layers.value_or(28)));
  if (first == layers) return absl::OkStatus();  // no layer reaches max_window_layers
  config.set_sliding_window(*window);
  config.set_first_sliding_layer(first);
  return absl::OkStatus();
}

// What the rotary embedding reads: rope_theta and, for a scaled type, its parameters.
struct RopeFields {
  std::optional<double> theta;
  std::optional<proto::RopeScaling> scaling;
  std::optional<double> partial;  // partial_rotary_factor in the rope object
  bool partial_allowed = false;   // phi3
};

// A list of numbers (longrope's short_factor and long_factor).
absl::Status ReadFactorList(const ConfigFields& rope, absl::string_view name,
                            google::protobuf::RepeatedField<double>& out) {
  const JsonValue* list = rope.Find(name);
  if (list == nullptr) return absl::OkStatus();
  if (!list->is_array()) return rope.Error(name, *list, "expected a list of numbers");
  for (const JsonValue& item : list->values) {
    if (!item.is_number()) return rope.Error(name, *list, "expected a list of numbers");
    out.Add(item.AsDouble());
  }
  return absl::OkStatus();
}

// One scaling field of a rope object into `scaling`; false for a key that is none of them.
absl::StatusOr<bool> ReadScalingField(const ConfigFields& rope, const std::string& name,
                                      proto::RopeScaling& scaling) {
  using Setter = void (proto::RopeScaling::*)(double);
  static const auto* numbers = new std::vector<std::pair<std::string, Setter>>{
      {"factor", &proto::RopeScaling::set_factor},
      {"low_freq_factor", &proto::RopeScaling::set_low_freq_factor},
      {"high_freq_factor", &proto::RopeScaling::set_high_freq_factor},
      {"attention_factor", &proto::RopeScaling::set_attention_factor},
      {"beta_fast", &proto::RopeScaling::set_beta_fast},
      {"beta_slow", &proto::RopeScaling::set_beta_slow},
      {"mscale", &proto::RopeScaling::set_mscale},
      {"mscale_all_dim", &proto::RopeScaling::set_mscale_all_dim},
  };
  for (const auto& [key, setter] : *numbers) {
    if (name != key) continue;
    CT_ASSIGN_OR_RETURN(std::optional<double> number, rope.Number(name));
    if (number.has_value()) (scaling.*setter)(*number);
    return true;
  }
  if (name == "original_max_position_embeddings") {
    CT_ASSIGN_OR_RETURN(std::optional<int64_t> original, rope.Int(name));
    if (original.has_value()) scaling.set_original_max_position_embeddings(*original);
    return true;
  }
  if (name == "truncate") {
    CT_ASSIGN_OR_RETURN(std::optional<bool> truncate, rope.Bool(name));
    if (truncate.has_value()) scaling.set_truncate(*truncate);
    return true;
  }
  if (name == "short_factor") {
    CT_RETURN_IF_ERROR(ReadFactorList(rope, name, *scaling.mutable_short_factor()));
    return true;
  }
  if (name == "long_factor") {
    CT_RETURN_IF_ERROR(ReadFactorList(rope, name, *scaling.mutable_long_factor()));
    return true;
  }
  return false;
}

// One rope object: "rope_parameters" (transformers 5.x: {"rope_type": "llama3", "rope_theta":
// ..., "factor": ...}) or "rope_scaling" (4.x: the same without rope_theta, "type" in old files).
absl::Status ReadRopeObject(const std::string& path, const ConfigFields& fields,
                            absl::string_view key, std::optional<int64_t> max_positions,
                            RopeFields& out) {
  const JsonValue* params = fields.Find(key);
  if (params == nullptr) return absl::OkStatus();
  if (!params->is_object()) {
    return fields.Error(key, *params,
                        "expected an object such as {\"rope_type\": \"default\", "
                        "\"rope_theta\": 10000.0}");
  }
  const ConfigFields rope(path, *params, absl::StrCat(key, "."));
  std::string type = "default";
  proto::RopeScaling scaling;
  for (size_t i = 0; i < params->keys.size(); ++i) {
    const std::string& name = params->keys[i];
    const JsonValue& value = params->values[i];
    if (name == "rope_type" || name == "type") {
      if (!value.is_string()) return rope.Error(name, value, "expected a string");
      type = value.string;
    } else if (name == "partial_rotary_factor") {
      CT_ASSIGN_OR_RETURN(std::optional<double> partial, rope.Number(name));
      if (partial.has_value() && *partial != 1.0 && !out.partial_allowed) {
        return rope.Error(name, value,
                          "the decoder rotates part of the head for phi3 only: only 1.0 is "
                          "supported here");
      }
      if (partial.has_value()) out.partial = partial;
    } else if (name == "rope_theta") {
      CT_ASSIGN_OR_RETURN(std::optional<double> theta, rope.Number(name));
      if (theta.has_value() && out.theta.has_value() && *theta != *out.theta) {
        return rope.Error(name, value,
                          absl::StrCat("but \"rope_theta\" is ", *out.theta,
                                       " elsewhere in the file; make the two agree"));
      }
      if (theta.has_value()) out.theta = theta;
    } else {
      CT_ASSIGN_OR_RETURN(bool known, ReadScalingField(rope, name, scaling));
      if (!known) {
        return rope.Error(name, value,
                          "not supported: the decoder reads rope_type, rope_theta, factor, "
                          "low_freq_factor, high_freq_factor, original_max_position_embeddings, "
                          "attention_factor, beta_fast, beta_slow, mscale, mscale_all_dim, "
                          "truncate, short_factor and long_factor");
      }
    }
  }
  if (type == "default") {
    if (scaling.ByteSizeLong() > 0) {
      return fields.Error(key, *params, "scaling fields with rope_type \"default\"; set the type");
    }
    return absl::OkStatus();
  }
  // ValidateDecoderConfig refuses the types the decoder does not implement (yarn, longrope, ...).
  scaling.set_rope_type(type);
  // transformers' standardize_rope_params: llama3, yarn and longrope fall back to
  // max_position_embeddings.
  const bool has_original = type == "llama3" || type == "yarn" || type == "longrope";
  if (has_original && !scaling.has_original_max_position_embeddings() &&
      max_positions.has_value()) {
    scaling.set_original_max_position_embeddings(*max_positions);
  }
  if (out.scaling.has_value() && out.scaling->SerializeAsString() != scaling.SerializeAsString()) {
    return fields.Error(key, *params,
                        "differs from the other rope object (rope_parameters and rope_scaling); "
                        "make the two agree (transformers 5.x reads rope_parameters)");
  }
  out.scaling = scaling;
  return absl::OkStatus();
}

// rope_theta at the top level (4.x) or in "rope_parameters" (5.x), and the scaling of either
// "rope_parameters" or "rope_scaling" (4.x). Where both give a value, the values must agree.
absl::StatusOr<RopeFields> ReadRope(const std::string& path, const ConfigFields& fields,
                                    std::optional<int64_t> max_positions,
                                    bool partial_allowed = false) {
  RopeFields rope;
  rope.partial_allowed = partial_allowed;
  CT_ASSIGN_OR_RETURN(rope.theta, fields.Number("rope_theta"));
  CT_RETURN_IF_ERROR(ReadRopeObject(path, fields, "rope_parameters", max_positions, rope));
  CT_RETURN_IF_ERROR(ReadRopeObject(path, fields, "rope_scaling", max_positions, rope));
  return rope;
}

// Gemma 3's two rotary embeddings: rope_parameters {"full_attention": {...}, "sliding_attention":
// {...}} (5.x), or rope_theta, rope_scaling and rope_local_base_freq (4.x). The full layers'
// object is the decoder's rope; the sliding layers' must be the default type, its theta
// rope_local_base_freq (default 10000).
absl::StatusOr<RopeFields> ReadGemma3Rope(const std::string& path, const ConfigFields& fields,
                                          std::optional<int64_t> max_positions,
                                          double& local_base) {
  RopeFields rope;
  CT_ASSIGN_OR_RETURN(rope.theta, fields.Number("rope_theta"));
  CT_ASSIGN_OR_RETURN(std::optional<double> local, fields.Number("rope_local_base_freq"));
  if (const JsonValue* params = fields.Find("rope_parameters"); params != nullptr) {
    if (!params->is_object() || params->Find("full_attention") == nullptr) {
      return fields.Error("rope_parameters", *params,
                          "Gemma 3 expects {\"full_attention\": {...}, "
                          "\"sliding_attention\": {...}}");
    }
    const ConfigFields nested(path, *params, "rope_parameters.");
    CT_RETURN_IF_ERROR(ReadRopeObject(path, nested, "full_attention", max_positions, rope));
    RopeFields sliding;
    sliding.theta = local;
    CT_RETURN_IF_ERROR(ReadRopeObject(path, nested, "sliding_attention", max_positions, sliding));
    if (sliding.scaling.has_value()) {
      return nested.Error("sliding_attention", *params->Find("sliding_attention"),
                          "the sliding layers' rope must be the default type");
    }
    local = sliding.theta;
  }
  CT_RETURN_IF_ERROR(ReadRopeObject(path, fields, "rope_scaling", max_positions, rope));
  local_base = local.value_or(10000);
  return rope;
}

// Phi-3's config class reads its scaling as transformers does: the old names "su" and "yarn"
// mean longrope, and the top-level original_max_position_embeddings (its default 4096) is the
// pretraining length, whatever the rope object says.
absl::Status ApplyPhi3Rope(const ConfigFields& fields, RopeFields& rope) {
  if (!rope.scaling.has_value()) return absl::OkStatus();
  proto::RopeScaling& s = *rope.scaling;
  if (s.rope_type() == "su" || s.rope_type() == "yarn") s.set_rope_type("longrope");
  CT_ASSIGN_OR_RETURN(std::optional<int64_t> original,
                      fields.Int("original_max_position_embeddings"));
  const std::string& type = s.rope_type();
  if (type == "llama3" || type == "yarn" || type == "longrope") {
    s.set_original_max_position_embeddings(original.value_or(4096));
  }
  return absl::OkStatus();
}

// bos_token_id, eos_token_id (an integer or a list of them) and pad_token_id, when set.
absl::Status ReadTokenIds(const ConfigFields& fields, proto::DecoderConfig& config) {
  CT_ASSIGN_OR_RETURN(std::optional<int64_t> bos, fields.Int("bos_token_id"));
  CT_ASSIGN_OR_RETURN(std::optional<int64_t> pad, fields.Int("pad_token_id"));
  if (bos.has_value()) config.set_bos_token_id(*bos);
  if (pad.has_value()) config.set_pad_token_id(*pad);
  const JsonValue* eos = fields.Find("eos_token_id");
  if (eos == nullptr) return absl::OkStatus();
  if (eos->is_integer()) {
    config.add_eos_token_id(eos->integer);
    return absl::OkStatus();
  }
  if (!eos->is_array()) {
    return fields.Error("eos_token_id", *eos, "expected an integer or a list of integers");
  }
  for (const JsonValue& id : eos->values) {
    if (!id.is_integer()) {
      return fields.Error("eos_token_id", *eos, "expected an integer or a list of integers");
    }
    config.add_eos_token_id(id.integer);
  }
  return absl::OkStatus();
}

// The shortest decimal text that reads back as exactly `value` (a JSON number for a finite
// value): "1e-06" rather than "9.9999999999999995e-07".
std::string JsonDouble(double value) {
  for (int digits = 15; digits < 17; ++digits) {
    std::string text = absl::StrFormat("%.*g", digits, value);
    if (std::strtod(text.c_str(), nullptr) == value) return text;
  }
  return absl::StrFormat("%.17g", value);
}

const char* JsonBool(bool value) { return value ? "true" : "false"; }

std::string JsonDoubles(const google::protobuf::RepeatedField<double>& values) {
  std::vector<std::string> texts;
  for (double value : values) texts.push_back(JsonDouble(value));
  return absl::StrCat("[", absl::StrJoin(texts, ", "), "]");
}

// The scaling fields of `s` that are set, as "key": value items in key order.
std::vector<std::string> ScalingItems(const proto::RopeScaling& s) {
  std::vector<std::pair<std::string, std::string>> fields;
  auto number = [&](const char* key, bool has, double value) {
    if (has) fields.emplace_back(key, JsonDouble(value));
  };
  number("factor", s.has_factor(), s.factor());
  number("low_freq_factor", s.has_low_freq_factor(), s.low_freq_factor());
  number("high_freq_factor", s.has_high_freq_factor(), s.high_freq_factor());
  number("attention_factor", s.has_attention_factor(), s.attention_factor());
  number("beta_fast", s.has_beta_fast(), s.beta_fast());
  number("beta_slow", s.has_beta_slow(), s.beta_slow());
  number("mscale", s.has_mscale(), s.mscale());
  number("mscale_all_dim", s.has_mscale_all_dim(), s.mscale_all_dim());
  if (s.has_original_max_position_embeddings()) {
    fields.emplace_back("original_max_position_embeddings",
                        absl::StrCat(s.original_max_position_embeddings()));
  }
  if (s.has_truncate()) fields.emplace_back("truncate", JsonBool(s.truncate()));
  if (s.short_factor_size() > 0) fields.emplace_back("short_factor", JsonDoubles(s.short_factor()));
  if (s.long_factor_size() > 0) fields.emplace_back("long_factor", JsonDoubles(s.long_factor()));
  std::sort(fields.begin(), fields.end());
  std::vector<std::string> items;
  for (const auto& [key, value] : fields) items.push_back(absl::StrCat("\"", key, "\": ", value));
  return items;
}

// The rope object of transformers 5.x ("rope_parameters", with_theta) or 4.x ("rope_scaling").
std::string RopeJson(const proto::DecoderConfig& config, bool with_theta) {
  std::vector<std::string> items;
  const proto::RopeScaling& s = config.rope_scaling();
  if (config.has_rope_scaling()) {
    for (auto& item : ScalingItems(s)) items.push_back(std::move(item));
  }
  if (with_theta)
    items.push_back(absl::StrCat(R"("rope_theta": )", JsonDouble(config.rope_theta())));
  items.push_back(absl::StrCat(R"("rope_type": ")",
                               config.has_rope_scaling() ? s.rope_type() : "default", "\""));
  return absl::StrCat("{", absl::StrJoin(items, ", "), "}");
}

std::string JsonId(bool has, int64_t id) { return has ? absl::StrCat(id) : "null"; }

// A float field of a strictly typed transformers config (Gemma's soft-capping): "3.0", never
// "3", which its dataclass validation refuses as an int; null when unset.
std::string JsonOptionalFloat(bool has, double value) {
  if (!has) return "null";
  std::string text = JsonDouble(value);
  if (text.find_first_of(".eEn") == std::string::npos) text += ".0";
  return text;
}

// Gemma's fields: the activation, the attention scalar, the soft-capping (null when off),
// layer_types and the window; for Gemma 3 the two rope objects.
std::vector<std::pair<std::string, std::string>> GemmaJsonFields(const proto::DecoderConfig& c) {
  std::vector<std::string> types;
  for (const std::string& type : c.layer_types()) types.push_back(absl::StrCat("\"", type, "\""));
  std::vector<std::pair<std::string, std::string>> fields = {
      {"hidden_activation", absl::StrCat("\"", c.hidden_act(), "\"")},
      // An int in transformers' class; unset here means head_dim's scale.
      {"query_pre_attn_scalar",
       c.has_query_pre_attn_scalar()
           ? JsonDouble(c.query_pre_attn_scalar())
           : absl::StrCat(c.has_head_dim() ? c.head_dim()
                                           : c.hidden_size() / c.num_attention_heads())},
      {"attn_logit_softcapping",
       JsonOptionalFloat(c.has_attn_logit_softcapping(), c.attn_logit_softcapping())},
      {"final_logit_softcapping",
       JsonOptionalFloat(c.has_final_logit_softcapping(), c.final_logit_softcapping())},
      {"layer_types", absl::StrCat("[", absl::StrJoin(types, ", "), "]")},
      {"sliding_window", c.has_sliding_window() ? absl::StrCat(c.sliding_window()) : "null"},
  };
  if (c.qk_norm()) {  // gemma3_text
    fields.emplace_back("use_bidirectional_attention", "false");
    const double local = c.has_rope_local_base_freq() ? c.rope_local_base_freq() : c.rope_theta();
    fields.emplace_back("rope_local_base_freq", JsonDouble(local));
    fields.emplace_back(
        "rope_parameters",
        absl::StrCat(R"({"full_attention": )", RopeJson(c, /*with_theta=*/true),
                     R"(, "sliding_attention": {"rope_theta": )", JsonDouble(local),
                     R"(, "rope_type": "default"}})"));
  }
  return fields;
}

// bos_token_id, eos_token_id (one integer, or a list when there are several) and pad_token_id;
// null when unset.
std::vector<std::pair<std::string, std::string>> TokenIdFields(const proto::DecoderConfig& c) {
  std::string eos = "null";
  if (c.eos_token_id_size() == 1) eos = absl::StrCat(c.eos_token_id(0));
  if (c.eos_token_id_size() > 1)
    eos = absl::StrCat("[", absl::StrJoin(c.eos_token_id(), ", "), "]");
  return {{"bos_token_id", JsonId(c.has_bos_token_id(), c.bos_token_id())},
          {"eos_token_id", eos},
          {"pad_token_id", JsonId(c.has_pad_token_id(), c.pad_token_id())}};
}

std::string JsonObject(std::vector<std::pair<std::string, std::string>> fields) {
  std::sort(fields.begin(), fields.end());
  std::vector<std::string> lines;
  lines.reserve(fields.size());
  for (const auto& [key, value] : fields) lines.push_back(absl::StrCat("  \"", key, "\": ", value));
  return absl::StrCat("{\n", absl::StrJoin(lines, ",\n"), "\n}\n");
}

}  // namespace

// transformers' class name for each model type.
std::string ArchitectureOf(absl::string_view type) {
  if (type == "qwen2") return "Qwen2ForCausalLM";
  if (type == "qwen3") return "Qwen3ForCausalLM";
  if (type == "mistral") return "MistralForCausalLM";
  if (type == "phi3") return "Phi3ForCausalLM";
  if (type == "gemma2") return "Gemma2ForCausalLM";
  if (type == "gemma3_text") return "Gemma3ForCausalLM";
  return "LlamaForCausalLM";
}

std::string HfConfigJson(const proto::DecoderConfig& config) {
  const std::string type = ResolvedModelType(config);
  std::vector<std::pair<std::string, std::string>> fields = {
      {"architectures", absl::StrCat("[\"", ArchitectureOf(type), "\"]")},
      {"attention_dropout", JsonDouble(config.attention_dropout())},
      {"dtype", R"("float32")"},
      {"hidden_act", absl::StrCat("\"", config.hidden_act(), "\"")},
      {"hidden_size", absl::StrCat(config.hidden_size())},
      {"initializer_range", JsonDouble(config.initializer_range())},
      {"intermediate_size", absl::StrCat(config.intermediate_size())},
      {"max_position_embeddings", absl::StrCat(config.max_position_embeddings())},
      {"model_type", absl::StrCat("\"", type, "\"")},
      {"num_attention_heads", absl::StrCat(config.num_attention_heads())},
      {"num_hidden_layers", absl::StrCat(config.num_hidden_layers())},
      {"num_key_value_heads", absl::StrCat(config.num_key_value_heads())},
      {"rms_norm_eps", JsonDouble(config.rms_norm_eps())},
      {"rope_parameters", RopeJson(config, /*with_theta=*/true)},
      {"rope_scaling", config.has_rope_scaling() ? RopeJson(config, false) : "null"},
      {"rope_theta", JsonDouble(config.rope_theta())},
      {"tie_word_embeddings", JsonBool(config.tie_word_embeddings())},
      {"torch_dtype", R"("float32")"},
      {"use_cache", "true"},
      {"vocab_size", absl::StrCat(config.vocab_size())},
  };
  for (auto& field : TokenIdFields(config)) fields.push_back(std::move(field));
  // Qwen2 and Mistral read neither attention_bias nor mlp_bias; Qwen3 has no mlp_bias.
  if (type == "llama" || type == "qwen3" || IsGemma(type)) {
    fields.emplace_back("attention_bias", JsonBool(config.attention_bias()));
  }
  if (IsGemma(type)) {
    for (auto& field : GemmaJsonFields(config)) {
      // Gemma 3's rope object replaces the flat one.
      auto it = std::find_if(fields.begin(), fields.end(),
                             [&](const auto& f) { return f.first == field.first; });
      if (it != fields.end()) {
        it->second = field.second;
      } else {
        fields.push_back(std::move(field));
      }
    }
  }
  if (type == "llama") fields.emplace_back("mlp_bias", JsonBool(config.mlp_bias()));
  const std::string window =
      config.has_sliding_window() ? absl::StrCat(config.sliding_window()) : "null";
  if (type == "mistral" || type == "phi3") fields.emplace_back("sliding_window", window);
  if (type == "phi3") {
    fields.emplace_back("resid_pdrop", JsonDouble(config.residual_dropout()));
    fields.emplace_back("partial_rotary_factor", JsonDouble(config.partial_rotary_factor()));
    fields.emplace_back("embd_pdrop", "0.0");
    // Phi-3's class takes the pretraining length from here, 4096 when absent.
    const proto::RopeScaling& s = config.rope_scaling();
    if (s.has_original_max_position_embeddings()) {
      fields.emplace_back("original_max_position_embeddings",
                          absl::StrCat(s.original_max_position_embeddings()));
    }
  }
  if (type == "qwen2" || type == "qwen3") {
    // Both the 4.x fields and 5.x's layer_types, which say the same.
    const int64_t layers = config.num_hidden_layers();
    const int64_t first = config.has_sliding_window() ? config.first_sliding_layer() : layers;
    std::vector<std::string> layer_types;
    for (int64_t i = 0; i < layers; ++i) {
      layer_types.push_back(i >= first ? R"("sliding_attention")" : R"("full_attention")");
    }
    fields.emplace_back("layer_types", absl::StrCat("[", absl::StrJoin(layer_types, ", "), "]"));
    fields.emplace_back("max_window_layers", absl::StrCat(first));
    fields.emplace_back("sliding_window", window);
    fields.emplace_back("use_sliding_window", JsonBool(config.has_sliding_window()));
  }
  // An unset head_dim means hidden / heads, which is Llama's, Qwen2's and Mistral's default;
  // Qwen3's default is 128, so it is always written.
  if (config.has_head_dim() || type == "qwen3" || type == "mistral" || IsGemma(type)) {
    const int64_t head_dim = config.has_head_dim()
                                 ? config.head_dim()
                                 : config.hidden_size() / config.num_attention_heads();
    fields.emplace_back("head_dim", absl::StrCat(head_dim));
  }
  return JsonObject(std::move(fields));
}

std::string HfGenerationConfigJson(const proto::DecoderConfig& config) {
  std::vector<std::pair<std::string, std::string>> fields = TokenIdFields(config);
  fields.emplace_back("_from_model_config", "true");
  fields.emplace_back("do_sample", "false");
  return JsonObject(std::move(fields));
}

absl::Status WriteHfModelConfigs(const proto::DecoderConfig& config, const std::string& dir) {
  CT_RETURN_IF_ERROR(WriteHfConfig(config, absl::StrCat(dir, "/config.json")));
  return WriteFileAtomically(absl::StrCat(dir, "/generation_config.json"),
                             HfGenerationConfigJson(config));
}

const proto::DecoderConfig* AsDecoderConfig(const google::protobuf::Message* config) {
  return dynamic_cast<const proto::DecoderConfig*>(config);
}

absl::Status WriteHfModelConfigsFor(const google::protobuf::Message* config,
                                    const std::string& dir) {
  const proto::DecoderConfig* decoder = AsDecoderConfig(config);
  return decoder != nullptr ? WriteHfModelConfigs(*decoder, dir) : absl::OkStatus();
}

absl::Status WriteHfConfig(const proto::DecoderConfig& config, const std::string& path) {
  if (absl::Status valid = ValidateDecoderConfig(config); !valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot write the config.json '", path, "': ", valid.message()));
  }
  return WriteFileAtomically(path, HfConfigJson(config));
}

absl::StatusOr<std::string> HfConfigDtype(const std::string& path) {
  CT_ASSIGN_OR_RETURN(std::string text, ReadTextFile(path));
  absl::StatusOr<JsonValue> root = checkpoint_internal::ParseJson(text, JsonGrammar::kFull);
  if (!root.ok() || !root->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("config '", path, "': not a JSON object"));
  }
  const ConfigFields fields(path, *root);
  for (const char* key : {"dtype", "torch_dtype"}) {
    CT_ASSIGN_OR_RETURN(std::optional<std::string> dtype, fields.String(key));
    if (dtype.has_value()) return *dtype;
  }
  return std::string();
}

absl::StatusOr<proto::DecoderConfig> DecoderConfigFromHfConfig(const std::string& path) {
  CT_ASSIGN_OR_RETURN(std::string text, ReadTextFile(path));
  absl::StatusOr<JsonValue> root = checkpoint_internal::ParseJson(text, JsonGrammar::kFull);
  if (!root.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config '", path, "': ", root.status().message()));
  }
  if (!root->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("config '", path, "': the document is ",
                                                   JsonToString(*root), "; expected an object"));
  }
  const ConfigFields fields(path, *root);

  CT_ASSIGN_OR_RETURN(std::optional<std::string> model_type, fields.String("model_type"));
  if (!model_type.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(fields.Where(), "\"model_type\" is missing or null; expected one of ",
                     QuotedModelTypes(), " (is this a transformers config.json?)"));
  }
  const std::optional<HfDefaults> defaults = DefaultsFor(*model_type);
  if (!defaults.has_value()) {
    return fields.Error("model_type", *fields.Find("model_type"),
                        absl::StrCat("supported model types are ", QuotedModelTypes(),
                                     " (the reference decoder's architectures; Gemma 1, "
                                     "mixture-of-experts, multimodal and encoder-decoder models "
                                     "are not implemented)"));
  }
  CT_RETURN_IF_ERROR(CheckUnsupportedFeatures(fields, *model_type));

  proto::DecoderConfig config;
  CT_ASSIGN_OR_RETURN(int64_t vocab_size, fields.RequiredInt("vocab_size"));
  CT_ASSIGN_OR_RETURN(int64_t hidden_size, fields.RequiredInt("hidden_size"));
  CT_ASSIGN_OR_RETURN(int64_t intermediate_size, fields.RequiredInt("intermediate_size"));
  CT_ASSIGN_OR_RETURN(int64_t layers, fields.RequiredInt("num_hidden_layers"));
  CT_ASSIGN_OR_RETURN(int64_t heads, fields.RequiredInt("num_attention_heads"));
  CT_ASSIGN_OR_RETURN(std::optional<int64_t> kv_heads, fields.Int("num_key_value_heads"));
  CT_ASSIGN_OR_RETURN(std::optional<int64_t> head_dim, fields.Int("head_dim"));
  CT_ASSIGN_OR_RETURN(std::optional<int64_t> max_positions, fields.Int("max_position_embeddings"));
  double local_base = 0;
  CT_ASSIGN_OR_RETURN(RopeFields rope,
                      *model_type == "gemma3_text"
                          ? ReadGemma3Rope(path, fields, max_positions, local_base)
                          : ReadRope(path, fields, max_positions, *model_type == "phi3"));
  if (*model_type == "phi3") CT_RETURN_IF_ERROR(ApplyPhi3Rope(fields, rope));
  if (local_base > 0) config.set_rope_local_base_freq(local_base);
  CT_ASSIGN_OR_RETURN(std::optional<double> eps, fields.Number("rms_norm_eps"));
  CT_ASSIGN_OR_RETURN(std::optional<bool> tied, fields.Bool("tie_word_embeddings"));
  CT_ASSIGN_OR_RETURN(std::optional<bool> attention_bias, fields.Bool("attention_bias"));
  CT_ASSIGN_OR_RETURN(std::optional<bool> mlp_bias, fields.Bool("mlp_bias"));
  CT_ASSIGN_OR_RETURN(std::optional<double> init_range, fields.Number("initializer_range"));
  CT_ASSIGN_OR_RETURN(std::optional<double> attention_dropout, fields.Number("attention_dropout"));

  config.set_vocab_size(vocab_size);
  config.set_hidden_size(hidden_size);
  config.set_intermediate_size(intermediate_size);
  config.set_num_hidden_layers(layers);
  config.set_num_attention_heads(heads);
  config.set_num_key_value_heads(kv_heads.value_or(heads));
  if (head_dim.has_value()) {
    config.set_head_dim(*head_dim);
  } else if (defaults->head_dim > 0) {
    config.set_head_dim(defaults->head_dim);
  }
  config.set_rope_theta(rope.theta.value_or(defaults->rope_theta));
  if (rope.scaling.has_value()) *config.mutable_rope_scaling() = *rope.scaling;
  if (max_positions.has_value()) config.set_max_position_embeddings(*max_positions);
  CT_RETURN_IF_ERROR(ReadTokenIds(fields, config));
  config.set_rms_norm_eps(eps.value_or(defaults->rms_norm_eps));
  // Gemma ties by default.
  config.set_tie_word_embeddings(tied.value_or(IsGemma(*model_type)));
  config.set_qk_norm(*model_type == "qwen3");
  // Qwen2 has q/k/v biases whatever the file says; Qwen2 and Mistral do not read
  // attention_bias.
  if (*model_type == "qwen2") config.set_qkv_bias(true);
  if (*model_type == "llama" || *model_type == "qwen3" || IsGemma(*model_type)) {
    config.set_attention_bias(attention_bias.value_or(false));
  }
  if (*model_type == "llama" && mlp_bias.value_or(false)) config.set_mlp_bias(true);
  if (IsGemma(*model_type)) {
    CT_RETURN_IF_ERROR(ReadGemmaFields(fields, *model_type, layers, config));
  } else {
    CT_RETURN_IF_ERROR(ReadSlidingWindow(fields, *model_type, layers, config));
  }
  if (attention_dropout.value_or(0.0) != 0.0) config.set_attention_dropout(*attention_dropout);
  if (*model_type == "phi3") {
    CT_RETURN_IF_ERROR(ReadPhi3Fields(fields, config));
    // Phi3Config: the rope object's value, else the top level's.
    CT_ASSIGN_OR_RETURN(std::optional<double> partial, fields.Number("partial_rotary_factor"));
    if (rope.partial.has_value()) partial = rope.partial;
    if (partial.value_or(1.0) != 1.0) config.set_partial_rotary_factor(*partial);
  }
  config.set_initializer_range(init_range.value_or(defaults->initializer_range));
  // Only where the fields do not already say it (a Mistral model without a window).
  if (ResolvedModelType(config) != *model_type) config.set_model_type(*model_type);

  if (absl::Status valid = ValidateDecoderConfig(config); !valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(fields.Where(), valid.message()));
  }
  return config;
}

}  // namespace cpptrain
