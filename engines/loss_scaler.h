// Dynamic loss scaling for fp16 training, owned by an engine: the loss is multiplied by the
// scale before backward, gradients are divided by it before clipping, and a step whose
// gradients hold an inf or NaN is skipped and halves the scale. After `growth_interval`
// clean steps in a row the scale doubles.
//
//   LossScaler scaler;                        // 2^16, x2 after 2000 clean steps, x0.5
//   (loss * scaler.scale()).backward();
//   bool finite = scaler.UnscaleAndCheck(grads);    // combine across ranks before Update
//   scaler.Update(finite);
//   if (finite) optimizer.step();
#ifndef CPPTRAIN_ENGINES_LOSS_SCALER_H_
#define CPPTRAIN_ENGINES_LOSS_SCALER_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace cpptrain {

struct LossScalerOptions {
  double initial_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  // DeepSpeed's hysteresis: overflows tolerated before the scale backs off (1: at the first).
  // Reset to this after growth_interval clean steps.
  int hysteresis = 1;
  // The scale never backs off below this (DeepSpeed's min_loss_scale).
  double min_scale = 0;
};

class LossScaler {
 public:
  explicit LossScaler(LossScalerOptions options = {});

  double scale() const { return scale_; }
  int64_t clean_steps() const { return clean_steps_; }

  // Divides every defined gradient by the scale in place. Returns whether all of them are
  // finite on this rank (one host sync).
  bool UnscaleAndCheck(const std::vector<at::Tensor>& grads) const;

  // Records the outcome of one step, with `finite` already combined across ranks.
  void Update(bool finite);

  // For checkpoints.
  void Restore(double scale, int64_t clean_steps);

 private:
  LossScalerOptions options_;
  double scale_;
  int64_t clean_steps_ = 0;
  int hysteresis_left_;
};

}  // namespace cpptrain

#endif  // CPPTRAIN_ENGINES_LOSS_SCALER_H_
