#include "checkpoint/model_match.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "base/logging.h"

namespace cpptrain {
namespace {

constexpr size_t kMaxListed = 16;
constexpr char kLayersPrefix[] = "model.layers.";

// An integer as one (500000), otherwise the shortest decimal text that reads back as exactly
// `value` (1e-06, not 9.99...e-07).
std::string Number(double value) {
  if (value == std::floor(value) && std::fabs(value) < 1e15) {
    return absl::StrCat(static_cast<int64_t>(value));
  }
  for (int digits = 1; digits < 17; ++digits) {
    std::string text = absl::StrFormat("%.*g", digits, value);
    if (std::strtod(text.c_str(), nullptr) == value) return text;
  }
  return absl::StrFormat("%.17g", value);
}

std::string Bool(bool value) { return value ? "true" : "false"; }

// "none", or the window and the first layer that has it.
std::string Window(const proto::DecoderConfig& c) {
  if (!c.has_sliding_window()) return "none";
  return absl::StrCat(c.sliding_window(), " from layer ", c.first_sliding_layer());
}

// "none", or the type and the fields that change the frequencies.
std::string Rope(const proto::DecoderConfig& c) {
  if (!c.has_rope_scaling()) return "none";
  const proto::RopeScaling& s = c.rope_scaling();
  std::string text = absl::StrCat(s.rope_type(), " factor ",
                                  s.has_factor() ? Number(s.factor()) : "unset");
  if (s.rope_type() == "llama3") {
    absl::StrAppend(&text, " low_freq_factor ", Number(s.low_freq_factor()), " high_freq_factor ",
                    Number(s.high_freq_factor()), " original_max_position_embeddings ",
                    s.original_max_position_embeddings());
  }
  if (s.rope_type() == "yarn" || s.rope_type() == "longrope") {
    proto::RopeScaling rest = s;
    rest.clear_rope_type();
    rest.clear_factor();
    absl::StrAppend(&text, " ", rest.ShortDebugString());
  }
  if (s.rope_type() == "dynamic") {
    absl::StrAppend(&text, " max_position_embeddings ", c.max_position_embeddings());
  }
  return text;
}

std::string Shape(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

int64_t HeadDim(const proto::DecoderConfig& c) {
  if (c.has_head_dim()) return c.head_dim();
  return c.num_attention_heads() > 0 ? c.hidden_size() / c.num_attention_heads() : 0;
}

int64_t KvHeads(const proto::DecoderConfig& c) {
  return c.has_num_key_value_heads() ? c.num_key_value_heads() : c.num_attention_heads();
}

// The layer index of "model.layers.<i>.*" (after an optional "model." in front), or -1.
int64_t LayerIndex(absl::string_view name) {
  if (!absl::StartsWith(name, kLayersPrefix)) {
    if (!absl::ConsumePrefix(&name, "model.") || !absl::StartsWith(name, kLayersPrefix)) return -1;
  }
  name.remove_prefix(sizeof(kLayersPrefix) - 1);
  const size_t dot = name.find('.');
  int64_t index = -1;
  if (dot == absl::string_view::npos || !absl::SimpleAtoi(name.substr(0, dot), &index)) return -1;
  return index;
}

}  // namespace

std::vector<std::string> DecoderConfigDifferences(const proto::DecoderConfig& saved,
                                                  const proto::DecoderConfig& model,
                                                  absl::string_view saved_as) {
  const std::vector<std::pair<const char*, std::pair<std::string, std::string>>> fields = {
      {"vocab_size", {absl::StrCat(saved.vocab_size()), absl::StrCat(model.vocab_size())}},
      {"hidden_size", {absl::StrCat(saved.hidden_size()), absl::StrCat(model.hidden_size())}},
      {"intermediate_size",
       {absl::StrCat(saved.intermediate_size()), absl::StrCat(model.intermediate_size())}},
      {"num_hidden_layers",
       {absl::StrCat(saved.num_hidden_layers()), absl::StrCat(model.num_hidden_layers())}},
      {"num_attention_heads",
       {absl::StrCat(saved.num_attention_heads()), absl::StrCat(model.num_attention_heads())}},
      {"num_key_value_heads", {absl::StrCat(KvHeads(saved)), absl::StrCat(KvHeads(model))}},
      {"head_dim", {absl::StrCat(HeadDim(saved)), absl::StrCat(HeadDim(model))}},
      {"rope_theta", {Number(saved.rope_theta()), Number(model.rope_theta())}},
      {"rope_scaling", {Rope(saved), Rope(model)}},
      {"rms_norm_eps", {Number(saved.rms_norm_eps()), Number(model.rms_norm_eps())}},
      {"tie_word_embeddings",
       {Bool(saved.tie_word_embeddings()), Bool(model.tie_word_embeddings())}},
      {"qk_norm", {Bool(saved.qk_norm()), Bool(model.qk_norm())}},
      {"attention_bias", {Bool(saved.attention_bias()), Bool(model.attention_bias())}},
      {"qkv_bias", {Bool(saved.qkv_bias()), Bool(model.qkv_bias())}},
      {"mlp_bias", {Bool(saved.mlp_bias()), Bool(model.mlp_bias())}},
      {"fused_projections",
       {Bool(saved.fused_projections()), Bool(model.fused_projections())}},
      {"partial_rotary_factor",
       {Number(saved.partial_rotary_factor()), Number(model.partial_rotary_factor())}},
      {"sliding_window", {Window(saved), Window(model)}},
      {"model_type", {saved.model_type(), model.model_type()}},
  };
  std::vector<std::string> out;
  for (const auto& [field, values] : fields) {
    if (values.first == values.second) continue;
    out.push_back(absl::StrCat(field, " is ", values.first, " in ", saved_as, " but ",
                               values.second, " in the model"));
  }
  return out;
}

std::string ConfigFieldHint(absl::string_view name, int64_t other_side_layers) {
  if (absl::StrContains(name, "q_norm") || absl::StrContains(name, "k_norm")) return "qk_norm";
  if (absl::StrContains(name, "qkv_proj") || absl::StrContains(name, "gate_up_proj")) {
    return "model_type";  // only Phi-3 fuses them
  }
  if (absl::EndsWith(name, ".bias")) {
    if (absl::StrContains(name, "self_attn")) return "attention_bias";
    if (absl::StrContains(name, "mlp")) return "mlp_bias";
  }
  if (absl::EndsWith(name, "lm_head.weight")) return "tie_word_embeddings";
  const int64_t layer = LayerIndex(name);
  if (layer >= 0 && other_side_layers >= 0 && layer >= other_side_layers) {
    return "num_hidden_layers";
  }
  return "";
}

int64_t DecoderLayerCount(const std::vector<std::string>& names) {
  int64_t count = 0;
  for (const std::string& name : names) count = std::max(count, LayerIndex(name) + 1);
  return count;
}

void LoadProblems::AddConfigDifference(std::string line) {
  fields_.insert(line.substr(0, line.find(' ')));
  lines_.push_back(std::move(line));
}

void LoadProblems::AddConfigDifferences(const std::vector<std::string>& lines) {
  for (const std::string& line : lines) AddConfigDifference(line);
}

void LoadProblems::AddUnexpected(const std::string& name, const std::vector<int64_t>& shape,
                                 const std::string& hint) {
  if (!hint.empty()) fields_.insert(hint);
  lines_.push_back(absl::StrCat(
      "unexpected tensor '", name, "' (shape ", Shape(shape),
      "): saved, but the model has no such parameter",
      hint.empty() ? "" : absl::StrCat(" (config field ", hint, " probably differs)")));
}

void LoadProblems::AddMissing(const std::string& name, const std::vector<int64_t>& shape,
                              const std::string& hint) {
  if (!hint.empty()) fields_.insert(hint);
  lines_.push_back(absl::StrCat(
      "missing tensor '", name, "' (the model's shape ", Shape(shape),
      "): a parameter of the model that was not saved",
      hint.empty() ? "" : absl::StrCat(" (config field ", hint, " probably differs)")));
}

void LoadProblems::AddShapeMismatch(const std::string& name, const std::vector<int64_t>& saved,
                                    const std::vector<int64_t>& model) {
  lines_.push_back(absl::StrCat("tensor '", name, "' has shape ", Shape(saved), " saved but ",
                                Shape(model), " in the model"));
}

void LoadProblems::Add(std::string line, const std::string& field) {
  if (!field.empty()) fields_.insert(field);
  lines_.push_back(std::move(line));
}

absl::Status LoadProblems::Resolve(const std::string& what, bool strict,
                                   const std::string& escape) const {
  if (lines_.empty()) return absl::OkStatus();
  if (!strict) {
    for (const std::string& line : lines_) {
      LOG(WARNING) << what << ": " << line << " (not strict: loading what matches)";
    }
    return absl::OkStatus();
  }
  const std::vector<std::string> listed(lines_.begin(),
                                        lines_.begin() + std::min(lines_.size(), kMaxListed));
  std::string fields;
  if (!fields_.empty()) {
    fields = absl::StrCat("; config fields that differ or probably differ: ",
                          absl::StrJoin(fields_, ", "));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      what, " does not match the model (", lines_.size(),
      lines_.size() == 1 ? " problem" : " problems", "; nothing was loaded", fields,
      "): ", absl::StrJoin(listed, "; "),
      lines_.size() > kMaxListed ? absl::StrCat("; and ", lines_.size() - kMaxListed, " more") : "",
      ". Build the model with the configuration the weights were saved with, or ", escape,
      " to load what matches (each problem is then a warning)"));
}

}  // namespace cpptrain
