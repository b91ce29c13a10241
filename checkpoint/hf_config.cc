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
  if (model_type == "qwen3") return HfDefaults{128, 10000, 1e-6, 0.02};
  return std::nullopt;
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
absl::Status CheckUnsupportedFeatures(const ConfigFields& fields) {
  CT_ASSIGN_OR_RETURN(std::optional<std::string> act, fields.String("hidden_act"));
  if (act.has_value() && *act != "silu") {
    return fields.Error("hidden_act", *fields.Find("hidden_act"),
                        "the decoder's MLP is SwiGLU: only \"silu\" is supported");
  }
  CT_ASSIGN_OR_RETURN(std::optional<bool> mlp_bias, fields.Bool("mlp_bias"));
  if (mlp_bias.value_or(false)) {
    return fields.Error("mlp_bias", *fields.Find("mlp_bias"),
                        "the decoder's MLP has no biases: only false is supported");
  }
  CT_ASSIGN_OR_RETURN(std::optional<bool> sliding, fields.Bool("use_sliding_window"));
  if (sliding.value_or(false)) {
    return fields.Error("use_sliding_window", *fields.Find("use_sliding_window"),
                        "the decoder attends to the whole causal prefix: only false is supported");
  }
  if (const JsonValue* layer_types = fields.Find("layer_types"); layer_types != nullptr) {
    if (!layer_types->is_array()) {
      return fields.Error("layer_types", *layer_types, "expected an array of strings");
    }
    for (const JsonValue& type : layer_types->values) {
      if (!type.is_string() || type.string != "full_attention") {
        return fields.Error("layer_types", *layer_types,
                            absl::StrCat("found ", JsonToString(type),
                                         "; the decoder supports only \"full_attention\" layers"));
      }
    }
  }
  if (const JsonValue* scaling = fields.Find("rope_scaling"); scaling != nullptr) {
    return fields.Error("rope_scaling", *scaling,
                        "RoPE scaling is not implemented (only the default rotary embedding); "
                        "use a checkpoint whose rope_scaling is null");
  }
  CT_ASSIGN_OR_RETURN(std::optional<double> partial, fields.Number("partial_rotary_factor"));
  if (partial.has_value() && *partial != 1.0) {
    return fields.Error("partial_rotary_factor", *fields.Find("partial_rotary_factor"),
                        "the decoder rotates the whole head: only 1.0 is supported");
  }
  CT_ASSIGN_OR_RETURN(std::optional<double> dropout, fields.Number("attention_dropout"));
  if (dropout.value_or(0.0) != 0.0) {
    LOG(WARNING) << fields.Where() << "attention_dropout = " << *dropout
                 << " is ignored: the decoder has no dropout";
  }
  return absl::OkStatus();
}

// rope_theta from "rope_parameters" (transformers 5.x: {"rope_type": "default",
// "rope_theta": ...}) or the top level (4.x); nullopt when neither sets it.
absl::StatusOr<std::optional<double>> ReadRopeTheta(const std::string& path,
                                                    const ConfigFields& fields) {
  CT_ASSIGN_OR_RETURN(std::optional<double> top_level, fields.Number("rope_theta"));
  const JsonValue* params = fields.Find("rope_parameters");
  if (params == nullptr) return top_level;
  if (!params->is_object()) {
    return fields.Error("rope_parameters", *params,
                        "expected an object such as {\"rope_type\": \"default\", "
                        "\"rope_theta\": 10000.0}");
  }
  const ConfigFields rope(path, *params, "rope_parameters.");
  for (size_t i = 0; i < params->keys.size(); ++i) {
    const std::string& key = params->keys[i];
    if (key == "rope_type" || key == "type") {
      const JsonValue& type = params->values[i];
      if (!type.is_string() || type.string != "default") {
        return rope.Error(key, type,
                          "RoPE scaling is not implemented: only \"default\" is supported");
      }
    } else if (key == "partial_rotary_factor") {
      CT_ASSIGN_OR_RETURN(std::optional<double> partial, rope.Number(key));
      if (partial.has_value() && *partial != 1.0) {
        return rope.Error(key, params->values[i],
                          "the decoder rotates the whole head: only 1.0 is supported");
      }
    } else if (key != "rope_theta") {
      return rope.Error(key, params->values[i],
                        "not supported: the decoder implements the default rotary embedding "
                        "(rope_type \"default\" and rope_theta only)");
    }
  }
  CT_ASSIGN_OR_RETURN(std::optional<double> theta, rope.Number("rope_theta"));
  if (theta.has_value() && top_level.has_value() && *theta != *top_level) {
    return rope.Error("rope_theta", *rope.Find("rope_theta"),
                      absl::StrCat("but the top-level \"rope_theta\" is ", *top_level,
                                   "; make the two agree (transformers uses rope_parameters)"));
  }
  return theta.has_value() ? theta : top_level;
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

}  // namespace

