#include "config/hf_json_args.h"

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "base/status.h"
#include "checkpoint/internal/json.h"
#include "config/accelerate_config.h"
#include "config/ds_config.h"
#include "proto/training_args.pb.h"

namespace cpptrain {
namespace {

using checkpoint_internal::JsonGrammar;
using checkpoint_internal::JsonToString;
using checkpoint_internal::JsonValue;

// The JSON text and what to call it in messages: the file's path, or "<name> (inline JSON)".
struct Source {
  std::string name;
  std::string text;
};

// `value` without one pair of surrounding quotes (a text-format string's escapes undone).
std::string Unquoted(absl::string_view value) {
  value = absl::StripAsciiWhitespace(value);
  if (value.size() >= 2 && (value.front() == '"' || value.front() == '\'') &&
      value.back() == value.front()) {
    const absl::string_view inner = value.substr(1, value.size() - 2);
    std::string out;
    if (absl::CUnescape(inner, &out)) return out;
    return std::string(inner);
  }
  return std::string(value);
}

absl::StatusOr<Source> ReadValue(absl::string_view name, absl::string_view value) {
  const std::string v = Unquoted(value);
  if (!v.empty() && v.front() == '{') return Source{absl::StrCat(name, " (inline JSON)"), v};
  if (v.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, "=", value, ": give the path of a JSON file or a JSON object"));
  }
  // A regular file of a config's size: not a FIFO or /dev/zero, which would never end.
  constexpr std::uintmax_t kMaxBytes = 16 << 20;
  std::error_code error;
  const bool regular = std::filesystem::is_regular_file(v, error);
  const std::uintmax_t bytes = regular ? std::filesystem::file_size(v, error) : 0;
  if (regular && !error && bytes > kMaxBytes) {
    return absl::InvalidArgumentError(absl::StrCat(name, "=\"", v, "\": ", bytes,
                                                   " bytes is not a config file (at most ",
                                                   kMaxBytes, "); give the JSON config's path"));
  }
  std::ifstream in(v, std::ios::binary);
  if (!regular || error || !in) {
    return absl::NotFoundError(absl::StrCat(
        name, "=\"", v, "\": the file cannot be read; give the path of a JSON file (a relative "
        "path starts at the working directory, as in Python) or the JSON object itself"));
  }
  std::stringstream text;
  text << in.rdbuf();
  return Source{v, text.str()};
}

absl::StatusOr<JsonValue> ParseObject(absl::string_view name, const Source& source) {
  absl::StatusOr<JsonValue> root =
      checkpoint_internal::ParseJson(source.text, JsonGrammar::kFull);
  if (!root.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(name, "=", source.name, ": not valid JSON: ",
                                                   root.status().message()));
  }
  if (!root->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(name, "=", source.name, ": ",
                                                   JsonToString(*root),
                                                   " is not a JSON object; give {\"key\": ...}"));
  }
  return std::move(*root);
}

// A scalar (or a list of scalars, joined with ",") as Accelerate's YAML would spell it.
std::optional<std::string> ScalarText(const JsonValue& v) {
  switch (v.kind) {
    case JsonValue::Kind::kString:
      return v.string;
    case JsonValue::Kind::kInteger:
      return absl::StrCat(v.integer);
    case JsonValue::Kind::kDouble:  // 1e8 as 100000000, as YAML's integers are written
      if (std::floor(v.number) == v.number && std::fabs(v.number) < 9.0e18) {
        return absl::StrCat(static_cast<int64_t>(v.number));
      }
      return absl::StrCat(v.number);
    case JsonValue::Kind::kBool:
      return std::string(v.boolean ? "true" : "false");
    case JsonValue::Kind::kNull:
      return std::string();
    case JsonValue::Kind::kArray: {
      std::vector<std::string> items;
      for (const JsonValue& item : v.values) {
        if (item.is_array() || item.is_object()) return std::nullopt;
        items.push_back(*ScalarText(item));
      }
      return absl::StrJoin(items, ",");
    }
    case JsonValue::Kind::kObject:
      return std::nullopt;
  }
  return std::nullopt;
}

absl::Status KeyError(absl::string_view name, const Source& source, absl::string_view key,
                      const JsonValue& value, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(name, "=", source.name, ": ", key, " = ",
                                                 JsonToString(value), ": ", what));
}

