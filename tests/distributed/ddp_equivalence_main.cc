// Run under //tools:launch with N processes (Gloo on the CPU, NCCL on GPUs). Each rank trains
// the tiny decoder with the DDP engine: per-device batch 2, accumulation 2, 5 optimizer steps,
// over token sequences of different lengths (so batches are padded). Rank 0 then trains the
// same model with the LocalEngine on the concatenated batch (2N per step, accumulation 2) and
// checks that the loss at every step, the final parameters (relative 1e-5) and the input
// tokens seen agree. Exit status 0 when they do. --checkpointing recomputes every layer in
// backward (on both sides); the variants of equivalence_variant.h apply to both sides.
//
// With --unused, the model carries a parameter the loss never touches: with
// find_unused_parameters off, Train() must fail with an error naming it (exit status 3); with
// --find_unused, training must succeed.
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <cstdlib>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "base/logging.h"
#include "base/status.h"
#include "engines/local/local_engine.h"
#include "models/configs.h"
#include "sharding/rendezvous.h"
#include "tests/distributed/equivalence_variant.h"
#include "trainer/testing/trainer_testing.h"
#include "trainer/trainer.h"

ABSL_FLAG(bool, unused, false, "add a parameter the loss never uses");
ABSL_FLAG(bool, find_unused, false, "set ddp.find_unused_parameters");
ABSL_FLAG(std::string, output_dir, "/tmp/ddp_equivalence", "where the Trainer writes");
ABSL_FLAG(bool, checkpointing, false, "gradient_checkpointing on both sides");

namespace cpptrain {
namespace {

// The tiny decoder plus, optionally, a parameter that takes no part in the loss.
class TestModel : public TrainableModel {
 public:
  TestModel(std::shared_ptr<DecoderLM> decoder, bool with_unused)
      : TrainableModel("TestModel"), decoder_(register_module("inner", decoder)) {
    if (with_unused) register_parameter("unused_head_weight", torch::zeros({3, 3}));
  }
  torch::Tensor Forward(const Batch& batch) override { return decoder_->Forward(batch); }
  torch::Tensor LossSum(const torch::Tensor& logits, const Batch& batch) const override {
    return decoder_->LossSum(logits, batch);
  }
  int64_t CountLossTargets(const Batch& batch) const override {
    return decoder_->CountLossTargets(batch);
  }
  // The Trainer's gradient_checkpointing reaches the layers only through this.
  void SetGradientCheckpointing(bool enabled) override {
    decoder_->SetGradientCheckpointing(enabled);
  }

 private:
  std::shared_ptr<DecoderLM> decoder_;
};

using testing::MaxRelativeDifference;
using testing::Parameters;
using testing::StepLosses;
using testing::WorstRelative;

std::shared_ptr<TestModel> Model(bool unused, const EquivalenceVariant& variant) {
  torch::manual_seed(11);
  auto model = std::make_shared<TestModel>(*BuildDecoder(*NamedDecoderConfig("tiny")), unused);
  variant.Prepare(*model);
  return model;
}

proto::TrainingArguments Args(const EquivalenceVariant& variant, int batch, const std::string& dir,
                              bool distributed) {
  proto::TrainingArguments args = variant.Args(batch, dir, distributed);
  args.set_gradient_checkpointing(absl::GetFlag(FLAGS_checkpointing));
  args.set_per_device_eval_batch_size(distributed ? 2 : 5);
  return args;
}

int Run() {
  auto env = DistributedEnvFromEnvironment();
  if (!env.ok()) {
    LOG(ERROR) << env.status();
    return 1;
  }
  InitLogging("ddp_equivalence", env->rank);
  const EquivalenceVariant variant = VariantFromFlags();
  const bool unused = absl::GetFlag(FLAGS_unused);
  const std::string dir = absl::GetFlag(FLAGS_output_dir);
  proto::TrainingArguments ddp_args =
      Args(variant, 2, absl::StrCat(dir, "/ddp_rank", env->rank), /*distributed=*/true);
  ddp_args.mutable_ddp()->set_find_unused_parameters(absl::GetFlag(FLAGS_find_unused));
  auto ddp_model = Model(unused, variant);
  std::unique_ptr<Trainer> ddp = variant.MakeTrainer(ddp_args, ddp_model, variant.TrainData());
  auto ddp_out = ddp->Train();
  if (!ddp_out.ok()) {
    LOG(ERROR) << "DDP training failed: " << ddp_out.status().message();
    return 3;
  }
  if (unused) {
    LOG(INFO) << "trained with an unused parameter (find_unused_parameters on)";
    return 0;
  }
  Trainer ddp_eval(ddp_args, ddp_model, nullptr, variant.EvalData(), nullptr);
  auto ddp_outputs = variant.Evaluation(ddp_eval);
  if (!ddp_outputs.ok()) {
    LOG(ERROR) << "DDP evaluation failed: " << ddp_outputs.status();
    return 1;
  }
  if (env->rank != 0) return 0;

  auto local_model = Model(false, variant);
  auto local_engine = LocalEngine::Create(variant.LocalConfig(), MixedPrecision::kNone);
  std::unique_ptr<Trainer> local =
      variant.MakeTrainer(Args(variant, 2 * env->world_size, dir + "/local", /*distributed=*/false),
                          local_model, variant.TrainData(), nullptr, std::move(*local_engine));
  if (!local->Train().ok()) return 1;

  const std::vector<double> a = StepLosses(*ddp), b = StepLosses(*local);
  if (a.size() != 5 || b.size() != 5) {
    LOG(ERROR) << "expected 5 logged losses, got " << a.size() << " and " << b.size();
    return 1;
  }
  const double worst_loss = WorstRelative(a, b);
  const double worst_param =
      MaxRelativeDifference(Parameters(*ddp_model), Parameters(*local_model));
  const int64_t tokens = ddp->state().num_input_tokens_seen;
  const int64_t local_tokens = local->state().num_input_tokens_seen;
  LOG(INFO) << "world " << env->world_size << " (" << variant.Describe() << "): DDP losses " << a[0]
            << " ... " << a[4] << "; local " << b[0] << " ... " << b[4]
            << "; max relative difference: loss " << worst_loss << ", parameters " << worst_param
            << "; input tokens seen " << tokens << " vs " << local_tokens;
  // The same (DDP-trained) model evaluated by one process.
  Trainer local_eval(Args(variant, 2, dir + "/local_eval", /*distributed=*/false), ddp_model,
                     nullptr, variant.EvalData(),
                     std::move(*LocalEngine::Create(variant.LocalConfig(), MixedPrecision::kNone)));
  auto local_outputs = variant.Evaluation(local_eval);
  if (!local_outputs.ok()) return 1;
  const bool same_evaluation =
      variant.SameEvaluationOrLoss(*ddp_outputs, *local_outputs, 1e-5, "evaluation, DDP");
  const bool ok = worst_loss < 1e-5 && worst_param < variant.ParameterTolerance() &&
                  same_evaluation && tokens == local_tokens;
  std::cout << (ok ? "EQUIVALENT" : "MISMATCH") << std::endl;
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace cpptrain

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return cpptrain::Run();
}
