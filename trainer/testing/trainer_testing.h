// Shared pieces for tests that compare training runs: variable-length token data (so batches
// are padded), a Trainer with plain SGD, and a parameter comparison.
//
//   auto data = VariableLengthTokens(48, /*seed=*/1);
//   SgdTrainer trainer(args, model, data);
//   EXPECT_LT(MaxRelativeDifference(Parameters(a), Parameters(b)), 1e-5);
#ifndef CPPTRAIN_TRAINER_TESTING_TRAINER_TESTING_H_
#define CPPTRAIN_TRAINER_TESTING_TRAINER_TESTING_H_

#include <memory>
#include <vector>

#include "models/decoder.h"
#include "trainer/trainer.h"

namespace cpptrain {
namespace testing {

// The "tiny" decoder config's model, initialized from `seed` (torch::manual_seed).
std::shared_ptr<DecoderLM> TinyDecoder(uint64_t seed);

// TEST_TMPDIR/`name` (Bazel's and CTest's per-test scratch directory; /tmp outside them).
std::string TestTempDir(const std::string& name);

// `count` token sequences of lengths 3..12 with tokens in [1, 60], from `seed`.
std::shared_ptr<const Dataset> VariableLengthTokens(int64_t count, uint64_t seed);

// A Trainer whose optimizer is plain SGD; its learning rate comes from the scheduler, so set
// args.learning_rate (equivalence tests use 0.5, large enough to move the weights). Adam's
// first steps move every weight by about lr x sign(gradient), which turns rounding-level
// differences in near-zero gradients into visible parameter differences.
class SgdTrainer : public Trainer {
 public:
  using Trainer::Trainer;

 protected:
  absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> CreateOptimizer(
      const NamedParameters& params) override;
};

// Detached copies of a model's parameters, in registration order.
std::vector<torch::Tensor> Parameters(torch::nn::Module& model);

// The largest |a - b| / max|b| over corresponding tensors.
double MaxRelativeDifference(const std::vector<torch::Tensor>& a,
                             const std::vector<torch::Tensor>& b);

// Arguments of the equivalence tests: `per_device_batch` per rank, accumulation 2, 5 steps at
// a constant learning rate of 0.5 (large enough to move the weights), a loss logged every
// step, no checkpoints, no progress bar; written under `output_dir`.
proto::TrainingArguments EquivalenceArgs(int per_device_batch, const std::string& output_dir);

// The losses a Trainer logged, in step order.
std::vector<double> StepLosses(const Trainer& trainer);

// The largest |a[i] - b[i]| / |b[i]|; infinity when the lengths differ or are zero.
double WorstRelative(const std::vector<double>& a, const std::vector<double>& b);

// Evaluate() and Predict(dataset) of one Trainer.
struct EvalOutputs {
  Metrics metrics;
  PredictionOutput predictions;
};
absl::StatusOr<EvalOutputs> EvaluateAndPredict(Trainer& trainer,
                                               std::shared_ptr<const Dataset> dataset);

// Whether `got` (a distributed run) matches `want` (one process): eval_loss within `tolerance`
// relative, the same label ids and, at real (labelled) tokens, predictions allclose at
// `tolerance`, for exactly `samples` samples. Logs the comparison, prefixed by `what`.
bool SameEvaluation(const EvalOutputs& got, const EvalOutputs& want, double tolerance,
                    int64_t samples, const std::string& what);

}  // namespace testing
}  // namespace cpptrain

#endif  // CPPTRAIN_TRAINER_TESTING_TRAINER_TESTING_H_
