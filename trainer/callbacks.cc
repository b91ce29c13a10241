#include "trainer/callbacks.h"

#include "base/logging.h"
#include "config/training_args.h"

namespace cpptrain {

#define CT_FOR_EACH_CALLBACK(call) \
  for (const auto& callback : callbacks_) callback->call

void CallbackHandler::TrainBegin(const CallbackContext& c) {
  c.control.should_training_stop = false;
  CT_FOR_EACH_CALLBACK(OnTrainBegin(c));
}
void CallbackHandler::TrainEnd(const CallbackContext& c) { CT_FOR_EACH_CALLBACK(OnTrainEnd(c)); }
void CallbackHandler::EpochBegin(const CallbackContext& c) {
  c.control.should_epoch_stop = false;
  CT_FOR_EACH_CALLBACK(OnEpochBegin(c));
}
void CallbackHandler::EpochEnd(const CallbackContext& c) { CT_FOR_EACH_CALLBACK(OnEpochEnd(c)); }
void CallbackHandler::StepBegin(const CallbackContext& c) {
  c.control.should_log = false;
  c.control.should_evaluate = false;
  c.control.should_save = false;
  CT_FOR_EACH_CALLBACK(OnStepBegin(c));
}
void CallbackHandler::SubstepEnd(const CallbackContext& c) {
  CT_FOR_EACH_CALLBACK(OnSubstepEnd(c));
}
void CallbackHandler::PreOptimizerStep(const CallbackContext& c) {
  CT_FOR_EACH_CALLBACK(OnPreOptimizerStep(c));
}
void CallbackHandler::OptimizerStep(const CallbackContext& c) {
  CT_FOR_EACH_CALLBACK(OnOptimizerStep(c));
}
void CallbackHandler::StepEnd(const CallbackContext& c) { CT_FOR_EACH_CALLBACK(OnStepEnd(c)); }
void CallbackHandler::Evaluate(const CallbackContext& c, const Metrics& metrics) {
  c.control.should_evaluate = false;
  CT_FOR_EACH_CALLBACK(OnEvaluate(c, metrics));
}
void CallbackHandler::Predict(const CallbackContext& c, const Metrics& metrics) {
  CT_FOR_EACH_CALLBACK(OnPredict(c, metrics));
}
void CallbackHandler::Save(const CallbackContext& c) {
  c.control.should_save = false;
  CT_FOR_EACH_CALLBACK(OnSave(c));
}
void CallbackHandler::Log(const CallbackContext& c, const Metrics& logs) {
  c.control.should_log = false;
  CT_FOR_EACH_CALLBACK(OnLog(c, logs));
}

#undef CT_FOR_EACH_CALLBACK

absl::Status CallbackHandler::FirstError() const {
  for (const auto& callback : callbacks_) {
    absl::Status status = callback->status();
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

void DefaultFlowCallback::OnStepEnd(const CallbackContext& c) {
  using Args = proto::TrainingArguments;
  const int64_t step = c.state.global_step;
  if (step == 1 && c.args.logging_first_step()) c.control.should_log = true;
  if (c.args.logging_strategy() == Args::STEPS && c.state.logging_steps > 0 &&
      step % c.state.logging_steps == 0) {
    c.control.should_log = true;
  }
  if (c.args.eval_strategy() == Args::STEPS && c.state.eval_steps > 0 &&
      step % c.state.eval_steps == 0 && c.args.eval_delay() <= step) {
    c.control.should_evaluate = true;
  }
  if (c.args.save_strategy() == Args::STEPS && c.state.save_steps > 0 &&
      step % c.state.save_steps == 0) {
    c.control.should_save = true;
  }
  if (step >= c.state.max_steps) {
    c.control.should_training_stop = true;
    if (c.args.save_strategy() == Args::STEPS) c.control.should_save = true;
  }
}

void DefaultFlowCallback::OnEpochEnd(const CallbackContext& c) {
  using Args = proto::TrainingArguments;
  if (c.args.logging_strategy() == Args::EPOCH) c.control.should_log = true;
  if (c.args.eval_strategy() == Args::EPOCH && c.args.eval_delay() <= c.state.epoch) {
    c.control.should_evaluate = true;
  }
  if (c.args.save_strategy() == Args::EPOCH) c.control.should_save = true;
}

void EarlyStoppingCallback::OnEvaluate(const CallbackContext& c, const Metrics& metrics) {
  const std::string metric = ResolvedMetricForBestModel(c.args);
  auto it = metrics.find(metric);
  if (it == metrics.end()) {
    LOG(WARNING) << "early stopping needs metric \"" << metric
                 << "\", which the evaluation did not report; early stopping is inactive";
    return;
  }
  const bool greater = ResolvedGreaterIsBetter(c.args);
  const double value = it->second;
  const bool improved = !best_.has_value() ||
                        (greater ? value > *best_ + threshold_ : value < *best_ - threshold_);
  if (improved) {
    best_ = value;
    bad_evaluations_ = 0;
  } else if (++bad_evaluations_ >= patience_) {
    c.control.should_training_stop = true;
  }
}

}  // namespace cpptrain