absl::StatusOr<HfJsonTranslation> DeepSpeed(const Source& source) {
  absl::StatusOr<DeepSpeedConversion> conversion =
      ConvertDeepSpeedConfig(source.text, source.name);
  if (!conversion.ok()) {
    return absl::Status(conversion.status().code(),
                        absl::StrCat("deepspeed=", conversion.status().message()));
  }
  HfJsonTranslation out;
  out.assignments = DeepSpeedConversionOverrides(*conversion, "");
  const proto::ZeroConfig& zero = conversion->args.zero();
  if (zero.offload_optimizer_device() == proto::ZeroConfig::CPU ||
      zero.offload_param_device() == proto::ZeroConfig::CPU) {
    conversion->notes.push_back(
        "zero_optimization.offload_optimizer/offload_param device = \"cpu\": kept; on a "
        "CPU-only run (use_cpu, or no GPU) the states already live in host memory, so it "
        "changes nothing there (pin_memory needs CUDA)");
  }
  for (const std::string& note : conversion->notes) {
    out.notes.push_back(absl::StrCat("deepspeed=", source.name, ": ", note));
  }
  return out;
}

absl::StatusOr<HfJsonTranslation> Fsdp(const Source& source, const JsonValue& root) {
  constexpr absl::string_view kName = "fsdp_config";
  HfJsonTranslation out;
  std::vector<AccelerateSetting> settings = {{"distributed_type", "FSDP", "fsdp_config"}};
  std::set<std::string> seen;
  bool has_version = false;
  for (size_t i = 0; i < root.keys.size(); ++i) {
    const std::string& key = root.keys[i];
    const JsonValue& v = root.values[i];
    absl::string_view bare_view = key;
    absl::ConsumePrefix(&bare_view, "fsdp_");  // transformers strips it
    const std::string bare(bare_view);
    if (!seen.insert(bare).second) {
      return KeyError(kName, source, key, v,
                      absl::StrCat("given twice, with and without the fsdp_ prefix; keep one (",
                                   bare, ")"));
    }
    if (bare == "xla" || bare == "xla_fsdp_v2" || bare == "xla_fsdp_grad_ckpt") {
      if (!v.is_bool()) return KeyError(kName, source, key, v, "expected true or false");
      if (v.boolean) {
        return KeyError(kName, source, key, v,
                        "PyTorch/XLA FSDP is not implemented (FSDP here runs on CUDA or CPU "
                        "with NCCL or Gloo); set it to false or remove it");
      }
      continue;
    }
    if (bare == "xla_fsdp_settings") {
      if (!v.is_null() && !(v.is_object() && v.keys.empty())) {
        return KeyError(kName, source, key, v,
                        "PyTorch/XLA FSDP is not implemented; remove xla_fsdp_settings");
      }
      continue;
    }
    if (bare == "limit_all_gathers") {
      if (!v.is_bool()) return KeyError(kName, source, key, v, "expected true or false");
      out.assignments.push_back(
          absl::StrCat("fsdp.limit_all_gathers=", v.boolean ? "true" : "false"));
      continue;
    }
    const std::optional<std::string> text = ScalarText(v);
    if (!text) {
      return KeyError(kName, source, key, v, "expected a string, number, boolean or a list");
    }
    // transformers' name for what Accelerate calls fsdp_offload_params.
    const std::string accelerate_key =
        bare == "cpu_offload" ? "fsdp_config.fsdp_offload_params"
                              : absl::StrCat("fsdp_config.fsdp_", bare);
    if (bare == "version") has_version = true;
    settings.push_back({accelerate_key, *text, absl::StrCat(source.name, ": ", key)});
  }
  // transformers' default is FSDP2; it also decides how reshard_after_forward reads.
  if (!has_version) settings.push_back({"fsdp_config.fsdp_version", "2", "fsdp_config"});
  absl::StatusOr<AccelerateMapping> mapping = MapAccelerateSettings(settings);
  if (!mapping.ok()) {
    absl::string_view message = mapping.status().message();
    absl::ConsumePrefix(&message, "the Accelerate configuration cannot be used as it is:\n");
    return absl::InvalidArgumentError(absl::StrCat(
        "fsdp_config=", source.name, " cannot be used as it is (the keys are those of "
        "transformers' fsdp_config and of Accelerate's, docs/ACCELERATE.md):\n", message));
  }
  for (const std::string& o : mapping->overrides) {
    absl::string_view path = o;
    absl::ConsumePrefix(&path, "args.");
    if (path == "fsdp={}") continue;  // the fields below select FSDP; {} would replace fsdp's
    // A version only when the file gives one: fsdp's string form ("full_shard auto_wrap",
    // FSDP1) keeps its own otherwise.
    if (!has_version && absl::StartsWith(path, "fsdp.version=")) continue;
    out.assignments.emplace_back(path);
  }
  for (const std::string& note : mapping->notes) {
    out.notes.push_back(absl::StrCat("fsdp_config=", source.name, ": ", note));
  }
  return out;
}

