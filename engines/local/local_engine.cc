#include "engines/local/local_engine.h"

#include <algorithm>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include <torch/cuda.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status.h"
#include "base/torch_compat.h"
#include "base/torch_status.h"
#include "engines/grad_utils.h"
#include "engines/gradient_scaling.h"
#include "engines/master_optimizer.h"
#include "engines/stepped_parameters.h"
#include "engines/wrapping_optimizer.h"
#include "module/deferred.h"
#include "sharding/local_device.h"

namespace cpptrain {
namespace {

class AutocastScope : public ForwardScope {
 public:
  AutocastScope(at::DeviceType device_type, at::ScalarType dtype) : guard_(device_type, dtype) {}

 private:
  AutocastGuard guard_;
};

absl::StatusOr<c10::Device> ResolveDevice(const std::string& spec) {
  if (spec == "auto") {
    if (!torch::cuda::is_available()) return c10::Device(c10::kCPU);
    CT_ASSIGN_OR_RETURN(const LocalDevice local,
                        LocalDeviceFromEnvironment(static_cast<int>(torch::cuda::device_count())));
    return c10::Device(c10::kCUDA, local.cuda_index);
  }
  auto device = CatchTorch([&] { return c10::Device(spec); });
  if (!device.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("local.device is \"", spec,
                     "\", which is not a device: use \"auto\", \"cpu\" or \"cuda:N\""));
  }
  if (device->is_cuda() && !torch::cuda::is_available()) {
    return absl::InvalidArgumentError(
        absl::StrCat("local.device is \"", spec,
                     "\" but this LibTorch build or machine has no CUDA: use \"cpu\""));
  }
  return *device;
}

}  // namespace

absl::StatusOr<std::unique_ptr<LocalEngine>> LocalEngine::Create(
    const proto::LocalEngineConfig& config, MixedPrecision precision) {
  CT_ASSIGN_OR_RETURN(c10::Device device, ResolveDevice(config.device()));
  if (precision == MixedPrecision::kFp16 && !device.is_cuda()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fp16 is true but the engine runs on ", device.str(),
        ", where LibTorch has no fp16 autocast: use bf16 on the CPU, or a CUDA device"));
  }
  return std::unique_ptr<LocalEngine>(
      new LocalEngine(device, precision, config.bf16_working_copies()));
}

LocalEngine::LocalEngine(c10::Device device, MixedPrecision precision, bool bf16_working_copies)
    : device_(device), precision_(precision), bf16_working_copies_(bf16_working_copies) {
  if (precision_ == MixedPrecision::kFp16) scaler_.emplace();
}

absl::Status LocalEngine::PrepareForInference(std::shared_ptr<TrainableModel> model) {
  if (model_ == model) return absl::OkStatus();
  if (model->sharding() != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model was sharded at load time (FullyShard) but the ", name(),
        " engine needs the whole model on every rank: use the FSDP2 engine (fsdp { version: 2 },"
        " or no engine in the training arguments, which adopts the shards)"));
  }
  if (const std::string deferred = FirstDeferredParameter(*model); !deferred.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parameter ", deferred, " is deferred (the model was built with DecoderInit kDeferred, "
        "no memory behind it) and the ", name(), " engine needs the whole model on every rank: "
        "use the FSDP2 engine (fsdp { version: 2 }), which initializes each rank's chunks, or "
        "build the model with kRowSeeded or kGlobalGenerator"));
  }
  CT_RETURN_IF_ERROR(CatchTorch([&] { model->to(device_); }));
  model_ = std::move(model);
  return absl::OkStatus();
}

absl::Status LocalEngine::PrepareForTraining(std::shared_ptr<TrainableModel> model,
                                             const OptimizerFactory& factory) {
  CT_RETURN_IF_ERROR(PrepareForInference(std::move(model)));
  if (optimizer_ != nullptr) return absl::OkStatus();
  if (working_ == nullptr && WantsWorkingCopies()) {
    std::vector<int> order;  // registration order, each adjacent set kept together
    for (const std::vector<int>& unit : FlatUnits(/*reversed=*/false)) {
      order.insert(order.end(), unit.begin(), unit.end());
    }
    CT_RETURN_IF_ERROR(MakeWorkingCopies(std::move(order), /*flat_gradients=*/false, nullptr));
  }
  if (working_ == nullptr) {
    CT_ASSIGN_OR_RETURN(optimizer_, factory(UniqueTrainableParameters(*model_)));
    return absl::OkStatus();
  }
  CT_ASSIGN_OR_RETURN(std::unique_ptr<torch::optim::Optimizer> inner, factory(working_->masters()));
  std::vector<std::pair<at::Tensor, at::Tensor>> masters;
  for (size_t i = 0; i < working_->masters().size(); ++i) {
    masters.emplace_back(working_->parameters()[i], working_->masters()[i].second);
  }
  optimizer_ = std::make_unique<MasterOptimizer>(std::move(inner), masters);
  auto* scaling = dynamic_cast<ScalesGradientsInStep*>(optimizer_.get());
  working_->KeepBf16Gradients(scaling != nullptr && scaling->ReadsBf16Gradients());
  return absl::OkStatus();
}

