// Trainer::Evaluate and Trainer::Predict: forward passes under no-grad over a dataset, with
// the loss summed over all counted targets (so the result does not depend on batch size).

#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "engines/engine.h"
#include "trainer/data/data_loader.h"
#include "trainer/trainer.h"

namespace cpptrain {
namespace {

// Concatenates along dim 0, padding dim 1 (when present) to the longest with `pad`.
torch::Tensor PadAndConcat(const std::vector<torch::Tensor>& parts, double pad) {
  if (parts.empty()) return torch::Tensor();
  if (parts[0].dim() < 2) return torch::cat(parts, 0);
  int64_t longest = 0;
  for (const torch::Tensor& t : parts) longest = std::max(longest, t.size(1));
  std::vector<torch::Tensor> padded;
  for (const torch::Tensor& t : parts) {
    if (t.size(1) == longest) {
      padded.push_back(t);
      continue;
    }
    std::vector<int64_t> shape = t.sizes().vec();
    shape[1] = longest - t.size(1);
    padded.push_back(torch::cat({t, torch::full(shape, pad, t.options())}, 1));
  }
  return torch::cat(padded, 0);
}

// `batch` with the labels of rows `keep` and after set to kIgnoreIndex: they still run
// through the forward (every rank takes part in every step) but count for nothing.
Batch IgnoreRowsFrom(const Batch& batch, int64_t keep) {
  Batch out = batch;
  if (keep >= batch.size() || !batch.labels.defined()) return out;
  out.labels = batch.labels.clone();
  out.labels.slice(0, keep, batch.size()).fill_(kIgnoreIndex);
  return out;
}

// Every rank's `values` (equal batch size; dim 1, when present, padded to the longest with
// -100) concatenated in rank order, which is the sampler's order of samples within a step.
absl::StatusOr<torch::Tensor> GatherPadded(Engine& engine, torch::Tensor values) {
  if (engine.world_size() == 1) return values;
  if (values.dim() >= 2) {
    CT_ASSIGN_OR_RETURN(torch::Tensor lengths,
                        engine.AllGather(torch::tensor({values.size(1)}, torch::kLong)));
    const int64_t longest = lengths.max().item<int64_t>();
    if (values.size(1) < longest) {
      std::vector<int64_t> shape = values.sizes().vec();
      shape[1] = longest - values.size(1);
      values = torch::cat({values, torch::full(shape, -100, values.options())}, 1);
    }
  }
  return engine.AllGather(values);
}

// Restores train mode when evaluation ends, whatever the exit path.
class EvalModeGuard {
 public:
  explicit EvalModeGuard(TrainableModel& model)
      : model_(model), was_training_(model.is_training()) {
    model_.eval();
  }
  ~EvalModeGuard() { model_.train(was_training_); }

 private:
  TrainableModel& model_;
  bool was_training_;
};

}  // namespace

struct Trainer::EvalResult {
  double loss_sum = 0;
  int64_t num_targets = 0;
  int64_t num_samples = 0;
  // The ranks' means (the same on every rank, so that a decision read from a metric such as
  // metric_for_best_model: eval_runtime agrees): batches that were not join batches, and
  // seconds from the first batch to the end of the loop.
  double num_steps = 0;
  double runtime = 0;
  torch::Tensor predictions;
  torch::Tensor labels;
};

namespace {

// Sets Trainer::capture_logits_ for one ComputeLoss call, whatever the exit path.
class CaptureLogits {
 public:
  CaptureLogits(bool& flag, bool on) : flag_(flag) { flag_ = on; }
  ~CaptureLogits() { flag_ = false; }

