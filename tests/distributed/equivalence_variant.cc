#include "tests/distributed/equivalence_variant.h"

#include <torch/nn/module.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status.h"
#include "models/configs.h"
#include "trainer/testing/trainer_testing.h"

ABSL_FLAG(std::string, optimizer, "sgd", "sgd (lr 0.5) or adamw (weight-decay groups)");
ABSL_FLAG(bool, frozen, false, "freeze the embeddings (tied head) and the final norm");
ABSL_FLAG(bool, uneven, false, "14 samples, even_batches=false: ranks run out unevenly");
ABSL_FLAG(bool, use_cpu, false, "train on the CPU even where CUDA is available");

namespace cpptrain {

EquivalenceVariant VariantFromFlags() {
  EquivalenceVariant v;
  v.adamw = absl::GetFlag(FLAGS_optimizer) == "adamw";
  v.frozen = absl::GetFlag(FLAGS_frozen);
  v.uneven = absl::GetFlag(FLAGS_uneven);
  v.use_cpu = absl::GetFlag(FLAGS_use_cpu);
  return v;
}

proto::TrainingArguments EquivalenceVariant::Args(int per_device_batch, const std::string& dir,
                                                  bool distributed) const {
  proto::TrainingArguments args = testing::EquivalenceArgs(per_device_batch, dir);
  if (adamw) {
    // AdamW moves a weight by about lr x g / (|g| + epsilon): where a gradient is near zero
    // up to rounding, the two sides' rounding differences become whole steps of different
    // size. epsilon 1e-4 (gradients here are ~1e-2) damps that; measured, with epsilon 1e-8
    // FSDP on 3 ranks differs from one process by 4e-4 in its parameters, with 1e-4 by 6e-6.
    args.set_learning_rate(1e-2);
    args.set_adam_epsilon(1e-4);
    args.set_weight_decay(0.1);
  }
  if (use_cpu) args.set_use_cpu(true);
  if (uneven && distributed) args.mutable_accelerator_config()->set_even_batches(false);
  return args;
}

void EquivalenceVariant::Prepare(torch::nn::Module& model) const {
  if (!frozen) return;
  for (auto& item : model.named_parameters(/*recurse=*/true)) {
    const std::string& name = item.key();
    if (absl::EndsWith(name, "embed_tokens.weight") || absl::EndsWith(name, "model.norm.weight")) {
      item.value().requires_grad_(false);
    }
  }
}

std::shared_ptr<const Dataset> EquivalenceVariant::TrainData() const {
  return testing::VariableLengthTokens(uneven ? 14 : 96, 5);
}

std::unique_ptr<Trainer> EquivalenceVariant::MakeTrainer(
    const proto::TrainingArguments& args, std::shared_ptr<TrainableModel> model,
    std::shared_ptr<const Dataset> train, std::shared_ptr<const Dataset> eval,
    std::unique_ptr<Engine> engine) const {
  if (adamw) {
    return std::make_unique<Trainer>(args, std::move(model), std::move(train), std::move(eval),
                                     std::move(engine));
  }
  return std::make_unique<testing::SgdTrainer>(args, std::move(model), std::move(train),
                                               std::move(eval), std::move(engine));
}

proto::LocalEngineConfig EquivalenceVariant::LocalConfig() const {
  proto::LocalEngineConfig config;
  if (use_cpu) config.set_device("cpu");
  return config;
}

std::shared_ptr<DecoderLM> EquivalenceVariant::TinyDecoder(int layers) const {
  torch::manual_seed(11);
  proto::DecoderConfig config = *NamedDecoderConfig("tiny");
  config.set_num_hidden_layers(layers);
  std::shared_ptr<DecoderLM> model = *BuildDecoder(config);
  Prepare(*model);
  return model;
}

std::shared_ptr<const Dataset> EquivalenceVariant::EvalData() const {
  return testing::VariableLengthTokens(23, 9);
}

absl::StatusOr<testing::EvalOutputs> EquivalenceVariant::Evaluation(Trainer& trainer) const {
  if (!uneven) return testing::EvaluateAndPredict(trainer, EvalData());
  testing::EvalOutputs out;
  CT_ASSIGN_OR_RETURN(out.metrics, trainer.Evaluate(EvalData()));
  return out;
}

bool EquivalenceVariant::SameEvaluationOrLoss(const testing::EvalOutputs& got,
                                              const testing::EvalOutputs& want, double tolerance,
                                              const std::string& what) const {
  if (!uneven) return testing::SameEvaluation(got, want, tolerance, /*samples=*/23, what);
  const double a = got.metrics.at("eval_loss"), b = want.metrics.at("eval_loss");
  LOG(INFO) << what << " (loss only): eval_loss " << a << " vs " << b;
  return std::abs(a - b) <= tolerance * std::abs(b);
}

double EquivalenceVariant::WorstParameterDifference(const std::vector<torch::Tensor>& gathered,
                                                    const torch::nn::Module& local) const {
  std::vector<torch::Tensor> local_params;
  for (const auto& p : local.parameters()) local_params.push_back(p.detach().to(torch::kFloat));
  const auto names = local.named_parameters().keys();
  for (size_t i = 0; i < names.size(); ++i) {
    const double d = testing::MaxRelativeDifference({gathered[i]}, {local_params[i]});
    if (d > ParameterTolerance()) LOG(WARNING) << "parameter " << names[i] << " differs by " << d;
  }
  return testing::MaxRelativeDifference(gathered, local_params);
}

int Fail(const absl::Status& status, const std::string& what) {
  LOG(ERROR) << what << ": " << status;
  return 1;
}

std::string EquivalenceVariant::Describe() const {
  std::string out = adamw ? "adamw" : "sgd";
  if (frozen) absl::StrAppend(&out, " frozen");
  if (uneven) absl::StrAppend(&out, " uneven");
  if (use_cpu) absl::StrAppend(&out, " cpu");
  return out;
}

}  // namespace cpptrain
