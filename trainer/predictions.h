// Writes what Trainer::Predict returns as JSON lines: tools/train's do_predict output, and any
// application's (docs/PREDICTIONS.md describes the format).
//
//   CT_ASSIGN_OR_RETURN(PredictionOutput out, trainer.Predict(test));
//   CT_RETURN_IF_ERROR(WritePredictions(out, /*top_k=*/5, output_dir + "/predictions.jsonl"));
#ifndef CPPTRAIN_TRAINER_PREDICTIONS_H_
#define CPPTRAIN_TRAINER_PREDICTIONS_H_

#include <string>

#include "absl/status/status.h"
#include "trainer/trainer.h"

namespace cpptrain {

// One line per sample: {"index": i, "label_ids": [...], "predicted_ids": [...]} and, when
// top_k > 0, "top_k_ids" and "top_k_logits" ([T][k], highest first). predicted_ids[t] is the
// argmax of the logits at position t: the model's guess for label_ids[t + 1]. Positions that
// are padding in every respect (label -100 and logits -100, from batches of different lengths)
// are cut from the end of each line. Written atomically.
absl::Status WritePredictions(const PredictionOutput& output, int top_k, const std::string& path);

}  // namespace cpptrain

#endif  // CPPTRAIN_TRAINER_PREDICTIONS_H_
