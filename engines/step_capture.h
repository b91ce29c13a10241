// Capabilities for replaying a training step as a CUDA graph (base/cuda_graph.h): the Trainer
// captures one optimizer step's device work (forward, backward, clipping, the optimizer step)
// once and replays it for later steps of the same shapes, so the host launches one graph per
// step instead of thousands of kernels. A replay runs none of the step's host code, so a part of
// the step may be captured only when everything it does is device work whose launch arguments
// stay the same from step to step, and what does change (a learning rate from the scheduler,
// a parameter written from outside) is moved into device memory before each replay.
//
//   auto* capturable = dynamic_cast<CapturableStep*>(engine);
//   if (capturable != nullptr && capturable->EngineCaptureBlocker().empty()) {
//     CT_RETURN_IF_ERROR(capturable->PrepareForCapture());   // the steps' stream current
//     ... eager steps; once StepCaptureBlocker() is "": PrepareForCapture(),
//     PrepareStepReplay() (outside the graph), capture the step; before each replay:
//     PrepareStepReplay(), Replay(), StepReplayed() ...
//   }
#ifndef CPPTRAIN_ENGINES_STEP_CAPTURE_H_
#define CPPTRAIN_ENGINES_STEP_CAPTURE_H_

#include <string>

#include "absl/status/status.h"

namespace cpptrain {

// An engine whose Backward, ClipGradNorm, OptimizerStep and ZeroGrad can be captured.
class CapturableStep {
 public:
  virtual ~CapturableStep() = default;

  // Why this engine's step can never be captured in this run (its device, fp16 loss scaling, a
  // step that communicates), as a sentence for a log line; "" when it may be.
  virtual std::string EngineCaptureBlocker() = 0;
  // Why the step cannot be captured now ("" when it can): EngineCaptureBlocker's reasons, then
  // those of the moment (the optimizer has not made its state yet, ...).
  virtual std::string StepCaptureBlocker() = 0;
  // With the stream the steps will run on current, before the first of them and again before a
  // capture: the step's backward runs on that stream (autograd runs a gradient accumulator on
  // the stream that was current when it was made, so the engine makes the ones it keeps hooks
  // on again), and the optimizer reads its learning rate from device memory from now on, so
  // eager and replayed steps compute alike.
  virtual absl::Status PrepareForCapture() = 0;
  // Outside the graph, before capturing a step and before every replay: applies what the host
  // changed since the last step to the device state the captured step reads.
  virtual absl::Status PrepareStepReplay() = 0;
  // After each replay (the first one, which runs the captured step, included), on a stream that
  // follows it: e.g. hands the replay's collectives to the communicator's watchdog.
  virtual absl::Status StepReplayed() { return absl::OkStatus(); }
};

// An optimizer whose step() can be captured: it queues device work only, reading the
// hyperparameters that change between steps (the learning rate) from device memory while a
// graph is being captured.
class CapturableOptimizer {
 public:
  virtual ~CapturableOptimizer() = default;

  // Why its next step cannot be captured ("" when it can).
  virtual std::string StepCaptureBlocker() = 0;
  // From now on every step reads the learning rate from the device memory that
  // LoadDeviceHyperparameters fills (an eager step fills it itself), as a captured step does.
  virtual void UseDeviceHyperparameters() = 0;
  // Outside the graph, before a captured step and before every replay: copies the current
  // learning rates into the device memory the captured step reads them from.
  virtual void LoadDeviceHyperparameters() = 0;
};

}  // namespace cpptrain

#endif  // CPPTRAIN_ENGINES_STEP_CAPTURE_H_
