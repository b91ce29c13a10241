#include "checkpoint/optimizer_state.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "base/torch_compat.h"
#include "base/torch_status.h"

namespace cpptrain {
namespace {

at::Tensor StepTensor(int64_t step) {
  return torch::tensor(static_cast<double>(step), torch::kFloat64);
}

absl::StatusOr<at::Tensor> Like(const std::map<std::string, at::Tensor>& state,
                                const std::string& key, const at::Tensor& param) {
  auto it = state.find(key);
  if (it == state.end()) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer state '", key, "' is missing"));
  }
  if (it->second.sizes() != param.sizes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer state '", key, "' has shape ", c10::str(it->second.sizes()),
                     " but its parameter has shape ", c10::str(param.sizes())));
  }
  return it->second.to(param.device(), param.scalar_type(), /*non_blocking=*/false,
                       /*copy=*/true);
}

absl::StatusOr<int64_t> Step(const std::map<std::string, at::Tensor>& state) {
  auto it = state.find("step");
  if (it == state.end()) return absl::InvalidArgumentError("optimizer state 'step' is missing");
  return static_cast<int64_t>(std::llround(it->second.item<double>()));
}

template <typename ParamState>
std::map<std::string, at::Tensor> ExportAdam(ParamState& s) {
  std::map<std::string, at::Tensor> out = {
      {"step", StepTensor(s.step())}, {"exp_avg", s.exp_avg()}, {"exp_avg_sq", s.exp_avg_sq()}};
  if (s.max_exp_avg_sq().defined()) out["max_exp_avg_sq"] = s.max_exp_avg_sq();
  return out;
}

template <typename ParamState>
absl::Status ImportAdam(torch::optim::Optimizer& optimizer, const at::Tensor& param,
                        const std::map<std::string, at::Tensor>& state) {
  auto s = std::make_unique<ParamState>();
  CT_ASSIGN_OR_RETURN(const int64_t step, Step(state));
  s->step(step);
  CT_ASSIGN_OR_RETURN(at::Tensor exp_avg, Like(state, "exp_avg", param));
  CT_ASSIGN_OR_RETURN(at::Tensor exp_avg_sq, Like(state, "exp_avg_sq", param));
  s->exp_avg(exp_avg);
  s->exp_avg_sq(exp_avg_sq);
  if (state.count("max_exp_avg_sq")) {
    CT_ASSIGN_OR_RETURN(at::Tensor max_sq, Like(state, "max_exp_avg_sq", param));
    s->max_exp_avg_sq(max_sq);
  }
  SetOptimizerParamState(optimizer, param, std::move(s));
  return absl::OkStatus();
}

}  // namespace

std::map<std::string, at::Tensor> ExportTorchOptimizerState(torch::optim::Optimizer& optimizer,
                                                            const at::Tensor& param) {
  torch::optim::OptimizerParamState* state = FindOptimizerParamState(optimizer, param);
  if (state == nullptr) return {};
  if (auto* s = dynamic_cast<torch::optim::AdamWParamState*>(state)) return ExportAdam(*s);
  if (auto* s = dynamic_cast<torch::optim::AdamParamState*>(state)) return ExportAdam(*s);
  if (auto* s = dynamic_cast<torch::optim::SGDParamState*>(state)) {
    if (s->momentum_buffer().defined()) return {{"momentum_buffer", s->momentum_buffer()}};
  }
  return {};
}

absl::Status ImportTorchOptimizerState(torch::optim::Optimizer& optimizer, const at::Tensor& param,
                                       const std::map<std::string, at::Tensor>& state) {
  if (state.empty()) return absl::OkStatus();
  torch::NoGradGuard no_grad;
  return CatchTorch([&]() -> absl::Status {
    if (dynamic_cast<torch::optim::AdamW*>(&optimizer) != nullptr) {
      return ImportAdam<torch::optim::AdamWParamState>(optimizer, param, state);
    }
    if (dynamic_cast<torch::optim::Adam*>(&optimizer) != nullptr) {
      return ImportAdam<torch::optim::AdamParamState>(optimizer, param, state);
    }
    if (dynamic_cast<torch::optim::SGD*>(&optimizer) != nullptr) {
      auto s = std::make_unique<torch::optim::SGDParamState>();
      CT_ASSIGN_OR_RETURN(at::Tensor buffer, Like(state, "momentum_buffer", param));
      s->momentum_buffer(buffer);
      SetOptimizerParamState(optimizer, param, std::move(s));
      return absl::OkStatus();
    }
    return absl::UnimplementedError(
        "the optimizer is not AdamW, Adam or SGD and does not implement "
        "CheckpointableOptimizer, so its state cannot be restored: implement ExportState and "
        "ImportState, or save with save_only_model");
  });
}

std::map<std::string, at::Tensor> ExportOptimizerState(torch::optim::Optimizer& optimizer,
                                                       const at::Tensor& param) {
  if (auto* w = dynamic_cast<StepsStandIns*>(&optimizer)) {
    const StepsStandIns::StandIn in = w->StandInFor(param);
    if (in.optimizer == nullptr) return {};
    return ExportOptimizerState(*in.optimizer, in.tensor);
  }
  if (auto* c = dynamic_cast<CheckpointableOptimizer*>(&optimizer)) return c->ExportState(param);
  return ExportTorchOptimizerState(optimizer, param);
}

std::vector<std::string> OptimizerStateNames(torch::optim::Optimizer& optimizer,
                                             const at::Tensor& param) {
  if (auto* w = dynamic_cast<StepsStandIns*>(&optimizer)) {
    const StepsStandIns::StandIn in = w->StandInFor(param);
    if (in.optimizer == nullptr) return {};
    return OptimizerStateNames(*in.optimizer, in.tensor);
  }
  if (auto* c = dynamic_cast<CheckpointableOptimizer*>(&optimizer)) return c->StateNames(param);
  std::vector<std::string> names;
  for (const auto& [name, value] : ExportTorchOptimizerState(optimizer, param)) {
    names.push_back(name);
  }
  return names;
}

absl::Status ImportOptimizerState(torch::optim::Optimizer& optimizer, const at::Tensor& param,
                                  const std::map<std::string, at::Tensor>& state) {
  if (auto* w = dynamic_cast<StepsStandIns*>(&optimizer)) {
    const StepsStandIns::StandIn in = w->StandInFor(param);
    if (in.optimizer == nullptr) {
      return absl::InvalidArgumentError(
          "optimizer state for a tensor the optimizer does not train (the checkpoint was "
          "written for another model, or with other parameters frozen)");
    }
    return ImportOptimizerState(*in.optimizer, in.tensor, state);
  }
  if (auto* c = dynamic_cast<CheckpointableOptimizer*>(&optimizer)) {
    return c->ImportState(param, state);
  }
  return ImportTorchOptimizerState(optimizer, param, state);
}

}  // namespace cpptrain
