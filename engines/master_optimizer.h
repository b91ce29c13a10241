// The optimizer the local and DDP engines hand out when they train bf16 working copies
// (engines/working_parameters.h): the real one, built by the Trainer's factory, steps the fp32
// masters; this wrapper is what the Trainer, its callbacks and the checkpointer see. Its
// parameter groups are the inner optimizer's (the masters; engines/wrapping_optimizer.h), a
// model parameter's optimizer state is its master's
// (StepsStandIns: checkpoints are the ones an fp32 run writes), and a clip coefficient, whether
// bf16 gradients are read as they are (engines/gradient_scaling.h) and the step's capture
// (engines/step_capture.h) pass through to the inner optimizer.
//
//   auto wrapped = std::make_unique<MasterOptimizer>(std::move(inner), {{param, master}, ...});
//   SetLearningRate(*wrapped, lr);   // reaches the inner optimizer at the next step()
//   wrapped->step();
#ifndef CPPTRAIN_ENGINES_MASTER_OPTIMIZER_H_
#define CPPTRAIN_ENGINES_MASTER_OPTIMIZER_H_

#include <torch/optim/optimizer.h>

#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engines/gradient_scaling.h"
#include "engines/step_capture.h"
#include "engines/wrapping_optimizer.h"
#include "module/checkpointable_optimizer.h"

namespace cpptrain {

class MasterOptimizer : public WrappingOptimizer,
                        public StepsStandIns,
                        public ScalesGradientsInStep,
                        public CapturableOptimizer {
 public:
  // Each pair is a model parameter and the master `inner` steps for it.
  MasterOptimizer(std::unique_ptr<torch::optim::Optimizer> inner,
                  const std::vector<std::pair<at::Tensor, at::Tensor>>& masters);

  StandIn StandInFor(const at::Tensor& param) override;
  // False when the inner optimizer cannot take it.
  bool ScaleGradientsInNextStep(const at::Tensor& scale) override;
  bool ReadsBf16Gradients() override;
  // The inner optimizer's answers; not capturable when it is not.
  std::string StepCaptureBlocker() override;
  void UseDeviceHyperparameters() override;
  void LoadDeviceHyperparameters() override;

 private:
  std::unordered_map<const c10::TensorImpl*, at::Tensor> master_of_;
};

}  // namespace cpptrain

#endif  // CPPTRAIN_ENGINES_MASTER_OPTIMIZER_H_
