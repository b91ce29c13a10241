#include "tools/generation.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "base/torch_status.h"

namespace cpptrain {

absl::StatusOr<std::vector<int64_t>> GreedyComplete(DecoderLM& model,
                                                    const std::vector<int64_t>& prompt,
                                                    const GenerateOptions& options) {
  const int64_t vocab = model.config().vocab_size();
  if (prompt.empty()) {
    return absl::InvalidArgumentError("the prompt is empty: give at least one token id");
  }
  for (int64_t id : prompt) {
    if (id < 0 || id >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat("prompt token id ", id,
                                                     " is outside the model's vocabulary [0, ",
                                                     vocab, "): use ids below vocab_size"));
    }
  }
  if (options.max_new_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_new_tokens is ", options.max_new_tokens, "; use a count >= 0"));
  }
  std::vector<int64_t> tokens = prompt;
  std::vector<int64_t> completion;
  at::NoGradGuard no_grad;
  model.eval();
  const c10::Device device = model.parameters().front().device();
  for (int64_t step = 0; step < options.max_new_tokens; ++step) {
    CT_ASSIGN_OR_RETURN(
        int64_t next, CatchTorch([&] {
          const at::Tensor ids = at::tensor(tokens, at::kLong).to(device).reshape({1, -1});
          return model.Logits(ids)[0][-1].argmax().item<int64_t>();
        }));
    tokens.push_back(next);
    completion.push_back(next);
    if (std::find(options.stop_ids.begin(), options.stop_ids.end(), next) !=
        options.stop_ids.end()) {
      break;
    }
  }
  return completion;
}

}  // namespace cpptrain