bool LocalEngine::WantsWorkingCopies() const {
  if (!bf16_working_copies_ || precision_ != MixedPrecision::kBf16) return false;
  for (const auto& [name, param] : UniqueTrainableParameters(*model_)) {
    if (param.scalar_type() != at::kFloat) return false;
  }
  return true;
}

std::vector<std::vector<int>> LocalEngine::FlatUnits(bool reversed) const {
  std::vector<std::string> names;
  for (const auto& [name, param] : UniqueTrainableParameters(*model_)) names.push_back(name);
  return FlatOrderUnits(names, model_->AdjacentParameterGroups(), reversed);
}

absl::Status LocalEngine::MakeWorkingCopies(std::vector<int> order, bool flat_gradients,
                                            std::function<void(int)> after_move) {
  CT_ASSIGN_OR_RETURN(auto working, CatchTorch([&] {
                        return WorkingParameters::Create(UniqueTrainableParameters(*model_),
                                                         std::move(order), flat_gradients);
                      }));
  CT_ASSIGN_OR_RETURN(working_, std::move(working));
  CT_RETURN_IF_ERROR(CatchTorch([&] { working_->InstallHooks(std::move(after_move)); }));
  CT_LOG_RANK0(INFO) << name() << ": bf16 working copies of " << working_->masters().size()
                     << " fp32 parameters";
  return absl::OkStatus();
}

absl::Status LocalEngine::ExposeMasterWeights() {
  if (working_ == nullptr) return absl::OkStatus();
  if (working_->exposed()) {
    return absl::FailedPreconditionError(
        "ExposeMasterWeights called twice: call RestoreWorkingWeights after each one");
  }
  return CatchTorch([&] { working_->Expose(); });
}

absl::Status LocalEngine::RestoreWorkingWeights() {
  if (working_ == nullptr) return absl::OkStatus();
  return CatchTorch([&] { working_->Restore(); });
}

std::unique_ptr<ForwardScope> LocalEngine::EnterForward() {
  switch (precision_) {
    case MixedPrecision::kBf16:
      return std::make_unique<AutocastScope>(device_.type(), at::kBFloat16);
    case MixedPrecision::kFp16:
      return std::make_unique<AutocastScope>(device_.type(), at::kHalf);
    case MixedPrecision::kNone:
      break;
  }
  return std::make_unique<ForwardScope>();
}

absl::Status LocalEngine::Backward(const torch::Tensor& loss) {
  grads_unscaled_ = false;
  return CatchTorch([&] {
    if (scaler_) {
      (loss.to(at::kFloat) * scaler_->scale()).backward();
    } else {
      loss.backward();
    }
  });
}

absl::Status LocalEngine::UnscaleOnce() {
  if (!scaler_ || grads_unscaled_) return absl::OkStatus();
  CT_ASSIGN_OR_RETURN(grads_finite_,
                      AllRanksFinite(scaler_->UnscaleAndCheck(Gradients(*optimizer_))));
  grads_unscaled_ = true;
  return absl::OkStatus();
}

absl::StatusOr<torch::Tensor> LocalEngine::ClipGradNorm(double max_norm) {
  if (optimizer_ == nullptr) {
    return absl::FailedPreconditionError("ClipGradNorm before PrepareForTraining");
  }
  CT_RETURN_IF_ERROR(UnscaleOnce());
  std::vector<torch::Tensor> grads = Gradients(*optimizer_);
  return CatchTorch([&] {
    torch::Tensor norm = GlobalNorm(grads);
    if (max_norm > 0) ClipOrDefer(grads, ClipCoefficient(norm, max_norm));
    return norm;
  });
}

// With an optimizer that can scale the gradients as its step reads them, the coefficient goes
// there (no pass of its own over them); otherwise ScaleGradients. Clipping again replaces it.
void LocalEngine::ClipOrDefer(const std::vector<torch::Tensor>& grads,
                              const torch::Tensor& coefficient) {
  auto* scaling = dynamic_cast<ScalesGradientsInStep*>(optimizer_.get());
  if (scaling != nullptr && scaling->ScaleGradientsInNextStep(coefficient)) return;
  ScaleGradients(grads, coefficient);
}

