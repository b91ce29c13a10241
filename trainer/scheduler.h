// Learning-rate schedules with Hugging Face's names and formulas. Each step-based schedule is
// a multiplier of the peak learning rate as a function of the number of optimizer steps taken
// (LambdaLR semantics: the lr for the first update is peak * Multiplier(0)).
// ReduceLROnPlateau is stepped after each evaluation with the monitored metric instead.
//
//   CT_ASSIGN_OR_RETURN(auto schedule, LrSchedule::Create(args, /*total_steps=*/1000));
//   for (int64_t step = 0; ...; ++step) SetLearningRate(optimizer, schedule->LearningRate(step));
#ifndef CPPTRAIN_TRAINER_SCHEDULER_H_
#define CPPTRAIN_TRAINER_SCHEDULER_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "proto/training_args.pb.h"

namespace cpptrain {

class LrSchedule {
 public:
  // Resolves warm-up (count or ratio of total_steps) and the scheduler kwargs; errors name
  // the field, the value and the fix.
  static absl::StatusOr<std::unique_ptr<LrSchedule>> Create(const proto::TrainingArguments& args,
                                                            int64_t total_steps);

  // Multiplier of the peak learning rate after `step` optimizer steps.
  double Multiplier(int64_t step) const;
  double LearningRate(int64_t step) const { return peak_lr_ * Multiplier(step); }

  int64_t warmup_steps() const { return warmup_; }
  bool is_plateau() const { return type_ == proto::TrainingArguments::REDUCE_LR_ON_PLATEAU; }

 private:
  LrSchedule() = default;

  proto::TrainingArguments::SchedulerType type_ = proto::TrainingArguments::LINEAR;
  proto::SchedulerKwargs kwargs_;
  double peak_lr_ = 0;
  int64_t total_ = 0;
  int64_t warmup_ = 0;
  double num_cycles_ = 0.5;
  double min_lr_rate_ = 0;
  int64_t stable_steps_ = 0;
  int64_t decay_steps_ = 0;
};

// torch.optim.lr_scheduler.ReduceLROnPlateau: after `patience` evaluations without an
// improvement beyond `threshold`, multiplies the learning rate by `factor` (not below
// min_lr), then waits `cooldown` evaluations.
class ReduceLrOnPlateau {
 public:
  ReduceLrOnPlateau(const proto::SchedulerKwargs& kwargs, double initial_lr);

  // Records one evaluation's metric; returns the learning rate to use from now on.
  double Step(double metric);
  double learning_rate() const { return lr_; }

  struct State {
    double lr;
    double best;
    int64_t bad_evaluations;
    int64_t cooldown_left;
  };
  State state() const { return {lr_, best_, bad_evaluations_, cooldown_left_}; }
  void Restore(const State& state);

 private:
  bool IsBetter(double metric) const;

  proto::SchedulerKwargs kwargs_;
  double lr_;
  double best_;
  int64_t bad_evaluations_ = 0;
  int64_t cooldown_left_ = 0;
};

}  // namespace cpptrain

#endif  // CPPTRAIN_TRAINER_SCHEDULER_H_
