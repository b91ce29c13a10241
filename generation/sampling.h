// Choosing the next token from a row of logits: greedy, or sampled after Hugging Face's
// filters in generate's order (temperature, then top-k, then top-p), from a seeded generator.
// generation/generate.h runs these inside its loop; use them directly for a decoding loop of
// your own.
//
//   SamplingOptions options;
//   options.temperature = 0.7;
//   options.top_k = 50;
//   options.top_p = 0.9;
//   CT_RETURN_IF_ERROR(ValidateSamplingOptions(options));
//   at::Generator generator = MakeSamplingGenerator(/*seed=*/42);
//   at::Tensor next = SampleTokens(logits, options, generator);   // [B] int64, on the CPU
//   at::Tensor best = GreedyTokens(logits);                         // [B] int64, on the CPU
//
// Everything runs on the CPU in fp32 (the [B, vocab] logits are copied there first), so a seed
// gives the same tokens on every run and on every device the model runs on.
#ifndef CPPTRAIN_GENERATION_SAMPLING_H_
#define CPPTRAIN_GENERATION_SAMPLING_H_

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>

#include "absl/status/status.h"

namespace cpptrain {

struct SamplingOptions {
  // Scores are divided by it (HF's TemperatureLogitsWarper); > 0. 1: unchanged.
  double temperature = 1.0;
  // Keep the top_k highest scores (ties with the k-th kept too, as HF's TopKLogitsWarper);
  // 0: no top-k filter. (HF's GenerationConfig defaults to 50; set 50 to match it.)
  int64_t top_k = 0;
  // Nucleus: keep the smallest set of highest-probability tokens whose cumulative probability
  // is >= top_p, always at least one (HF's TopPLogitsWarper); in (0, 1]. 1: no filter.
  double top_p = 1.0;
};

// OK when temperature > 0, top_k >= 0 and 0 < top_p <= 1; else an error naming the value.
absl::Status ValidateSamplingOptions(const SamplingOptions& options);

// `logits` [B, vocab] (any device and floating dtype) as fp32 CPU scores after the filters:
// divided by the temperature, and -inf where top-k or top-p removes a token.
at::Tensor FilterLogits(const at::Tensor& logits, const SamplingOptions& options);

// One token per row drawn from softmax(FilterLogits(logits)) with `generator` (a CPU
// generator: MakeSamplingGenerator). [B] int64 on the CPU.
at::Tensor SampleTokens(const at::Tensor& logits, const SamplingOptions& options,
                        at::Generator& generator);

// The argmax of each row (ties: the lowest id, as torch.argmax). [B] int64 on the CPU.
at::Tensor GreedyTokens(const at::Tensor& logits);

// A CPU generator seeded with `seed`: the same seed gives the same draws.
at::Generator MakeSamplingGenerator(uint64_t seed);

}  // namespace cpptrain

#endif  // CPPTRAIN_GENERATION_SAMPLING_H_
