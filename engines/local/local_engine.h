// One process on the CPU or one CUDA device: the reference every other engine must match.
// Under bf16 (with local.bf16_working_copies, the default) the forward reads bf16 working
// copies of the fp32 parameters, refreshed after each optimizer step, and the optimizer steps
// the fp32 masters (engines/working_parameters.h); checkpoints see the masters. On CUDA without
// fp16, with an optimizer whose step can be captured, its step can be captured as a CUDA graph
// (engines/step_capture.h); the engines built on it that communicate say they cannot.
//
//   CT_ASSIGN_OR_RETURN(auto engine, LocalEngine::Create(config, MixedPrecision::kBf16));
//   CT_RETURN_IF_ERROR(engine->PrepareForTraining(model, factory));
#ifndef CPPTRAIN_ENGINES_LOCAL_LOCAL_ENGINE_H_
#define CPPTRAIN_ENGINES_LOCAL_LOCAL_ENGINE_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "absl/status/statusor.h"
#include "engines/engine.h"
#include "engines/loss_scaler.h"
#include "engines/mixed_precision.h"
#include "engines/step_capture.h"
#include "engines/working_parameters.h"
#include "proto/engines.pb.h"

namespace cpptrain {

class LocalEngine : public Engine, public CapturableStep {
 public:
  // Resolves the device ("auto": with CUDA, the GPU of this process's local rank as
  // sharding/local_device.h picks it; else cpu) and checks that the precision can run there
  // (fp16 autocast needs CUDA).
  static absl::StatusOr<std::unique_ptr<LocalEngine>> Create(
      const proto::LocalEngineConfig& config, MixedPrecision precision);

  std::string name() const override { return "local"; }
  c10::Device device() const override { return device_; }
  int rank() const override { return 0; }
  int world_size() const override { return 1; }

  absl::Status PrepareForInference(std::shared_ptr<TrainableModel> model) override;
  absl::Status PrepareForTraining(std::shared_ptr<TrainableModel> model,
                                  const OptimizerFactory& factory) override;
  std::unique_ptr<ForwardScope> EnterForward() override;
  absl::Status Backward(const torch::Tensor& loss) override;
  void SetGradientSync(bool enabled) override {}
  absl::StatusOr<torch::Tensor> ClipGradNorm(double max_norm) override;
  absl::StatusOr<bool> OptimizerStep() override;
  void ZeroGrad() override;
  void ResetOptimizer() override;
  torch::optim::Optimizer* optimizer() override { return optimizer_.get(); }
  absl::StatusOr<torch::Tensor> AllReduceSum(const torch::Tensor& values) override;
  absl::StatusOr<torch::Tensor> AllGather(const torch::Tensor& values) override;

  // Under bf16 with working copies: the parameters become the fp32 masters and back.
  absl::Status ExposeMasterWeights() override;
  absl::Status RestoreWorkingWeights() override;

  // Present with fp16 only.
  LossScaler* loss_scaler() override { return scaler_ ? &*scaler_ : nullptr; }

  // CapturableStep. Engines derived from this one that communicate or reshard in their step
  // override EngineCaptureBlocker with their reason.
  std::string EngineCaptureBlocker() override;
  std::string StepCaptureBlocker() override;
  absl::Status PrepareForCapture() override;
  absl::Status PrepareStepReplay() override;

  // Whether every rank's gradients are finite, given this rank's answer (fp16 only): an
  // overflow on any rank skips the step on all of them.
  virtual absl::StatusOr<bool> AllRanksFinite(bool local_finite) { return local_finite; }

 protected:
  // For engines that replicate the model (DDP): the same placement, precision and step.
  LocalEngine(c10::Device device, MixedPrecision precision, bool bf16_working_copies = false);
  // Whether PrepareForTraining keeps bf16 working copies: bf16, asked for, and every trainable
  // parameter fp32 (a model built in bf16 has nothing to copy).
  bool WantsWorkingCopies() const;
  // The trainable parameters (UniqueTrainableParameters' indices) in units of the flat order:
  // FlatOrderUnits of the model's AdjacentParameterGroups, walked forward or `reversed`.
  std::vector<std::vector<int>> FlatUnits(bool reversed) const;
  // Makes the working copies in `order` (WorkingParameters::Create) and installs their hooks.
  absl::Status MakeWorkingCopies(std::vector<int> order, bool flat_gradients,
                                 std::function<void(int)> after_move);
  // Asks the optimizer (the one MasterOptimizer wraps) to write the working copies in its next
  // step (engines/stepped_parameters.h); whether it will. `written` collects the masters whose
  // copy it was handed (it must outlive that step).
  bool CopiesWrittenInStep(std::unordered_set<const c10::TensorImpl*>& written);
  // Unscales (fp16) once per step and records whether the step may proceed.
  absl::Status UnscaleOnce();
  // Scales `grads` by `coefficient` (a 0-dim tensor from ClipCoefficient), or hands it to the
  // optimizer's next step where it can take it; nothing reads it on the host.
  void ClipOrDefer(const std::vector<torch::Tensor>& grads, const torch::Tensor& coefficient);
  // Drops a clip coefficient handed to the optimizer's next step (ZeroGrad after a skipped step).
  void CancelPendingClip();

  c10::Device device_;
  MixedPrecision precision_;
  std::optional<LossScaler> scaler_;
  std::shared_ptr<TrainableModel> model_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  bool bf16_working_copies_ = false;
  std::unique_ptr<WorkingParameters> working_;  // null without working copies
  // Set by ClipGradNorm on fp16 so OptimizerStep does not unscale twice.
  bool grads_unscaled_ = false;
  bool grads_finite_ = true;
};

}  // namespace cpptrain

#endif  // CPPTRAIN_ENGINES_LOCAL_LOCAL_ENGINE_H_
