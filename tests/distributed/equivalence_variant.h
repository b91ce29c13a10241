// The variants the multi-process equivalence programs share, from command-line flags:
//   --optimizer=sgd|adamw   plain SGD (lr 0.5), or the Trainer's AdamW with weight-decay groups
//                           (weight_decay 0.1: biases and norms get none)
//   --frozen                embeddings (and the tied head) and the final norm do not train
//   --uneven                14 training samples and even_batches=false on the distributed
//                           side: some ranks run out of batches before others every epoch
//   --use_cpu               CPU tensors and the CPU communicator even on a CUDA host
// Both sides of a comparison (the distributed run and the one process it must equal) get the
// same variant, so their losses and parameters still agree.
//
//   const EquivalenceVariant variant = VariantFromFlags();
//   proto::TrainingArguments args = variant.Args(2, dir, /*distributed=*/true);
//   variant.Prepare(*model);
//   std::unique_ptr<Trainer> trainer = variant.MakeTrainer(args, model, variant.TrainData());
#ifndef CPPTRAIN_TESTS_DISTRIBUTED_EQUIVALENCE_VARIANT_H_
#define CPPTRAIN_TESTS_DISTRIBUTED_EQUIVALENCE_VARIANT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "models/decoder.h"
#include "trainer/testing/trainer_testing.h"
#include "trainer/trainer.h"

namespace cpptrain {

struct EquivalenceVariant {
  bool adamw = false;
  bool frozen = false;
  bool uneven = false;
  bool use_cpu = false;

  // testing::EquivalenceArgs with this variant's optimizer settings, device and batching;
  // even_batches is off only on the `distributed` side.
  proto::TrainingArguments Args(int per_device_batch, const std::string& dir,
                                bool distributed) const;
  // Freezes what --frozen names (by parameter name suffix); call before any engine sees it.
  void Prepare(torch::nn::Module& model) const;
  std::shared_ptr<const Dataset> TrainData() const;
  std::unique_ptr<Trainer> MakeTrainer(const proto::TrainingArguments& args,
                                       std::shared_ptr<TrainableModel> model,
                                       std::shared_ptr<const Dataset> train,
                                       std::shared_ptr<const Dataset> eval = nullptr,
                                       std::unique_ptr<Engine> engine = nullptr) const;
  // The local engine for the one-process side: on the CPU with use_cpu, else "auto".
  proto::LocalEngineConfig LocalConfig() const;
  // How far the final parameters may differ from one process's (max relative, fp32): 1e-5,
  // and 5e-5 with AdamW, whose normalized step turns rounding differences in near-zero
  // gradient elements into parameter differences (measured up to 1.3e-5 with epsilon 1e-4 on
  // LibTorch 2.11's CPU kernels, 6e-6 on 1.13's). Losses are held to 1e-5 either way.
  double ParameterTolerance() const { return adamw ? 5e-5 : 1e-5; }
  // The largest relative difference (fp32) between `gathered`, a distributed run's final
  // parameters whole and in `local`'s order, and one process's model `local`; each parameter
  // beyond ParameterTolerance() is logged by name.
  double WorstParameterDifference(const std::vector<torch::Tensor>& gathered,
                                  const torch::nn::Module& local) const;
  // "adamw frozen" etc., for logs.
  std::string Describe() const;

  // The sharded programs' model: the tiny decoder with `layers` layers (seed 11), prepared.
  std::shared_ptr<DecoderLM> TinyDecoder(int layers) const;
  // 23 samples of variable length for evaluation: on several ranks the last global batch
  // repeats samples, which must count for nothing, and predictions come back gathered in
  // dataset order.
  std::shared_ptr<const Dataset> EvalData() const;
  // Evaluate() and Predict() on EvalData(); with uneven (no even batches, so nothing to
  // gather) Evaluate() alone.
  absl::StatusOr<testing::EvalOutputs> Evaluation(Trainer& trainer) const;
  // Whether a distributed Evaluation equals one process's: testing::SameEvaluation over the 23
  // samples, or with uneven eval_loss alone, within `tolerance` relative; logged as `what`.
  bool SameEvaluationOrLoss(const testing::EvalOutputs& got, const testing::EvalOutputs& want,
                            double tolerance, const std::string& what) const;
};

// Logs "what: status" and returns 1, the program's exit code.
int Fail(const absl::Status& status, const std::string& what);

EquivalenceVariant VariantFromFlags();

}  // namespace cpptrain

#endif  // CPPTRAIN_TESTS_DISTRIBUTED_EQUIVALENCE_VARIANT_H_
