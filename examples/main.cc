// A standalone application on cpptrain: trains the example's own BlobClassifier on synthetic
// Gaussian blobs with a Trainer subclass (label-smoothed loss), an accuracy compute_metrics,
// a printing callback and the library's early stopping, on the CPU in a few seconds.
//
//   classifier [output_dir] [field=value ...]   e.g. classifier /tmp/run num_train_epochs=2
//
// Then a small decoder learns a few steps of the library's arithmetic corpus, writes its
// predictions and generates completions through the library's generation API
// (decoder_generation.h), in output_dir/decoder.
//
// Exits 0 when the final evaluation accuracy reaches 0.8 (guessing gives 0.25) and generation
// works, else 1.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cstdint>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status.h"
#include "blob_classifier.h"
#include "config/text_proto.h"
#include "decoder_generation.h"
#include "config/training_args.h"
#include "label_smoothing_trainer.h"
#include "print_metrics_callback.h"
#include "proto/training_args.pb.h"
#include "trainer/callbacks.h"
#include "trainer/data/in_memory_dataset.h"
#include "trainer/trainer.h"

namespace example {
namespace {

constexpr int64_t kNumFeatures = 16;
constexpr int64_t kNumClasses = 4;
constexpr double kRequiredAccuracy = 0.8;

// Hugging Face TrainingArguments names; any field can be overridden from the command line.
constexpr char kArgs[] = R"pb(
  output_dir: "/tmp/cpptrain_example"
  per_device_train_batch_size: 32
  per_device_eval_batch_size: 256
  num_train_epochs: 8
  learning_rate: 3e-3
  lr_scheduler_type: COSINE
  warmup_steps: 0.05
  weight_decay: 0.01
  logging_steps: 50
  eval_strategy: EPOCH
  save_strategy: NO
  metric_for_best_model: "accuracy"
  disable_tqdm: true
  seed: 7
  local { device: "cpu" }
)pb";

// `n` points per class around kNumClasses random centers; the same data for the same seed.
absl::StatusOr<std::shared_ptr<cpptrain::InMemoryDataset>> GaussianBlobs(const at::Tensor& centers,
                                                                         int64_t n, uint64_t seed) {
  at::Generator generator = at::detail::createCPUGenerator(seed);
  std::vector<cpptrain::Example> examples;
  for (int64_t i = 0; i < n * kNumClasses; ++i) {
    const int64_t label = i % kNumClasses;
    at::Tensor noise = at::randn({kNumFeatures}, generator, at::kFloat);
    examples.push_back({centers[label] + noise, at::scalar_tensor(label, at::kLong)});
  }
  return cpptrain::InMemoryDataset::Create(std::move(examples));
}

// compute_metrics: predictions are logits [N, C], label_ids classes [N].
cpptrain::Metrics Accuracy(const cpptrain::EvalPrediction& p) {
  at::Tensor counted = p.label_ids.ne(cpptrain::kIgnoreIndex);
  at::Tensor correct = p.predictions.argmax(-1).eq(p.label_ids) & counted;
  return {{"accuracy", correct.sum().item<double>() / counted.sum().item<double>()}};
}

absl::Status Run(int argc, char** argv) {
  cpptrain::proto::TrainingArguments args;
  CT_RETURN_IF_ERROR(cpptrain::ParseTextProto(kArgs, "example arguments", &args));
  std::vector<std::string> overrides;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (i == 1 && arg.find('=') == std::string::npos) {
      args.set_output_dir(arg);
    } else {
      overrides.push_back(arg);
    }
  }
  CT_RETURN_IF_ERROR(cpptrain::ApplyOverrides(overrides, &args));
  CT_RETURN_IF_ERROR(cpptrain::ValidateTrainingArguments(args));

  at::Generator generator = at::detail::createCPUGenerator(args.seed());
  at::Tensor centers = 0.6 * at::randn({kNumClasses, kNumFeatures}, generator, at::kFloat);
  CT_ASSIGN_OR_RETURN(auto train_data, GaussianBlobs(centers, 1024, args.seed() + 1));
  CT_ASSIGN_OR_RETURN(auto eval_data, GaussianBlobs(centers, 256, args.seed() + 2));

  at::manual_seed(args.seed());
  auto model = std::make_shared<BlobClassifier>(
      BlobClassifier::Options{kNumFeatures, /*width=*/64, /*num_blocks=*/2, kNumClasses});

  LabelSmoothingTrainer trainer(/*epsilon=*/0.1, args, model, train_data, eval_data);
  trainer.set_compute_metrics(Accuracy);
  trainer.AddCallback(std::make_shared<PrintMetricsCallback>(std::cout));
  trainer.AddCallback(std::make_shared<cpptrain::EarlyStoppingCallback>(/*patience=*/2));

  CT_ASSIGN_OR_RETURN(cpptrain::TrainOutput out, trainer.Train());
  CT_ASSIGN_OR_RETURN(cpptrain::Metrics metrics, trainer.Evaluate());
  const double accuracy = metrics.at("eval_accuracy");
  std::cout << "final: " << out.global_step << " steps, train loss " << out.training_loss
            << ", eval loss " << metrics.at("eval_loss") << ", eval accuracy " << accuracy
            << std::endl;
  if (accuracy < kRequiredAccuracy) {
    return absl::InternalError(
        absl::StrCat("eval accuracy ", accuracy, " is below ", kRequiredAccuracy));
  }
  return TrainDecoderAndGenerate(args.output_dir() + "/decoder", std::cout);
}

}  // namespace
}  // namespace example

int main(int argc, char** argv) {
  // Before anything logs: glog's lines go to stderr with the rank (one process here).
  cpptrain::InitLogging(argv[0], /*rank=*/0);
  absl::Status status = example::Run(argc, argv);
  if (!status.ok()) {
    std::cerr << "classifier: " << status << std::endl;
    return 1;
  }
  return 0;
}