 private:
  bool& flag_;
};

}  // namespace

PredictionStepOutput Trainer::PredictionStep(const Batch& batch, bool loss_only) {
  PredictionStepOutput out;
  std::unique_ptr<ForwardScope> scope = engine_->EnterForward();
  out.num_targets = model_->CountLossTargets(batch.To(torch::kCPU, false));
  captured_logits_ = torch::Tensor();
  {
    // As Hugging Face's prediction_step: the loss is ComputeLoss's (an override's too), of
    // the summed loss (num_items_in_batch 1).
    CaptureLogits capture(capture_logits_, !loss_only);
    out.loss_sum = ComputeLoss(*model_, batch, /*num_items_in_batch=*/1).detach().to(torch::kFloat);
  }
  if (loss_only) return out;
  // An override that did not call Trainer::ComputeLoss left no logits: one more forward.
  torch::Tensor logits = captured_logits_.defined() ? captured_logits_ : model_->Forward(batch);
  captured_logits_ = torch::Tensor();
  out.logits = logits.detach().to(torch::kFloat);
  return out;
}

absl::StatusOr<Trainer::EvalResult> Trainer::RunEvaluation(std::shared_ptr<const Dataset> dataset,
                                                           bool keep_outputs) {
  CT_RETURN_IF_ERROR(EnsureEngine());
  CT_RETURN_IF_ERROR(engine_->PrepareForInference(model_));
  const int world = engine_->world_size();
  if (world > 1 && keep_outputs && !args_.accelerator_config().even_batches()) {
    return absl::InvalidArgumentError(
        "gathering predictions across ranks needs equal batches on every rank: "
        "accelerator_config.even_batches is false; set it to true");
  }
  CT_ASSIGN_OR_RETURN(
      std::unique_ptr<DataLoader> loader,
      MakeLoader(std::move(dataset), /*train=*/false, args_.per_device_eval_batch_size()));
  // With several ranks, even_batches completes the last batches with samples from the start
  // of the dataset: this rank's last batch ends with `repeats` of them, and the gathered last
  // batch with `global_repeats`. They run through the forward (every rank must take part in
  // every step) but count for nothing.
  const int64_t last_batch = loader->num_batches() - 1;
  const int64_t repeats = loader->sampler().rank_padding_samples();
  const int64_t global_repeats = loader->sampler().num_padding_samples();
  EvalResult result;
  const double start = MonotonicSeconds();
  std::vector<torch::Tensor> logits, labels;
  std::vector<double> totals;
  auto run = [&]() -> absl::Status {
    torch::NoGradGuard no_grad;
    EvalModeGuard eval_mode(*model_);
    loader->SetEpoch(0);
    loader->Start();
    double loss_sum = 0;
    // Every rank runs the busiest rank's number of batches (a JoinBatch that counts for
    // nothing where it has none left, without even_batches), so sharded forwards stay in step.
    for (int64_t index = 0; index < loader->max_num_batches(); ++index) {
      std::optional<Batch> batch = loader->Next();
      if (!batch.has_value()) {
        CT_RETURN_IF_ERROR(loader->status());
        CT_ASSIGN_OR_RETURN(batch, loader->JoinBatch());
      }
      const bool joined = index >= loader->num_batches();
      const int64_t keep = joined ? 0 : batch->size() - (index == last_batch ? repeats : 0);
      // Only the real samples' loss counts.
      Batch on_device = IgnoreRowsFrom(
          batch->To(engine_->device(), args_.accelerator_config().non_blocking()), keep);
      PredictionStepOutput out = PredictionStep(on_device, !keep_outputs);
      if (keep_outputs && preprocess_logits_) {
        out.logits = preprocess_logits_(out.logits, batch->labels.to(out.logits.device()));
      }
      loss_sum += out.loss_sum.item<double>();
      result.num_targets += out.num_targets;
      result.num_samples += keep;
      if (!joined) ++result.num_steps;
      if (keep_outputs) {
        CT_ASSIGN_OR_RETURN(torch::Tensor all_logits, GatherPadded(*engine_, out.logits.cpu()));
        CT_ASSIGN_OR_RETURN(torch::Tensor all_labels, GatherPadded(*engine_, batch->labels.cpu()));
        if (index == last_batch && world > 1 && global_repeats > 0) {
          all_logits = all_logits.slice(0, 0, all_logits.size(0) - global_repeats);
          all_labels = all_labels.slice(0, 0, all_labels.size(0) - global_repeats);
        }
        logits.push_back(all_logits);
        labels.push_back(all_labels);
      }
    }
    totals = {loss_sum, static_cast<double>(result.num_targets),
              static_cast<double>(result.num_samples)};
    return absl::OkStatus();
  };
  CT_RETURN_IF_ERROR(CatchTorch(run));
  CT_RETURN_IF_ERROR(loader->status());
  totals.push_back(result.num_steps);
  totals.push_back(MonotonicSeconds() - start);
  CT_ASSIGN_OR_RETURN(torch::Tensor global,
                      engine_->AllReduceSum(torch::tensor(totals, torch::kFloat64)));
  result.loss_sum = global[0].item<double>();
  result.num_targets = static_cast<int64_t>(global[1].item<double>());
  result.num_samples = static_cast<int64_t>(global[2].item<double>());
  result.num_steps = global[3].item<double>() / world;
  result.runtime = global[4].item<double>() / world;
  if (keep_outputs) {
    result.predictions = PadAndConcat(logits, -100.0);
    result.labels = PadAndConcat(labels, -100.0);
  }
  return result;
}

Metrics Trainer::ResultMetrics(const EvalResult& result, const std::string& prefix) {
  Metrics metrics;
  if (compute_metrics_) {
    for (const auto& [key, value] : compute_metrics_({result.predictions, result.labels})) {
      metrics[absl::StartsWith(key, prefix + "_") ? key : absl::StrCat(prefix, "_", key)] = value;
    }
  }
  metrics[prefix + "_loss"] = result.loss_sum / std::max<int64_t>(1, result.num_targets);
  metrics[prefix + "_runtime"] = result.runtime;
  metrics[prefix + "_samples_per_second"] = result.num_samples / std::max(result.runtime, 1e-9);
  metrics[prefix + "_steps_per_second"] = result.num_steps / std::max(result.runtime, 1e-9);
  return metrics;
}

absl::StatusOr<Metrics> Trainer::Evaluate(std::shared_ptr<const Dataset> dataset,
                                          const std::string& prefix) {
  if (dataset == nullptr) dataset = eval_dataset_;
  if (dataset == nullptr) {
    return absl::InvalidArgumentError(
        "Evaluate() has no dataset: pass one, or give the Trainer an eval dataset");
  }
  CT_ASSIGN_OR_RETURN(EvalResult result,
                      RunEvaluation(std::move(dataset), compute_metrics_ != nullptr));
  Metrics metrics = ResultMetrics(result, prefix);
  callbacks_.Evaluate(Context(), metrics);
  Log(metrics);
  // Within Train the log point checks (and saves first); on its own, every rank learns here
  // whether rank 0's metrics file took the record.
  if (!training_) CT_RETURN_IF_ERROR(AllRanksOk(callbacks_.FirstError()));
  return metrics;
}

absl::StatusOr<PredictionOutput> Trainer::Predict(std::shared_ptr<const Dataset> dataset,
                                                  const std::string& prefix) {
  if (dataset == nullptr) {
    return absl::InvalidArgumentError("Predict() needs a dataset: pass one");
  }
  CT_ASSIGN_OR_RETURN(EvalResult result, RunEvaluation(std::move(dataset), /*keep_outputs=*/true));
  PredictionOutput out;
  out.predictions = result.predictions;
  out.label_ids = result.labels;
  out.metrics = ResultMetrics(result, prefix);
  callbacks_.Predict(Context(), out.metrics);
  return out;
}

}  // namespace cpptrain
