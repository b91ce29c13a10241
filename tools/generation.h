// Greedy completion with the reference decoder, for tools/generate and the demo. No KV cache:
// each new token runs the whole prefix again, which is fine for small models and short
// completions, not for serving.
//
//   GenerateOptions options;
//   options.max_new_tokens = 8;
//   options.stop_ids = {13};   // '\n' of the arithmetic corpus
//   CT_ASSIGN_OR_RETURN(std::vector<int64_t> completion, GreedyComplete(*model, prompt, options));
#ifndef CPPTRAIN_TOOLS_GENERATION_H_
#define CPPTRAIN_TOOLS_GENERATION_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "models/decoder.h"

namespace cpptrain {

struct GenerateOptions {
  int64_t max_new_tokens = 32;
  // Generation stops after producing one of these (it is part of the completion).
  std::vector<int64_t> stop_ids;
};

// The tokens that follow `prompt`, each the argmax of the logits at the last position (ties:
// the lowest id). Errors: an empty prompt, an id outside [0, vocab_size), max_new_tokens < 0.
absl::StatusOr<std::vector<int64_t>> GreedyComplete(DecoderLM& model,
                                                    const std::vector<int64_t>& prompt,
                                                    const GenerateOptions& options);

}  // namespace cpptrain

#endif  // CPPTRAIN_TOOLS_GENERATION_H_
