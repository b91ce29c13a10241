#include "tools/arithmetic_metrics.h"

#include <ATen/ATen.h>

#include <cstdint>

namespace cpptrain {
namespace {

// trainer/data/arithmetic_corpus.h's vocabulary.
constexpr int64_t kEquals = 12;
constexpr int64_t kNewline = 13;

}  // namespace

Metrics ArithmeticExactMatch(const EvalPrediction& prediction) {
  const at::Tensor predicted = prediction.predictions.argmax(-1).to(at::kLong).contiguous();
  const at::Tensor labels = prediction.label_ids.to(at::kLong).contiguous();
  int64_t counted = 0;
  int64_t right = 0;
  for (int64_t i = 0; i < labels.size(0); ++i) {
    const int64_t* label = labels[i].data_ptr<int64_t>();
    const int64_t* guess = predicted[i].data_ptr<int64_t>();
    const int64_t length = labels.size(1);
    bool line_start_seen = false;
    for (int64_t t = 0; t < length; ++t) {
      if (label[t] == kNewline) line_start_seen = true;
      if (label[t] != kEquals || !line_start_seen) continue;
      int64_t end = t + 1;  // the answer's '\n'
      while (end < length && label[end] != kNewline) ++end;
      if (end == length) break;  // the answer runs past the sample
      bool all = true;
      for (int64_t p = t; p < end; ++p) all = all && guess[p] == label[p + 1];
      ++counted;
      right += all ? 1 : 0;
    }
  }
  return {{"answer_exact_match", counted == 0 ? 0.0 : static_cast<double>(right) / counted},
          {"answers_counted", static_cast<double>(counted)}};
}

}  // namespace cpptrain
