#include "trainer/optimizer.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <functional>
#include <regex>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/cuda_graph.h"
#include "base/torch_compat.h"
#include "base/torch_status.h"
#include "kernels/cpu_adamw.h"
#include "kernels/cuda_adamw.h"

namespace cpptrain {

bool ExcludedFromWeightDecay(const std::string& parameter_name) {
  static const std::regex kNormComponent(R"((^|\.)norm($|\.)|_norm($|\.))");
  const std::string name = absl::AsciiStrToLower(parameter_name);
  return absl::StrContains(name, "bias") || absl::StrContains(name, "layernorm") ||
         absl::StrContains(name, "rmsnorm") || std::regex_search(name, kNormComponent);
}

OptimizerFactory MakeAdamWFactory(const proto::TrainingArguments& args) {
  return [args](const NamedParameters& params)
             -> absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> {
    std::vector<torch::Tensor> decay, no_decay;
    for (const auto& [name, param] : params) {
      (ExcludedFromWeightDecay(name) ? no_decay : decay).push_back(param);
    }
    auto options = [&](double weight_decay) {
      return std::make_unique<torch::optim::AdamWOptions>(
          torch::optim::AdamWOptions(args.learning_rate())
              .betas({args.adam_beta1(), args.adam_beta2()})
              .eps(args.adam_epsilon())
              .weight_decay(weight_decay));
    };
    std::vector<torch::optim::OptimizerParamGroup> groups;
    if (!decay.empty()) groups.emplace_back(decay, options(args.weight_decay()));
    if (!no_decay.empty()) groups.emplace_back(no_decay, options(0.0));
    return std::unique_ptr<torch::optim::Optimizer>(
        std::make_unique<FusedAdamW>(groups, *options(args.weight_decay())));
  };
}

namespace {

bool DenseContiguousCpu(const torch::Tensor& t, int64_t numel) {
  return t.device().is_cpu() && t.layout() == torch::kStrided && t.is_contiguous() &&
         t.numel() == numel;
}

}  // namespace

bool FusedAdamW::CpuKernelApplies() {
  if (AnyAmsgrad()) return false;
  for (const auto& group : param_groups()) {
    for (const torch::Tensor& p : group.params()) {
      if (!DenseContiguousCpu(p, p.numel()) || p.scalar_type() != torch::kFloat) return false;
      const torch::Tensor& g = p.grad();
      if (!g.defined()) continue;
      if (!DenseContiguousCpu(g, p.numel()) ||
          (g.scalar_type() != torch::kFloat && g.scalar_type() != torch::kBFloat16)) {
        return false;
      }
      auto* state = static_cast<torch::optim::AdamWParamState*>(FindOptimizerParamState(*this, p));
      if (state == nullptr) continue;
      for (const torch::Tensor* t : {&state->exp_avg(), &state->exp_avg_sq()}) {
        if (!DenseContiguousCpu(*t, p.numel()) || t->scalar_type() != torch::kFloat) return false;
      }
    }
  }
  return true;
}

namespace {

kernels::AdamWHyper HyperOf(const torch::optim::OptimizerOptions& group_options,
                            double grad_scale) {
  const auto& options = static_cast<const torch::optim::AdamWOptions&>(group_options);
  kernels::AdamWHyper hyper;
  hyper.lr = options.lr();
  hyper.beta1 = std::get<0>(options.betas());
  hyper.beta2 = std::get<1>(options.betas());
  hyper.eps = options.eps();
  hyper.weight_decay = options.weight_decay();
  hyper.grad_scale = grad_scale;
  return hyper;
}

// copy_of(param), checked against what the kernel writes; undefined where there is none.
torch::Tensor Bf16CopyFor(const torch::Tensor& p,
                          const ReportsSteppedParameters::Bf16CopyOf& copy_of) {
  if (!copy_of) return {};
  torch::Tensor copy = copy_of(p);
  TORCH_CHECK(
      !copy.defined() || (copy.scalar_type() == torch::kBFloat16 && copy.device() == p.device() &&
                          copy.is_contiguous() && copy.numel() == p.numel()),
      "WriteBf16CopiesInNextStep: the copy of a parameter of ", p.numel(),
      " elements must be a contiguous bf16 tensor of as many on ", p.device());
  return copy;
}

}  // namespace

void FusedAdamW::CpuKernelStep() {
  // Every group's parameters in the order of their addresses (each update stands alone, so the
  // order changes no value), for ReportEachParameterInNextStep's caller.
  std::vector<std::pair<torch::Tensor*, const torch::optim::OptimizerOptions*>> order;
  for (auto& group : param_groups()) {
    for (torch::Tensor& p : group.params()) order.emplace_back(&p, &group.options());
  }
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return std::less<const void*>()(a.first->data_ptr(), b.first->data_ptr());
  });
  // Taken for this step alone, so that nothing stays pending if it throws.
  const Callback report = std::exchange(report_, nullptr);
  const Bf16CopyOf copy_of = std::exchange(bf16_copy_of_, nullptr);
  const torch::Tensor scale = std::exchange(grad_scale_, torch::Tensor());
  const double grad_scale = scale.defined() ? scale.item<double>() : 1.0;
  for (auto& [param, options] : order) {
    CpuKernelStepOne(*param, HyperOf(*options, grad_scale), copy_of);
    if (report) report(*param);
  }
}

