// An optimizer whose next step can report each parameter as soon as it holds its new value,
// walking the parameters in the order of their addresses, so that the caller moves what is done
// while the rest is stepped. ZeRO-Offload copies each bucket of its host masters to the device
// this way while the CPU AdamW steps the next bucket (trainer/optimizer.h's FusedAdamW reports on
// its CPU kernel path):
//
//   auto* reports = dynamic_cast<ReportsSteppedParameters*>(&optimizer);
//   const bool reported = reports != nullptr && reports->ReportEachParameterInNextStep(
//       [&](const at::Tensor& param) { ... param's new value is final ... });
//   optimizer.step();   // if `reported`: the callback saw every parameter of every group once
//
// A parameter with no gradient is reported too (unchanged). The callback runs on the thread
// that called step(), between parameters, never inside a parallel region; what it throws comes
// out of step(), and leaves the parameters before it stepped and the rest not (nothing stays
// pending for a later step). The same step can also leave each new value rounded to bf16 in a
// tensor the caller names (or none: an undefined tensor), in the pass that computes it
// (ZeRO-Offload's bf16 working copies):
//
//   reports->WriteBf16CopiesInNextStep([&](const at::Tensor& param) { return copy_of(param); });
#ifndef CPPTRAIN_ENGINES_STEPPED_PARAMETERS_H_
#define CPPTRAIN_ENGINES_STEPPED_PARAMETERS_H_

#include <ATen/core/Tensor.h>

#include <functional>

namespace cpptrain {

class ReportsSteppedParameters {
 public:
  using Callback = std::function<void(const at::Tensor& param)>;
  virtual ~ReportsSteppedParameters() = default;

  // For the next step() only. False when that step cannot report for the current parameters
  // (then nothing is pending and the step runs as usual).
  virtual bool ReportEachParameterInNextStep(Callback callback) = 0;

  using Bf16CopyOf = std::function<at::Tensor(const at::Tensor& param)>;
  // For the next step() too: each parameter's new value also goes into copy_of(param), rounded
  // to nearest even, where that is defined (a contiguous bf16 tensor on the parameter's device,
  // of its numel; a parameter with no gradient is copied as it is). False when that step cannot
  // (then nothing is pending).
  virtual bool WriteBf16CopiesInNextStep(Bf16CopyOf copy_of) = 0;
};

}  // namespace cpptrain

#endif  // CPPTRAIN_ENGINES_STEPPED_PARAMETERS_H_
