#include "trainer/optimizer_choice.h"

#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "config/training_args.h"
#include "trainer/optimizer.h"

namespace cpptrain {
namespace {

using OptimizerPtr = std::unique_ptr<torch::optim::Optimizer>;

// Hugging Face's groups: [decayed, not decayed], empty ones left out. `options(wd)` makes a
// group's options with weight decay `wd`.
template <typename Options, typename MakeOptions>
std::vector<torch::optim::OptimizerParamGroup> DecayGroups(const NamedParameters& params,
                                                           double weight_decay,
                                                           MakeOptions options) {
  std::vector<torch::Tensor> decay, no_decay;
  for (const auto& [name, param] : params) {
    (ExcludedFromWeightDecay(name) ? no_decay : decay).push_back(param);
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!decay.empty()) {
    groups.emplace_back(decay, std::make_unique<Options>(options(weight_decay)));
  }
  if (!no_decay.empty()) groups.emplace_back(no_decay, std::make_unique<Options>(options(0.0)));
  return groups;
}

OptimizerFactory TorchAdamWFactory(const proto::TrainingArguments& args) {
  return [args](const NamedParameters& params) -> absl::StatusOr<OptimizerPtr> {
    auto options = [&](double weight_decay) {
      return torch::optim::AdamWOptions(args.learning_rate())
          .betas({args.adam_beta1(), args.adam_beta2()})
          .eps(args.adam_epsilon())
          .weight_decay(weight_decay);
    };
    auto groups = DecayGroups<torch::optim::AdamWOptions>(params, args.weight_decay(), options);
    return OptimizerPtr(
        std::make_unique<torch::optim::AdamW>(groups, options(args.weight_decay())));
  };
}

OptimizerFactory SgdFactory(const proto::TrainingArguments& args) {
  return [args](const NamedParameters& params) -> absl::StatusOr<OptimizerPtr> {
    auto options = [&](double weight_decay) {
      return torch::optim::SGDOptions(args.learning_rate()).weight_decay(weight_decay);
    };
    auto groups = DecayGroups<torch::optim::SGDOptions>(params, args.weight_decay(), options);
    return OptimizerPtr(std::make_unique<torch::optim::SGD>(groups, options(args.weight_decay())));
  };
}

}  // namespace

absl::StatusOr<OptimizerFactory> MakeOptimizerFactory(const proto::TrainingArguments& args) {
  const std::string& optim = args.optim();
  if (optim == "adamw_torch_fused") return MakeAdamWFactory(args);
  if (optim == "adamw_torch") return TorchAdamWFactory(args);
  if (optim == "sgd") return SgdFactory(args);
  return absl::InvalidArgumentError(
      absl::StrCat("optim=\"", optim, "\" is not built here: use one of ",
                   absl::StrJoin(SupportedOptimizers(), ", "),
                   " (docs/HF_PARITY.md says what to use for the others)"));
}

}  // namespace cpptrain