void FusedAdamW::CpuKernelStepOne(torch::Tensor& p, const kernels::AdamWHyper& hyper,
                                  const Bf16CopyOf& copy_of) {
  torch::Tensor copy = Bf16CopyFor(p, copy_of);
  auto* const bits_out =
      copy.defined() ? reinterpret_cast<uint16_t*>(copy.data_ptr<at::BFloat16>()) : nullptr;
  const torch::Tensor& g = p.grad();
  if (!g.defined()) {
    if (copy.defined()) copy.view({-1}).copy_(p.reshape({-1}));
    return;
  }
  auto* state = static_cast<torch::optim::AdamWParamState*>(FindOptimizerParamState(*this, p));
  if (state == nullptr) {
    auto fresh = std::make_unique<torch::optim::AdamWParamState>();
    fresh->step(0);
    fresh->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
    fresh->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
    state = fresh.get();
    SetOptimizerParamState(*this, p, std::move(fresh));
  }
  state->step(state->step() + 1);
  float* exp_avg = state->exp_avg().data_ptr<float>();
  float* exp_avg_sq = state->exp_avg_sq().data_ptr<float>();
  if (g.scalar_type() == torch::kBFloat16) {
    const auto* bits = reinterpret_cast<const uint16_t*>(g.data_ptr<at::BFloat16>());
    kernels::CpuAdamWStep({p.data_ptr<float>(), bits, exp_avg, exp_avg_sq, p.numel(), bits_out},
                          hyper, state->step());
  } else {
    kernels::CpuAdamWStep(
        {p.data_ptr<float>(), g.data_ptr<float>(), exp_avg, exp_avg_sq, p.numel(), bits_out}, hyper,
        state->step());
  }
  // As an in-place op would: autograd then refuses a graph that saved the old value.
  p.unsafeGetTensorImpl()->bump_version();
}

bool FusedAdamW::UsesCpuKernel() {
  for (const auto& group : param_groups()) {
    for (const torch::Tensor& p : group.params()) {
      if (p.is_cuda()) return false;
    }
  }
  return cpu_kernel_ && CpuKernelApplies();
}

bool FusedAdamW::ReportEachParameterInNextStep(Callback callback) {
  report_ = nullptr;
  if (!UsesCpuKernel()) return false;
  report_ = std::move(callback);
  return true;
}

bool FusedAdamW::WriteBf16CopiesInNextStep(Bf16CopyOf copy_of) {
  bf16_copy_of_ = nullptr;
  if (!UsesCpuKernel() && !ReadsBf16Gradients()) return false;
  bf16_copy_of_ = std::move(copy_of);
  return true;
}

bool FusedAdamW::AnyAmsgrad() {
  for (const auto& group : param_groups()) {
    if (static_cast<const torch::optim::AdamWOptions&>(group.options()).amsgrad()) return true;
  }
  return false;
}