std::string HfConfigJson(const proto::DecoderConfig& config) {
  const bool qwen3 = config.qk_norm();
  std::vector<std::pair<std::string, std::string>> fields = {
      {"architectures", qwen3 ? R"(["Qwen3ForCausalLM"])" : R"(["LlamaForCausalLM"])"},
      {"attention_bias", JsonBool(config.attention_bias())},
      {"attention_dropout", "0.0"},
      {"dtype", R"("float32")"},
      {"hidden_act", R"("silu")"},
      {"hidden_size", absl::StrCat(config.hidden_size())},
      {"initializer_range", JsonDouble(config.initializer_range())},
      {"intermediate_size", absl::StrCat(config.intermediate_size())},
      {"max_position_embeddings", absl::StrCat(kHfMaxPositionEmbeddings)},
      {"model_type", qwen3 ? R"("qwen3")" : R"("llama")"},
      {"num_attention_heads", absl::StrCat(config.num_attention_heads())},
      {"num_hidden_layers", absl::StrCat(config.num_hidden_layers())},
      {"num_key_value_heads", absl::StrCat(config.num_key_value_heads())},
      {"rms_norm_eps", JsonDouble(config.rms_norm_eps())},
      {"rope_parameters", absl::StrCat(R"({"rope_theta": )", JsonDouble(config.rope_theta()),
                                       R"(, "rope_type": "default"})")},
      {"rope_scaling", "null"},
      {"rope_theta", JsonDouble(config.rope_theta())},
      {"tie_word_embeddings", JsonBool(config.tie_word_embeddings())},
      {"torch_dtype", R"("float32")"},
      {"use_cache", "true"},
      {"vocab_size", absl::StrCat(config.vocab_size())},
  };
  if (!qwen3) fields.emplace_back("mlp_bias", "false");
  if (qwen3) fields.emplace_back("use_sliding_window", "false");
  // Llama's default head_dim is hidden / heads, which an unset head_dim means here; Qwen3's
  // default is 128, so it is always written.
  if (config.has_head_dim() || qwen3) {
    const int64_t head_dim = config.has_head_dim()
                                 ? config.head_dim()
                                 : config.hidden_size() / config.num_attention_heads();
    fields.emplace_back("head_dim", absl::StrCat(head_dim));
  }
  std::sort(fields.begin(), fields.end());
  std::vector<std::string> lines;
  lines.reserve(fields.size());
  for (const auto& [key, value] : fields) lines.push_back(absl::StrCat("  \"", key, "\": ", value));
  return absl::StrCat("{\n", absl::StrJoin(lines, ",\n"), "\n}\n");
}

absl::Status WriteHfConfig(const proto::DecoderConfig& config, const std::string& path) {
  if (absl::Status valid = ValidateDecoderConfig(config); !valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot write the config.json '", path, "': ", valid.message()));
  }
  return WriteFileAtomically(path, HfConfigJson(config));
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
        absl::StrCat(fields.Where(),
                     "\"model_type\" is missing or null; expected \"llama\" or \"qwen3\" (is "
                     "this a transformers config.json?)"));
  }
  const std::optional<HfDefaults> defaults = DefaultsFor(*model_type);
  if (!defaults.has_value()) {
    return fields.Error("model_type", *fields.Find("model_type"),
                        "supported model types are \"llama\" and \"qwen3\" (the reference "
                        "decoder's architectures)");
  }
  CT_RETURN_IF_ERROR(CheckUnsupportedFeatures(fields));

  proto::DecoderConfig config;
  CT_ASSIGN_OR_RETURN(int64_t vocab_size, fields.RequiredInt("vocab_size"));
  CT_ASSIGN_OR_RETURN(int64_t hidden_size, fields.RequiredInt("hidden_size"));
  CT_ASSIGN_OR_RETURN(int64_t intermediate_size, fields.RequiredInt("intermediate_size"));
  CT_ASSIGN_OR_RETURN(int64_t layers, fields.RequiredInt("num_hidden_layers"));
  CT_ASSIGN_OR_RETURN(int64_t heads, fields.RequiredInt("num_attention_heads"));
  CT_ASSIGN_OR_RETURN(std::optional<int64_t> kv_heads, fields.Int("num_key_value_heads"));
  CT_ASSIGN_OR_RETURN(std::optional<int64_t> head_dim, fields.Int("head_dim"));
  CT_ASSIGN_OR_RETURN(std::optional<double> rope_theta, ReadRopeTheta(path, fields));
  CT_ASSIGN_OR_RETURN(std::optional<double> eps, fields.Number("rms_norm_eps"));
  CT_ASSIGN_OR_RETURN(std::optional<bool> tied, fields.Bool("tie_word_embeddings"));
  CT_ASSIGN_OR_RETURN(std::optional<bool> attention_bias, fields.Bool("attention_bias"));
  CT_ASSIGN_OR_RETURN(std::optional<double> init_range, fields.Number("initializer_range"));

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
  config.set_rope_theta(rope_theta.value_or(defaults->rope_theta));
  config.set_rms_norm_eps(eps.value_or(defaults->rms_norm_eps));
  config.set_tie_word_embeddings(tied.value_or(false));
  config.set_qk_norm(*model_type == "qwen3");
  config.set_attention_bias(attention_bias.value_or(false));
  config.set_initializer_range(init_range.value_or(defaults->initializer_range));

  if (absl::Status valid = ValidateDecoderConfig(config); !valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(fields.Where(), valid.message()));
  }
  return config;
}

}  // namespace cpptrain
