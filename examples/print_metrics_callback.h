// A TrainerCallback that prints one line per training log and per evaluation to a stream
// (on the main process only), e.g.
//   [step 100 | epoch 0.78] loss 0.8123  learning_rate 0.00291  grad_norm 0.54
//   [step 128 | epoch 1.00] eval  accuracy 0.9123  loss 0.3110
//
//   trainer.AddCallback(std::make_shared<PrintMetricsCallback>(std::cout));
#ifndef CPPTRAIN_EXAMPLES_PRINT_METRICS_CALLBACK_H_
#define CPPTRAIN_EXAMPLES_PRINT_METRICS_CALLBACK_H_

#include <ostream>

#include "trainer/callbacks.h"

namespace example {

class PrintMetricsCallback : public cpptrain::TrainerCallback {
 public:
  // `out` must outlive the callback.
  explicit PrintMetricsCallback(std::ostream& out) : out_(out) {}

  void OnLog(const cpptrain::CallbackContext& c, const cpptrain::Metrics& logs) override;
  void OnEvaluate(const cpptrain::CallbackContext& c, const cpptrain::Metrics& metrics) override;
  void OnTrainEnd(const cpptrain::CallbackContext& c) override;

  int evaluations() const { return evaluations_; }

 private:
  void Prefix(const cpptrain::TrainerState& state);

  std::ostream& out_;
  int evaluations_ = 0;
};

}  // namespace example

#endif  // CPPTRAIN_EXAMPLES_PRINT_METRICS_CALLBACK_H_