bool FusedAdamW::ReadsBf16Gradients() {
  if (!kernels::CudaAdamWBuilt() || !HasFusedAdamWWithDeviceLr() || !UsesFusedCudaKernel() ||
      AnyAmsgrad()) {
    return false;
  }
  for (const auto& group : param_groups()) {
    for (const torch::Tensor& p : group.params()) {
      if (p.scalar_type() != torch::kFloat) return false;  // a bf16 model: PyTorch's kernel
    }
  }
  return true;
}

bool FusedAdamW::ReadableGradient(const torch::Tensor& p, bool reads_bf16) {
  const torch::Tensor& g = p.grad();
  return !g.defined() || g.scalar_type() == p.scalar_type() ||
         (reads_bf16 && g.scalar_type() == torch::kBFloat16);
}

bool FusedAdamW::UsesFusedCudaKernel() {
  if (!fused_) return false;
  for (const auto& group : param_groups()) {
    for (const torch::Tensor& p : group.params()) {
      if (!p.is_cuda()) return false;
    }
  }
  return true;
}

bool FusedAdamW::ScaleGradientsInNextStep(const torch::Tensor& scale) {
  grad_scale_ = torch::Tensor();
  if (!scale.defined()) return true;
  if (!UsesCpuKernel() && !UsesFusedCudaKernel()) return false;
  const bool reads_bf16 = ReadsBf16Gradients();
  for (const auto& group : param_groups()) {
    for (const torch::Tensor& p : group.params()) {
      // The kernels scale in fp32: a bf16 gradient scaled by mul_ would be rounded to bf16.
      // Only ours reads a bf16 gradient (of an fp32 parameter: reads_bf16 says all are).
      const torch::Tensor& g = p.grad();
      if (g.defined() && g.scalar_type() != torch::kFloat &&
          !(reads_bf16 && g.scalar_type() == torch::kBFloat16)) {
        return false;
      }
    }
  }
  grad_scale_ = scale;
  return true;
}

torch::Tensor FusedAdamW::step(LossClosure closure) {
  bool all_cuda = true;
  for (const auto& group : param_groups()) {
    for (const torch::Tensor& p : group.params()) all_cuda = all_cuda && p.is_cuda();
  }
  if (!all_cuda && cpu_kernel_ && CpuKernelApplies()) {
    torch::Tensor loss;
    if (closure != nullptr) {
      at::AutoGradMode enable_grad(true);
      loss = closure();
    }
    torch::NoGradGuard no_grad;
    CpuKernelStep();
    return loss;
  }
  // Pending only on the two fused paths.
  const torch::Tensor scale = std::exchange(grad_scale_, torch::Tensor());
  report_ = nullptr;  // ReportEachParameterInNextStep said no to any other path
  // WriteBf16CopiesInNextStep said yes to the CUDA kernels' path only.
  const Bf16CopyOf copy_of = std::exchange(bf16_copy_of_, nullptr);
  if (!fused_ || !all_cuda) return torch::optim::AdamW::step(std::move(closure));
  torch::NoGradGuard no_grad;
  if (FusedCudaStep(scale, copy_of)) return {};
  fused_ = false;  // this LibTorch has no fused kernel: per-parameter from now on
  state_.clear();
  if (scale.defined()) {  // fp32 gradients on one device, as ScaleGradientsInNextStep checked
    std::vector<torch::Tensor> grads;
    for (auto& group : param_groups()) {
      for (torch::Tensor& p : group.params()) {
        if (p.grad().defined()) grads.push_back(p.grad());
      }
    }
    MultiplyByDeviceScalar(grads, scale);
  }
  return torch::optim::AdamW::step(std::move(closure));
}

