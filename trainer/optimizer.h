// AdamW with Hugging Face's two parameter groups: weight decay for matrices, none for biases
// and normalization weights (matched by name, like get_decay_parameter_names).
//
//   OptimizerFactory factory = MakeAdamWFactory(args);
//   CT_RETURN_IF_ERROR(engine->PrepareForTraining(model, factory));
//   SetLearningRate(*engine->optimizer(), 1e-4);
#ifndef CPPTRAIN_TRAINER_OPTIMIZER_H_
#define CPPTRAIN_TRAINER_OPTIMIZER_H_

#include <torch/optim/adamw.h>

#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "checkpoint/optimizer_state.h"
#include "engines/engine.h"
#include "engines/gradient_scaling.h"
#include "engines/step_capture.h"
#include "engines/stepped_parameters.h"
#include "kernels/cpu_adamw.h"
#include "proto/training_args.pb.h"

namespace cpptrain {

// True for names containing "bias", "layernorm" or "rmsnorm", a path component "norm", or a
// component ending in "_norm" (model.norm.weight, self_attn.q_norm.weight, ...).
bool ExcludedFromWeightDecay(const std::string& parameter_name);

// AdamW (learning_rate, adam_beta1/2, adam_epsilon, weight_decay) over the parameters it is
// given; group 0 decays, group 1 does not. Empty groups are left out. On CUDA parameters each
// step is one fused kernel per group where LibTorch has it (2.x); elsewhere LibTorch's AdamW.
OptimizerFactory MakeAdamWFactory(const proto::TrainingArguments& args);

// torch::optim::AdamW whose step runs PyTorch's fused AdamW kernel when every parameter is a
// CUDA tensor and the kernel exists; kernels/cpu_adamw.h (multithreaded, vectorized, bitwise
// equal to LibTorch 1.13's, a few ulp of the update from 2.x's) when every parameter is a dense contiguous
// fp32 CPU tensor with an fp32 or bf16 gradient and amsgrad is off; the per-parameter AdamW
// otherwise (same arithmetic). On the CPU kernel's and the fused kernel's paths it also takes a
// clipping coefficient into the step (engines/gradient_scaling.h) instead of a pass over the
// gradients: the CPU kernel multiplies (bitwise what mul_ would leave), the fused CUDA kernel
// divides by the coefficient's reciprocal, a device scalar formed on the device from the
// coefficient's tensor (within a rounding of mul_; no host sync).
//
// Its fused CUDA step can be captured in a CUDA graph (engines/step_capture.h): while the current
// stream is being captured, and for every step after UseDeviceHyperparameters, it reads each
// group's learning rate from an fp32 device scalar, which an eager step fills from the group's
// options itself and LoadDeviceHyperparameters fills before a capture and each replay (betas,
// eps and weight decay are captured as they are).
//
// Where this build has the CUDA kernels (kernels/cuda_adamw.h), the CUDA step reads bf16
// gradients of its fp32 parameters as they are (ReadsBf16Gradients: an engine need not widen
// them), multiplies by the clip coefficient in its pass, and writes bf16 copies of the new values
// when asked (WriteBf16CopiesInNextStep): that kernel steps a group whenever one of these is in
// play, PyTorch's fused kernel otherwise.
class FusedAdamW : public torch::optim::AdamW,
                   public CheckpointableOptimizer,
                   public ScalesGradientsInStep,
                   public ReportsSteppedParameters,
                   public CapturableOptimizer {
 public:
  using torch::optim::AdamW::AdamW;
  torch::Tensor step(LossClosure closure = nullptr) override;

  // True (and pending until the next step) where that step runs the CPU kernel or the fused
  // CUDA kernel and every gradient is fp32.
  bool ScaleGradientsInNextStep(const at::Tensor& scale) override;
  // True (and pending until the next step) where that step runs the CPU kernel, which then
  // steps the parameters in the order of their addresses and reports each, or writes the bf16
  // copies in the kernel's pass.
  bool ReportEachParameterInNextStep(Callback callback) override;
  bool WriteBf16CopiesInNextStep(Bf16CopyOf copy_of) override;
  // True where every parameter is an fp32 CUDA tensor, the CUDA kernels are built, this
  // LibTorch has the fused kernel's device learning rate (2.x) and amsgrad is off.
  bool ReadsBf16Gradients() override;

  // "" once every parameter is on CUDA, the fused kernel has stepped them (its state exists)
  // and this LibTorch reads a device learning rate.
  std::string StepCaptureBlocker() override;
  void UseDeviceHyperparameters() override { device_lr_always_ = true; }
  void LoadDeviceHyperparameters() override;

  // Off: CPU parameters step through torch::optim::AdamW (for comparing the two paths).
  void UseCpuKernel(bool on) { cpu_kernel_ = on; }

  // exp_avg, exp_avg_sq and step, from whichever path (fused or per-parameter) holds them.
  std::map<std::string, at::Tensor> ExportState(const at::Tensor& param) override;
  absl::Status ImportState(const at::Tensor& param,
                           const std::map<std::string, at::Tensor>& state) override;

 private:
  struct State {
    torch::Tensor exp_avg, exp_avg_sq, step;
  };
  // Every group's parameters, gradients and state fit kernels/cpu_adamw.h.
  bool CpuKernelApplies();
  // One step of every group through the CPU kernel, the state in torch::optim::AdamW's map
  // (so ExportState/ImportState and AdamW's own serialization see it unchanged).
  void CpuKernelStep();
  void CpuKernelStepOne(torch::Tensor& param, const kernels::AdamWHyper& hyper,
                        const Bf16CopyOf& copy_of);

  // Every parameter is on the CPU and the CPU kernel applies.
  bool UsesCpuKernel();
  // Every parameter is on CUDA and the fused kernel has not been found missing.
  bool UsesFusedCudaKernel();
  // The fused path's step over every group, each gradient read as gradient * scale (none when
  // `scale` is undefined). False where this LibTorch has no fused kernel.
  bool FusedCudaStep(const torch::Tensor& scale, const Bf16CopyOf& copy_of);
  // Group g's step through kernels/cuda_adamw.h (copy_of may be null).
  void OwnCudaStep(size_t g, const std::vector<torch::Tensor>& params, const torch::Tensor& scale,
                   const Bf16CopyOf& copy_of);
  bool AnyAmsgrad();
  // p has no gradient, one of its dtype, or a bf16 one where `reads_bf16`.
  static bool ReadableGradient(const torch::Tensor& p, bool reads_bf16);

  torch::Tensor grad_scale_;  // ScaleGradientsInNextStep's, for the next CPU or fused step
  Callback report_;          // ReportEachParameterInNextStep's, for the next CPU kernel step
  Bf16CopyOf bf16_copy_of_;  // WriteBf16CopiesInNextStep's, likewise
  bool fused_ = true;        // until a step finds it unavailable
  // Group g's learning rate as an fp32 scalar on `device`, filled from its options.
  const torch::Tensor& FilledDeviceLr(size_t g, const c10::Device& device);
  // The device learning rate group g's fused step over `params` reads: while a graph captures
  // it, or after UseDeviceHyperparameters; undefined otherwise (the double in its options).
  torch::Tensor StepDeviceLr(size_t g, const std::vector<torch::Tensor>& params);

  // Per group, the fp32 learning rate on the parameters' device that the device-lr kernel reads.
  std::vector<torch::Tensor> device_lr_;
  bool device_lr_always_ = false;  // UseDeviceHyperparameters
  bool cpu_kernel_ = true;
  std::unordered_map<const c10::TensorImpl*, State> state_;
};

// Sets the learning rate of every parameter group of an Adam, AdamW or SGD optimizer.
void SetLearningRate(torch::optim::Optimizer& optimizer, double lr);

}  // namespace cpptrain

#endif  // CPPTRAIN_TRAINER_OPTIMIZER_H_
