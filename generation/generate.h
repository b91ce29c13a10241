// Text generation with the reference decoder (models/decoder.h): greedy or sampled (temperature,
// top-k, top-p: generation/sampling.h) from a seed, stop token ids, max_new_tokens, one prompt
// or a batch, with a KV cache (each step runs only the new token: DecoderLM::Logits(ids, cache)).
// Greedy decoding gives the tokens of transformers' generate(do_sample=False), including its
// Phi-3 rule: the first time the sequence grows past rope_scaling's
// original_max_position_embeddings, the cache is dropped and the whole sequence runs again
// (so every key turns with longrope's long factors); other models keep their cached keys as
// they were turned (DecoderLM::Logits(ids, cache) says what that means for "dynamic" and
// "longrope").
//
//   GenerationConfig config;
//   config.max_new_tokens = 20;
//   config.stop_ids = {model->config().eos_token_id().begin(), ...};  // kept in the output
//   CT_ASSIGN_OR_RETURN(std::vector<int64_t> greedy, Generate(*model, prompt, config));
//
//   config.do_sample = true;
//   config.sampling.temperature = 0.7;
//   config.sampling.top_p = 0.9;
//   config.seed = 1234;                                // same seed, same tokens, every run
//   CT_ASSIGN_OR_RETURN(std::vector<std::vector<int64_t>> completions,
//                       GenerateBatch(*model, {prompt_a, prompt_b}, config));
//
// Batches have no padding: prompts of equal length run as one batch (one forward per step for
// all of them); prompts of different lengths run as separate batches, one per length, in order
// of first appearance. So each completion is exactly what that prompt gives alone in greedy
// decoding; with sampling, one generator seeded once per call draws for the batches in turn.
// A sequence that produced a stop id is finished (its row still runs until its batch ends, its
// later tokens dropped); a batch ends when every row has finished or has max_new_tokens.
//
// The model runs in eval mode (a model in training mode returns to it afterwards) under
// no-grad, on whatever device its parameters are on; the choice of each token runs on the CPU
// (sampling.h), so results do not depend on the device's random number generator.
#ifndef CPPTRAIN_GENERATION_GENERATE_H_
#define CPPTRAIN_GENERATION_GENERATE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "generation/sampling.h"
#include "models/decoder.h"

namespace cpptrain {

struct GenerationConfig {
  // The most tokens to add to each prompt; >= 0.
  int64_t max_new_tokens = 32;
  // A sequence ends after producing one of these (it is the last token of its completion).
  std::vector<int64_t> stop_ids;
  // false: greedy (argmax; ties: the lowest id). true: drawn after `sampling`'s filters.
  bool do_sample = false;
  SamplingOptions sampling;
  // Seeds the CPU generator of one Generate / GenerateBatch call.
  uint64_t seed = 0;
};

// OK when max_new_tokens >= 0 and, with do_sample, the sampling options are valid.
absl::Status ValidateGenerationConfig(const GenerationConfig& config);

// The tokens generated after `prompt` (without the prompt). Errors: an invalid config, an empty
// prompt, an id outside [0, vocab_size), or a failure inside LibTorch.
absl::StatusOr<std::vector<int64_t>> Generate(DecoderLM& model, const std::vector<int64_t>& prompt,
                                              const GenerationConfig& config);

// The completions of `prompts`, in their order (see the header comment for batching).
absl::StatusOr<std::vector<std::vector<int64_t>>> GenerateBatch(
    DecoderLM& model, const std::vector<std::vector<int64_t>>& prompts,
    const GenerationConfig& config);

}  // namespace cpptrain

#endif  // CPPTRAIN_GENERATION_GENERATE_H_