bool FusedAdamW::FusedCudaStep(const torch::Tensor& scale, const Bf16CopyOf& copy_of) {
  torch::Tensor grad_scale;  // the kernel divides: the reciprocal of the coefficient
  // Ours where a gradient is narrower than its fp32 parameter or copies are asked for, and every
  // parameter is fp32 with a gradient it reads; PyTorch's otherwise (a bf16 model, for one).
  const bool reads_bf16 = ReadsBf16Gradients();
  bool narrow_grads = false, readable = true;
  for (const auto& group : param_groups()) {
    for (const torch::Tensor& p : group.params()) {
      const bool narrow = p.grad().defined() && p.grad().scalar_type() != p.scalar_type();
      narrow_grads = narrow_grads || narrow;
      readable = readable && ReadableGradient(p, reads_bf16);
    }
  }
  const bool own = (narrow_grads || copy_of != nullptr) && reads_bf16 && readable;
  for (size_t g = 0; g < param_groups().size(); ++g) {
    auto& group = param_groups()[g];
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs, steps;
    for (torch::Tensor& p : group.params()) {
      if (!p.grad().defined()) continue;
      State& s = state_[p.unsafeGetTensorImpl()];
      if (!s.step.defined()) {
        s.exp_avg = torch::zeros_like(p, torch::MemoryFormat::Preserve);
        s.exp_avg_sq = torch::zeros_like(p, torch::MemoryFormat::Preserve);
        s.step = torch::zeros({}, p.options().dtype(torch::kFloat));
      }
      // PyTorch's kernel reads gradients of the parameter's dtype: widen any other.
      if (!own && p.grad().scalar_type() != p.scalar_type()) {
        p.mutable_grad() = p.grad().to(p.scalar_type());
      }
      params.push_back(p);
      grads.push_back(p.grad());
      exp_avgs.push_back(s.exp_avg);
      exp_avg_sqs.push_back(s.exp_avg_sq);
      steps.push_back(s.step);
    }
    if (own) {
      OwnCudaStep(g, params, scale, copy_of);
      continue;
    }
    if (scale.defined() && !params.empty() &&
        (!grad_scale.defined() || grad_scale.device() != params[0].device())) {
      // 1 / scale in double, rounded once to fp32, on the device: no host sync.
      const torch::Tensor scale64 = scale.reshape({}).to(params[0].device(), torch::kDouble);
      grad_scale = torch::ones_like(scale64).div(scale64).to(torch::kFloat);
    }
    const double beta1 = std::get<0>(options.betas()), beta2 = std::get<1>(options.betas());
    if (!FusedAdamWStep(params, grads, exp_avgs, exp_avg_sqs, steps, options.lr(), beta1, beta2,
                        options.weight_decay(), options.eps(), grad_scale,
                        StepDeviceLr(g, params))) {
      return false;
    }
  }
  return true;
}

void FusedAdamW::OwnCudaStep(size_t g, const std::vector<torch::Tensor>& params,
                             const torch::Tensor& scale, const Bf16CopyOf& copy_of) {
  const auto& options = static_cast<const torch::optim::AdamWOptions&>(param_groups()[g].options());
  kernels::CudaAdamWLists lists;
  for (const torch::Tensor& p : params) {
    const State& s = state_.at(p.unsafeGetTensorImpl());
    lists.params.push_back(p);
    lists.grads.push_back(p.grad());
    lists.exp_avgs.push_back(s.exp_avg);
    lists.exp_avg_sqs.push_back(s.exp_avg_sq);
    lists.steps.push_back(s.step);
    if (copy_of != nullptr) lists.bf16_copies.push_back(Bf16CopyFor(p, copy_of));
  }
  if (copy_of != nullptr) {  // the contract: a parameter with no gradient is copied as it is
    for (const torch::Tensor& p : param_groups()[g].params()) {
      if (p.grad().defined()) continue;
      if (torch::Tensor copy = Bf16CopyFor(p, copy_of); copy.defined()) {
        copy.view({-1}).copy_(p.reshape({-1}));
      }
    }
  }
  kernels::CudaAdamWOptions kernel_options;
  kernel_options.lr = options.lr();
  kernel_options.device_lr = StepDeviceLr(g, params);
  kernel_options.beta1 = std::get<0>(options.betas());
  kernel_options.beta2 = std::get<1>(options.betas());
  kernel_options.eps = options.eps();
  kernel_options.weight_decay = options.weight_decay();
  kernel_options.grad_coefficient = scale;
  kernels::CudaAdamWStep(lists, kernel_options);
  for (const torch::Tensor& p : params) p.unsafeGetTensorImpl()->bump_version();
}

