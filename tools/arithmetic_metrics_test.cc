// ArithmeticExactMatch counts the answers whose lines start inside the sample and end inside
// it, and scores one right only when every answer token and its newline are predicted.
#include "tools/arithmetic_metrics.h"

#include <ATen/ATen.h>

#include <vector>

#include "gtest/gtest.h"
#include "trainer/data/arithmetic_corpus.h"

namespace cpptrain {
namespace {

// Logits whose argmax at position t is `next[t]`.
at::Tensor LogitsFor(const std::vector<int64_t>& next, int64_t vocab) {
  at::Tensor logits = at::zeros({1, static_cast<int64_t>(next.size()), vocab});
  for (size_t t = 0; t < next.size(); ++t) logits[0][t][next[t]] = 1.0;
  return logits;
}

TEST(ArithmeticMetricsTest, CountsWholeLinesAndScoresEveryAnswerToken) {
  // "5=6\n1+2=3\n3+4=7\n2+2=" : the first line starts before the sample, the last has no answer.
  const std::vector<int64_t> labels = EncodeArithmetic("5=6\n1+2=3\n3+4=7\n2+2=").value();
  std::vector<int64_t> next(labels.begin() + 1, labels.end());
  next.push_back(0);
  // Perfect predictions: both whole lines right.
  EvalPrediction perfect{LogitsFor(next, 14), at::tensor(labels, at::kLong).reshape({1, -1})};
  Metrics metrics = ArithmeticExactMatch(perfect);
  EXPECT_EQ(metrics.at("answers_counted"), 2);
  EXPECT_EQ(metrics.at("answer_exact_match"), 1.0);
  // One wrong answer digit ("3+4=" predicts 8): half right.
  const size_t seven = 14;  // position of '7' in labels
  ASSERT_EQ(labels[seven], EncodeArithmetic("7").value()[0]);
  next[seven - 1] = EncodeArithmetic("8").value()[0];
  EvalPrediction wrong{LogitsFor(next, 14), perfect.label_ids};
  metrics = ArithmeticExactMatch(wrong);
  EXPECT_EQ(metrics.at("answers_counted"), 2);
  EXPECT_EQ(metrics.at("answer_exact_match"), 0.5);
}

}  // namespace
}  // namespace cpptrain
