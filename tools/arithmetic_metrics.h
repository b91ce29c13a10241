// Exact-match accuracy of the answers of the builtin arithmetic corpus
// (trainer/data/arithmetic_corpus.h), as a Trainer compute_metrics.
//
//   trainer.set_compute_metrics(ArithmeticExactMatch);   // eval_answer_exact_match, ...
#ifndef CPPTRAIN_TOOLS_ARITHMETIC_METRICS_H_
#define CPPTRAIN_TOOLS_ARITHMETIC_METRICS_H_

#include "trainer/trainer.h"

namespace cpptrain {

// For every line "A+B=C\n" of each sample whose start is inside the sample (a '\n' precedes
// it), whether the argmax predictions of C and its '\n' are all right given the prompt. With
// the prefix right at every step this is what greedy generation from "A+B=" produces, so it is
// the greedy exact-match accuracy. Returns answer_exact_match (the fraction) and
// answers_counted.
Metrics ArithmeticExactMatch(const EvalPrediction& prediction);

}  // namespace cpptrain

#endif  // CPPTRAIN_TOOLS_ARITHMETIC_METRICS_H_