torch::Tensor FusedAdamW::StepDeviceLr(size_t g, const std::vector<torch::Tensor>& params) {
  if (params.empty()) return {};
  if (IsCapturingCudaGraph(params[0].device())) {
    // A graph replays launch arguments as captured: the learning rate comes from memory, which
    // LoadDeviceHyperparameters filled before the capture (filling it here would be captured
    // with this step's value).
    TORCH_CHECK(g < device_lr_.size() && device_lr_[g].defined(),
                "FusedAdamW: a CUDA graph is capturing its step but LoadDeviceHyperparameters "
                "did not run first, so the graph would keep this step's learning rate");
    return device_lr_[g];
  }
  return device_lr_always_ ? FilledDeviceLr(g, params[0].device()) : torch::Tensor();
}

std::string FusedAdamW::StepCaptureBlocker() {
  if (!UsesFusedCudaKernel()) {
    return "the optimizer's parameters are not all on CUDA (fused AdamW's CUDA step is what a "
           "graph captures)";
  }
  if (!HasFusedAdamWWithDeviceLr()) {
    return "this LibTorch has no fused AdamW that reads its learning rate from the device";
  }
  if (AnyAmsgrad()) return "amsgrad is on (the fused step here has no amsgrad)";
  for (const auto& group : param_groups()) {
    for (const torch::Tensor& p : group.params()) {
      if (state_.count(p.unsafeGetTensorImpl()) == 0) {
        return "the optimizer has not stepped every parameter yet (its state is made at the "
               "first step, which must not be captured)";
      }
    }
  }
  return "";
}

const torch::Tensor& FusedAdamW::FilledDeviceLr(size_t g, const c10::Device& device) {
  if (device_lr_.size() <= g) device_lr_.resize(param_groups().size());
  torch::Tensor& lr = device_lr_[g];
  if (!lr.defined() || lr.device() != device) {
    lr = torch::empty({}, torch::TensorOptions().dtype(torch::kFloat).device(device));
  }
  lr.fill_(static_cast<const torch::optim::AdamWOptions&>(param_groups()[g].options()).lr());
  return lr;
}

void FusedAdamW::LoadDeviceHyperparameters() {
  torch::NoGradGuard no_grad;
  for (size_t g = 0; g < param_groups().size(); ++g) {
    const auto& group = param_groups()[g];
    if (!group.params().empty()) FilledDeviceLr(g, group.params()[0].device());
  }
}

std::map<std::string, at::Tensor> FusedAdamW::ExportState(const at::Tensor& param) {
  auto it = state_.find(param.unsafeGetTensorImpl());
  if (it == state_.end()) return ExportTorchOptimizerState(*this, param);
  return {{"exp_avg", it->second.exp_avg},
          {"exp_avg_sq", it->second.exp_avg_sq},
          {"step", it->second.step.to(torch::kCPU, torch::kFloat64)}};
}

absl::Status FusedAdamW::ImportState(const at::Tensor& param,
                                     const std::map<std::string, at::Tensor>& state) {
  // The fused path runs on CUDA parameters; elsewhere the per-parameter AdamW holds the state.
  if (!fused_ || !param.is_cuda()) return ImportTorchOptimizerState(*this, param, state);
  for (const char* key : {"exp_avg", "exp_avg_sq", "step"}) {
    if (!state.count(key)) {
      return absl::InvalidArgumentError(absl::StrCat("optimizer state '", key, "' is missing"));
    }
  }
  return CatchTorch([&] {
    torch::NoGradGuard no_grad;
    State& s = state_[param.unsafeGetTensorImpl()];
    s.exp_avg = state.at("exp_avg")
                    .to(param.device(), param.scalar_type(), false, true)
                    .view(param.sizes());
    s.exp_avg_sq = state.at("exp_avg_sq")
                       .to(param.device(), param.scalar_type(), false, true)
                       .view(param.sizes());
    s.step = state.at("step").reshape({}).to(param.device(), torch::kFloat, false, true);
  });
}

void SetLearningRate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) {
    auto& options = group.options();
    if (auto* adamw = dynamic_cast<torch::optim::AdamWOptions*>(&options)) {
      adamw->lr(lr);
    } else if (auto* adam = dynamic_cast<torch::optim::AdamOptions*>(&options)) {
      adam->lr(lr);
    } else if (auto* sgd = dynamic_cast<torch::optim::SGDOptions*>(&options)) {
      sgd->lr(lr);
    }
  }
}

}  // namespace cpptrain