absl::StatusOr<HfJsonTranslation> GradientAccumulationKwargs(const Source& source,
                                                             const std::string& path,
                                                             const JsonValue& kwargs,
                                                             HfJsonTranslation out) {
  constexpr absl::string_view kName = "accelerator_config";
  if (kwargs.is_null()) return out;
  if (!kwargs.is_object()) return KeyError(kName, source, path, kwargs, "expected an object");
  const std::string field = "accelerator_config.gradient_accumulation_kwargs.";
  for (size_t i = 0; i < kwargs.keys.size(); ++i) {
    const std::string& key = kwargs.keys[i];
    const JsonValue& v = kwargs.values[i];
    const std::string key_path = absl::StrCat(path, ".", key);
    if (key == "num_steps") {
      if (!v.is_integer() || v.integer < 1 || v.integer > INT32_MAX) {
        return KeyError(kName, source, key_path, v, "expected an integer from 1 to 2^31-1");
      }
      out.assignments.push_back(absl::StrCat(field, "num_steps=", v.integer));
    } else if (key == "adjust_scheduler" || key == "sync_each_batch") {
      if (!v.is_bool()) return KeyError(kName, source, key_path, v, "expected true or false");
      out.assignments.push_back(absl::StrCat(field, key, "=", v.boolean ? "true" : "false"));
    } else if (key == "sync_with_dataloader") {
      if (!v.is_bool()) return KeyError(kName, source, key_path, v, "expected true or false");
      if (!v.boolean) {
        return KeyError(kName, source, key_path, v,
                        "accumulating across the end of an epoch is not implemented: the last "
                        "micro-batches of an epoch always make an optimizer step (Accelerate's "
                        "default, true); remove the key");
      }
    } else {
      return KeyError(kName, source, key_path, v,
                      "not a key of Accelerate's GradientAccumulationPlugin read here; use "
                      "num_steps, adjust_scheduler, sync_each_batch or sync_with_dataloader");
    }
  }
  return out;
}

absl::StatusOr<HfJsonTranslation> Accelerator(const Source& source, const JsonValue& root) {
  constexpr absl::string_view kName = "accelerator_config";
  static const std::set<std::string> kBools = {"split_batches", "even_batches",
                                               "use_seedable_sampler", "non_blocking"};
  HfJsonTranslation out;
  for (size_t i = 0; i < root.keys.size(); ++i) {
    const std::string& key = root.keys[i];
    const JsonValue& v = root.values[i];
    if (kBools.count(key) > 0 || key == "dispatch_batches") {
      if (key == "dispatch_batches" && v.is_null()) continue;  // Accelerate decides: false here
      if (!v.is_bool()) return KeyError(kName, source, key, v, "expected true or false");
      // dispatch_batches: true and use_seedable_sampler: false are refused by validation,
      // with the reason (config/internal/args_validation.cc).
      out.assignments.push_back(
          absl::StrCat("accelerator_config.", key, "=", v.boolean ? "true" : "false"));
    } else if (key == "gradient_accumulation_kwargs") {
      CT_ASSIGN_OR_RETURN(out, GradientAccumulationKwargs(source, key, v, std::move(out)));
    } else if (key == "use_configured_state") {
      if (!v.is_bool()) return KeyError(kName, source, key, v, "expected true or false");
      if (v.boolean) {
        return KeyError(kName, source, key, v,
                        "there is no AcceleratorState built beforehand to reuse: each run sets "
                        "up its processes from the launcher's environment; remove the key");
      }
    } else {
      // transformers refuses unknown keys too (AcceleratorConfig.from_json_file).
      return KeyError(kName, source, key, v,
                      "not a key of transformers' AcceleratorConfig; the keys are "
                      "split_batches, dispatch_batches, even_batches, use_seedable_sampler, "
                      "non_blocking, gradient_accumulation_kwargs, use_configured_state");
    }
  }
  return out;
}

}  // namespace

bool IsHfJsonArgument(absl::string_view name) {
  return name == "deepspeed" || name == "fsdp_config" || name == "accelerator_config";
}

bool IsHfJsonValue(absl::string_view value) {
  const std::string v = Unquoted(value);
  if (v.empty() || v.front() != '{') return !v.empty();
  absl::string_view rest = absl::StripLeadingAsciiWhitespace(absl::string_view(v).substr(1));
  return !rest.empty() && rest.front() == '"';
}

absl::StatusOr<HfJsonTranslation> TranslateHfJsonArgument(absl::string_view name,
                                                          absl::string_view value) {
  if (!IsHfJsonArgument(name)) {
    return absl::NotFoundError(absl::StrCat(
        "\"", name, "\" is not deepspeed, fsdp_config or accelerator_config"));
  }
  CT_ASSIGN_OR_RETURN(const Source source, ReadValue(name, value));
  if (name == "deepspeed") return DeepSpeed(source);
  CT_ASSIGN_OR_RETURN(const JsonValue root, ParseObject(name, source));
  if (name == "fsdp_config") return Fsdp(source, root);
  return Accelerator(source, root);
}

}  // namespace cpptrain
