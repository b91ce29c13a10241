#include "generation/sampling.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"

namespace cpptrain {

absl::Status ValidateSamplingOptions(const SamplingOptions& options) {
  if (!(options.temperature > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "temperature is ", options.temperature,
        "; use a value > 0 (1 leaves the logits as they are; for greedy decoding turn sampling "
        "off instead of setting 0)"));
  }
  if (options.top_k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_k is ", options.top_k, "; use 0 (no top-k filter) or a count > 0"));
  }
  if (!(options.top_p > 0 && options.top_p <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "top_p is ", options.top_p, "; use a probability in (0, 1] (1: no nucleus filter)"));
  }
  return absl::OkStatus();
}

at::Tensor FilterLogits(const at::Tensor& logits, const SamplingOptions& options) {
  TORCH_CHECK(logits.dim() == 2, "FilterLogits expects [B, vocab] logits, got ", logits.sizes());
  const double minus_inf = -std::numeric_limits<double>::infinity();
  at::Tensor scores = logits.detach().to(at::kCPU, at::kFloat);
  if (options.temperature != 1.0) scores = scores / options.temperature;
  if (options.top_k > 0) {
    const int64_t k = std::min<int64_t>(options.top_k, scores.size(-1));
    const at::Tensor kth = std::get<0>(scores.topk(k, -1)).select(-1, k - 1).unsqueeze(-1);
    scores = scores.masked_fill(scores < kth, minus_inf);
  }
  if (options.top_p < 1.0) {
    // Ascending order: remove the tokens whose cumulative probability, counted from the
    // least likely, stays <= 1 - top_p; the most likely token always stays.
    const auto [sorted, order] = scores.sort(/*dim=*/-1, /*descending=*/false);
    const at::Tensor cumulative = at::softmax(sorted, -1).cumsum(-1);
    at::Tensor remove = cumulative <= (1.0 - options.top_p);
    remove.select(-1, remove.size(-1) - 1).fill_(false);
    scores = scores.masked_fill(remove.scatter(-1, order, remove), minus_inf);
  }
  return scores;
}

at::Tensor SampleTokens(const at::Tensor& logits, const SamplingOptions& options,
                        at::Generator& generator) {
  const at::Tensor probs = at::softmax(FilterLogits(logits, options), -1);
  return at::multinomial(probs, /*num_samples=*/1, /*replacement=*/false, generator).squeeze(-1);
}

at::Tensor GreedyTokens(const at::Tensor& logits) {
  TORCH_CHECK(logits.dim() == 2, "GreedyTokens expects [B, vocab] logits, got ", logits.sizes());
  return logits.detach().to(at::kCPU, at::kFloat).argmax(-1);
}

at::Generator MakeSamplingGenerator(uint64_t seed) {
  return at::make_generator<at::CPUGeneratorImpl>(seed);
}

}  // namespace cpptrain
