#include "generation/generate.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "base/torch_status.h"

namespace cpptrain {
namespace {

absl::Status CheckPrompt(const std::vector<int64_t>& prompt, size_t index, int64_t vocab) {
  if (prompt.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt ", index, " is empty: give at least one token id"));
  }
  for (int64_t id : prompt) {
    if (id < 0 || id >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt token id ", id, " is outside the model's vocabulary [0, ", vocab,
                       ") (prompt ", index, "): use ids below vocab_size"));
    }
  }
  return absl::OkStatus();
}

// The cache length at which transformers' Phi3ForCausalLM drops its cache and runs the whole
// sequence again (prepare_inputs_for_generation: the first time the sequence grows past
// original_max_position_embeddings, so every key turns with longrope's long factors); -1: never.
int64_t RecomputeAt(const proto::DecoderConfig& config) {
  if (ResolvedModelType(config) != "phi3" ||
      !config.rope_scaling().has_original_max_position_embeddings()) {
    return -1;
  }
  return config.rope_scaling().original_max_position_embeddings();
}

// Generates for prompts of one length, rows in the order of `prompts`.
std::vector<std::vector<int64_t>> GenerateSameLength(
    DecoderLM& model, const std::vector<std::vector<int64_t>>& prompts,
    const GenerationConfig& config, at::Generator& generator) {
  const int64_t batch = static_cast<int64_t>(prompts.size());
  const int64_t length = static_cast<int64_t>(prompts.front().size());
  std::vector<int64_t> flat;
  for (const auto& prompt : prompts) flat.insert(flat.end(), prompt.begin(), prompt.end());
  const c10::Device device = model.parameters().front().device();
  std::vector<std::vector<int64_t>> out(batch);
  if (config.max_new_tokens == 0) return out;
  std::vector<bool> finished(batch, false);
  const int64_t recompute_at = RecomputeAt(model.config());
  // Every row's tokens so far, [B, length + step]: only kept when a recomputation may need it.
  at::Tensor sequences = at::tensor(flat, at::kLong).reshape({batch, length});
  KvCache cache;
  at::Tensor logits = model.Logits(sequences.to(device), cache).select(1, -1);
  for (int64_t step = 0;; ++step) {
    const at::Tensor next = config.do_sample ? SampleTokens(logits, config.sampling, generator)
                                             : GreedyTokens(logits);
    const int64_t* ids = next.data_ptr<int64_t>();
    for (int64_t row = 0; row < batch; ++row) {
      if (finished[row]) continue;
      out[row].push_back(ids[row]);
      finished[row] = std::find(config.stop_ids.begin(), config.stop_ids.end(), ids[row]) !=
                      config.stop_ids.end();
    }
    if (step + 1 == config.max_new_tokens ||
        std::all_of(finished.begin(), finished.end(), [](bool f) { return f; })) {
      return out;
    }
    if (cache.length() == recompute_at) {
      sequences = at::cat({sequences, next.reshape({batch, 1})}, 1);
      cache.Clear();
      logits = model.Logits(sequences.to(device), cache).select(1, -1);
      continue;
    }
    if (recompute_at > cache.length()) {
      sequences = at::cat({sequences, next.reshape({batch, 1})}, 1);
    }
    logits = model.Logits(next.reshape({batch, 1}).to(device), cache).select(1, -1);
  }
}

}  // namespace

absl::Status ValidateGenerationConfig(const GenerationConfig& config) {
  if (config.max_new_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_new_tokens is ", config.max_new_tokens, "; use a count >= 0"));
  }
  if (config.do_sample) return ValidateSamplingOptions(config.sampling);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::vector<int64_t>>> GenerateBatch(
    DecoderLM& model, const std::vector<std::vector<int64_t>>& prompts,
    const GenerationConfig& config) {
  CT_RETURN_IF_ERROR(ValidateGenerationConfig(config));
  const int64_t vocab = model.config().vocab_size();
  // Prompt indices by length, lengths in order of first appearance.
  std::vector<size_t> lengths;
  std::map<size_t, std::vector<size_t>> by_length;
  for (size_t i = 0; i < prompts.size(); ++i) {
    CT_RETURN_IF_ERROR(CheckPrompt(prompts[i], i, vocab));
    auto& group = by_length[prompts[i].size()];
    if (group.empty()) lengths.push_back(prompts[i].size());
    group.push_back(i);
  }
  std::vector<std::vector<int64_t>> completions(prompts.size());
  CT_RETURN_IF_ERROR(CatchTorch([&] {
    at::NoGradGuard no_grad;
    const bool training = model.is_training();
    model.eval();
    at::Generator generator = MakeSamplingGenerator(config.seed);
    for (size_t length : lengths) {
      const std::vector<size_t>& indices = by_length[length];
      std::vector<std::vector<int64_t>> group;
      for (size_t i : indices) group.push_back(prompts[i]);
      std::vector<std::vector<int64_t>> out = GenerateSameLength(model, group, config, generator);
      for (size_t j = 0; j < indices.size(); ++j) completions[indices[j]] = std::move(out[j]);
    }
    if (training) model.train();
  }));
  return completions;
}

absl::StatusOr<std::vector<int64_t>> Generate(DecoderLM& model, const std::vector<int64_t>& prompt,
                                              const GenerationConfig& config) {
  CT_ASSIGN_OR_RETURN(std::vector<std::vector<int64_t>> completions,
                      GenerateBatch(model, {prompt}, config));
  return std::move(completions.front());
}

}  // namespace cpptrain
