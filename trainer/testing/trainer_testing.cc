#include "trainer/testing/trainer_testing.h"

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>

#include "base/logging.h"
#include "models/configs.h"
#include "trainer/data/in_memory_dataset.h"

namespace cpptrain {
namespace testing {

std::shared_ptr<DecoderLM> TinyDecoder(uint64_t seed) {
  torch::manual_seed(seed);
  return BuildDecoder(NamedDecoderConfig("tiny").value()).value();
}

std::string TestTempDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return std::string(tmp == nullptr ? "/tmp" : tmp) + "/" + name;
}

std::shared_ptr<const Dataset> VariableLengthTokens(int64_t count, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::vector<std::vector<int64_t>> sequences;
  for (int64_t i = 0; i < count; ++i) {
    std::vector<int64_t> tokens(3 + rng() % 10);
    for (int64_t& t : tokens) t = 1 + rng() % 60;
    sequences.push_back(tokens);
  }
  return *InMemoryDataset::FromTokenSequences(sequences);
}

absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> SgdTrainer::CreateOptimizer(
    const NamedParameters& params) {
  std::vector<torch::Tensor> tensors;
  for (const auto& [name, p] : params) tensors.push_back(p);
  return std::unique_ptr<torch::optim::Optimizer>(
      std::make_unique<torch::optim::SGD>(tensors, torch::optim::SGDOptions(0.5)));
}

std::vector<torch::Tensor> Parameters(torch::nn::Module& model) {
  std::vector<torch::Tensor> out;
  for (const auto& p : model.parameters()) out.push_back(p.detach().clone());
  return out;
}

double MaxRelativeDifference(const std::vector<torch::Tensor>& a,
                             const std::vector<torch::Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    // On the CPU in double: one side may be gathered to the CPU, the other on a GPU.
    const torch::Tensor x = a[i].detach().to(torch::kCPU, torch::kDouble);
    const torch::Tensor y = b[i].detach().to(torch::kCPU, torch::kDouble);
    const double scale = std::max(1e-6, y.abs().max().item<double>());
    worst = std::max(worst, (x - y).abs().max().item<double>() / scale);
  }
  return worst;
}

proto::TrainingArguments EquivalenceArgs(int per_device_batch, const std::string& output_dir) {
  proto::TrainingArguments args;
  args.set_output_dir(output_dir);
  args.set_per_device_train_batch_size(per_device_batch);
  args.set_gradient_accumulation_steps(2);
  args.set_max_steps(5);
  args.set_lr_scheduler_type(proto::TrainingArguments::CONSTANT);
  args.set_learning_rate(0.5);
  args.set_logging_steps(1);
  args.set_save_strategy(proto::TrainingArguments::NO);
  args.set_disable_tqdm(true);
  return args;
}

std::vector<double> StepLosses(const Trainer& trainer) {
  std::vector<double> losses;
  for (const Metrics& m : trainer.state().log_history) {
    if (m.count("loss")) losses.push_back(m.at("loss"));
  }
  return losses;
}

double WorstRelative(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size() || a.empty()) return std::numeric_limits<double>::infinity();
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::fabs(a[i] - b[i]) / std::fabs(b[i]));
  }
  return worst;
}

absl::StatusOr<EvalOutputs> EvaluateAndPredict(Trainer& trainer,
                                               std::shared_ptr<const Dataset> dataset) {
  absl::StatusOr<Metrics> metrics = trainer.Evaluate();
  if (!metrics.ok()) return metrics.status();
  absl::StatusOr<PredictionOutput> predictions = trainer.Predict(std::move(dataset));
  if (!predictions.ok()) return predictions.status();
  return EvalOutputs{*std::move(metrics), *std::move(predictions)};
}

bool SameEvaluation(const EvalOutputs& got, const EvalOutputs& want, double tolerance,
                    int64_t samples, const std::string& what) {
  const double got_loss = got.metrics.at("eval_loss");
  const double want_loss = want.metrics.at("eval_loss");
  const double loss_difference = std::fabs(got_loss - want_loss) / std::fabs(want_loss);
  const bool same_shape =
      got.predictions.predictions.sizes() == want.predictions.predictions.sizes();
  // Logits at padding positions depend on how batches were padded; compare real tokens only.
  const torch::Tensor real = want.predictions.label_ids.ne(kIgnoreIndex).unsqueeze(-1);
  const bool same_predictions =
      same_shape && got.predictions.label_ids.equal(want.predictions.label_ids) &&
      torch::allclose(got.predictions.predictions * real, want.predictions.predictions * real,
                      tolerance, tolerance);
  LOG(INFO) << what << ": eval_loss " << got_loss << " vs " << want_loss
            << " (one process), relative difference " << loss_difference << "; predictions "
            << got.predictions.predictions.sizes() << " vs " << want.predictions.predictions.sizes()
            << (same_predictions ? ", equal" : ", DIFFERENT");
  return loss_difference < tolerance && same_predictions &&
         got.predictions.predictions.size(0) == samples;
}

}  // namespace testing
}  // namespace cpptrain
