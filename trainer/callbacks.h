// Trainer events and controls, after Hugging Face's TrainerCallback: callbacks observe the
// loop through TrainerState and steer it through TrainerControl (stop, save, evaluate, log).
//
//   class PrintLoss : public TrainerCallback {
//     void OnLog(const CallbackContext& c, const Metrics& logs) override { ... }
//   };
//   trainer.AddCallback(std::make_shared<PrintLoss>());
#ifndef CPPTRAIN_TRAINER_CALLBACKS_H_
#define CPPTRAIN_TRAINER_CALLBACKS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "proto/training_args.pb.h"

namespace torch::optim {
class Optimizer;
}  // namespace torch::optim

namespace cpptrain {

class TrainableModel;

// Named values of one log record or evaluation ("loss", "eval_loss", "learning_rate", ...).
using Metrics = std::map<std::string, double>;

struct TrainerState {
  double epoch = 0;  // fractional: epochs done + share of the current epoch
  int64_t global_step = 0;
  int64_t max_steps = 0;
  int64_t num_update_steps_per_epoch = 0;
  int64_t num_train_epochs = 0;
  int64_t logging_steps = 0;
  int64_t eval_steps = 0;
  int64_t save_steps = 0;
  int64_t train_batch_size = 0;
  int64_t num_input_tokens_seen = 0;
  // Hugging Face's estimate: 6 x non-embedding parameters x input tokens (padding included),
  // summed over every rank and step (resumed runs continue the checkpoint's count).
  double total_flos = 0;
  std::vector<Metrics> log_history;  // each record carries "step" and "epoch"
  std::optional<double> best_metric;
  std::optional<int64_t> best_global_step;
  bool is_world_process_zero = true;
};

struct TrainerControl {
  bool should_training_stop = false;
  bool should_epoch_stop = false;
  bool should_save = false;
  bool should_evaluate = false;
  bool should_log = false;
};

// What every event sees. `control` may be changed by the callback. `model` and `optimizer`
// are Hugging Face's callback kwargs: the model always (when the Trainer has one), the
// optimizer from OnTrainBegin to OnTrainEnd (null outside training, and before the engine
// created it).
struct CallbackContext {
  const proto::TrainingArguments& args;
  const TrainerState& state;
  TrainerControl& control;
  TrainableModel* model = nullptr;
  torch::optim::Optimizer* optimizer = nullptr;
};

class TrainerCallback {
 public:
  virtual ~TrainerCallback() = default;
  virtual void OnTrainBegin(const CallbackContext&) {}
  virtual void OnTrainEnd(const CallbackContext&) {}
  virtual void OnEpochBegin(const CallbackContext&) {}
  virtual void OnEpochEnd(const CallbackContext&) {}
  // First micro-batch of an optimizer step.
  virtual void OnStepBegin(const CallbackContext&) {}
  // Each non-final micro-batch.
  virtual void OnSubstepEnd(const CallbackContext&) {}
  // After clipping, before the optimizer step. An engine may hand the clip coefficient to the
  // step instead of scaling the gradients (every engine, with the Trainer's fused AdamW), so
  // they can read unclipped here; under bf16 working copies the gradients are on the
  // optimizer's parameters (the fp32 masters), not on the model's.
  virtual void OnPreOptimizerStep(const CallbackContext&) {}
  virtual void OnOptimizerStep(const CallbackContext&) {}
  // After the scheduler, zero-grad and global_step += 1.
  virtual void OnStepEnd(const CallbackContext&) {}
  virtual void OnEvaluate(const CallbackContext&, const Metrics& metrics) {}
  virtual void OnPredict(const CallbackContext&, const Metrics& metrics) {}
  virtual void OnSave(const CallbackContext&) {}
  virtual void OnLog(const CallbackContext&, const Metrics& logs) {}
  // The first failure the run must not outlive (a metrics file that could not be written),
  // or OK. The Trainer reads it after each log and ends the run with it, saving first.
  virtual absl::Status status() const { return absl::OkStatus(); }
};

// Calls callbacks in order, resetting control flags the way Hugging Face does (step begin
// clears log/evaluate/save; epoch begin clears epoch-stop; evaluate/save/log clear their own).
class CallbackHandler {
 public:
  void Add(std::shared_ptr<TrainerCallback> callback) { callbacks_.push_back(std::move(callback)); }
  const std::vector<std::shared_ptr<TrainerCallback>>& callbacks() const { return callbacks_; }

  void TrainBegin(const CallbackContext& c);
  void TrainEnd(const CallbackContext& c);
  void EpochBegin(const CallbackContext& c);
  void EpochEnd(const CallbackContext& c);
  void StepBegin(const CallbackContext& c);
  void SubstepEnd(const CallbackContext& c);
  void PreOptimizerStep(const CallbackContext& c);
  void OptimizerStep(const CallbackContext& c);
  void StepEnd(const CallbackContext& c);
  void Evaluate(const CallbackContext& c, const Metrics& metrics);
  void Predict(const CallbackContext& c, const Metrics& metrics);
  void Save(const CallbackContext& c);
  void Log(const CallbackContext& c, const Metrics& logs);
  // The first callback's non-OK status(), in order, or OK.
  absl::Status FirstError() const;

 private:
  std::vector<std::shared_ptr<TrainerCallback>> callbacks_;
};

// Sets log/evaluate/save/stop from the strategies and step intervals (always installed).
class DefaultFlowCallback : public TrainerCallback {
 public:
  void OnStepEnd(const CallbackContext& c) override;
  void OnEpochEnd(const CallbackContext& c) override;
};

// Stops training after `patience` evaluations in a row without the metric improving by more
// than `threshold` (needs metric_for_best_model, or its "loss" default, and evaluation).
class EarlyStoppingCallback : public TrainerCallback {
 public:
  explicit EarlyStoppingCallback(int patience, double threshold = 0.0)
      : patience_(patience), threshold_(threshold) {}
  void OnEvaluate(const CallbackContext& c, const Metrics& metrics) override;
  int evaluations_without_improvement() const { return bad_evaluations_; }

 private:
  int patience_;
  double threshold_;
  int bad_evaluations_ = 0;
  std::optional<double> best_;
};

}  // namespace cpptrain

#endif  // CPPTRAIN_TRAINER_CALLBACKS_H_