absl::StatusOr<bool> LocalEngine::OptimizerStep() {
  if (optimizer_ == nullptr) {
    return absl::FailedPreconditionError("OptimizerStep before PrepareForTraining");
  }
  if (scaler_) {
    CT_RETURN_IF_ERROR(UnscaleOnce());
    grads_unscaled_ = false;
    scaler_->Update(grads_finite_);
    if (!grads_finite_) {
      LOG(WARNING) << "fp16 gradients overflowed: step skipped, loss scale now "
                   << scaler_->scale();
      return false;
    }
  }
  CT_RETURN_IF_ERROR(CatchTorch([&] {
    if (working_ != nullptr) working_->AdoptWrittenWorkingCopies();
    std::unordered_set<const c10::TensorImpl*> written;
    const bool asked = CopiesWrittenInStep(written);
    optimizer_->step();
    if (working_ == nullptr) return;
    // Every master's copy handed out, or the rounding pass after all (an optimizer stepping
    // other tensors than the masters would otherwise leave the working copies stale).
    if (asked && written.size() == working_->masters().size()) {
      working_->MarkRefreshed();
    } else {
      working_->Refresh();
    }
  }));
  return true;
}

bool LocalEngine::CopiesWrittenInStep(std::unordered_set<const c10::TensorImpl*>& written) {
  if (working_ == nullptr || working_->exposed()) return false;
  auto* wrapper = dynamic_cast<WrappingOptimizer*>(optimizer_.get());
  auto* writes =
      wrapper != nullptr ? dynamic_cast<ReportsSteppedParameters*>(&wrapper->inner()) : nullptr;
  if (writes == nullptr) return false;
  const WorkingParameters* working = working_.get();
  return writes->WriteBf16CopiesInNextStep([working, &written](const at::Tensor& master) {
    at::Tensor copy = working->WorkingCopyOf(master);
    if (copy.defined()) written.insert(master.unsafeGetTensorImpl());
    return copy;
  });
}

std::string LocalEngine::EngineCaptureBlocker() {
  if (!device_.is_cuda()) return absl::StrCat("the engine runs on ", device_.str());
  if (scaler_) return "fp16 loss scaling decides on the host whether to step";
  return "";
}

std::string LocalEngine::StepCaptureBlocker() {
  if (std::string engine = EngineCaptureBlocker(); !engine.empty()) return engine;
  if (optimizer_ == nullptr) return "PrepareForTraining has not run";
  if (working_ != nullptr && working_->exposed()) return "the fp32 masters are exposed";
  auto* capturable = dynamic_cast<CapturableOptimizer*>(optimizer_.get());
  if (capturable == nullptr) {
    return "the optimizer has no capturable step (fused AdamW on CUDA parameters has)";
  }
  return capturable->StepCaptureBlocker();
}

absl::Status LocalEngine::PrepareForCapture() {
  if (optimizer_ == nullptr) {
    return absl::FailedPreconditionError("PrepareForCapture before PrepareForTraining");
  }
  if (working_ != nullptr) {
    CT_ASSIGN_OR_RETURN(const bool remade,
                        CatchTorch([&] { return working_->RemakeAccumulators(); }));
    if (!remade) {
      return absl::FailedPreconditionError(
          "the gradient accumulators of the bf16 working copies are held elsewhere (a graph of "
          "an unfinished backward?), so they cannot be made again on the capturing stream");
    }
  }
  if (auto* capturable = dynamic_cast<CapturableOptimizer*>(optimizer_.get())) {
    capturable->UseDeviceHyperparameters();
  }
  return absl::OkStatus();
}

// What a replay cannot do itself: adopt working copies written from outside since the last step
// (a captured step would otherwise never see them, and capturing one that adopts would adopt
// them again at every replay), and load the learning rate the Trainer set.
absl::Status LocalEngine::PrepareStepReplay() {
  const std::string blocker = StepCaptureBlocker();
  if (!blocker.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(name(), ": the step cannot be captured as a CUDA graph: ", blocker));
  }
  return CatchTorch([&] {
    if (working_ != nullptr) working_->AdoptWrittenWorkingCopies();
    dynamic_cast<CapturableOptimizer&>(*optimizer_).LoadDeviceHyperparameters();
  });
}

void LocalEngine::CancelPendingClip() {
  if (auto* scaling = dynamic_cast<ScalesGradientsInStep*>(optimizer_.get())) {
    scaling->ScaleGradientsInNextStep(torch::Tensor());
  }
}

void LocalEngine::ZeroGrad() {
  if (optimizer_ != nullptr) ClearGradients(*optimizer_);
  CancelPendingClip();  // a clip whose step was skipped
  if (working_ != nullptr) working_->BeginAccumulation();
}

void LocalEngine::ResetOptimizer() {
  optimizer_.reset();
  if (scaler_) scaler_.emplace();
  grads_unscaled_ = false;
  grads_finite_ = true;
}

absl::StatusOr<torch::Tensor> LocalEngine::AllReduceSum(const torch::Tensor& values) {
  return values;
}

absl::StatusOr<torch::Tensor> LocalEngine::AllGather(const torch::Tensor& values) {
  return values;
}

}  // namespace cpptrain
