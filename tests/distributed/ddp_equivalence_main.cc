// Run under //tools:launch with N processes (Gloo on the CPU). Each rank trains the tiny
// decoder with the DDP engine: per-device batch 2, accumulation 2, 5 optimizer steps, over
// token sequences of different lengths (so batches are padded). Rank 0 then trains the same
// model with the LocalEngine on the concatenated batch (2N per step, accumulation 2) and
// checks that the loss at every step and the final parameters agree (relative 1e-5).
// Exit status 0 when they do.
//
// With --unused, the model carries a parameter the loss never touches: with
// find_unused_parameters off, Train() must fail with an error naming it (exit status 3); with
// --find_unused, training must succeed.
#include <torch/torch.h>

#include <cstdlib>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "base/logging.h"
#include "engines/local/local_engine.h"
#include "models/configs.h"
#include "sharding/rendezvous.h"
#include "trainer/testing/trainer_testing.h"
#include "trainer/trainer.h"

ABSL_FLAG(bool, unused, false, "add a parameter the loss never uses");
ABSL_FLAG(bool, find_unused, false, "set ddp.find_unused_parameters");
ABSL_FLAG(std::string, output_dir, "/tmp/ddp_equivalence", "where the Trainer writes");

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

 private:
  std::shared_ptr<DecoderLM> decoder_;
};

using testing::EquivalenceArgs;
using testing::EvaluateAndPredict;
using testing::MaxRelativeDifference;
using testing::Parameters;
using testing::SameEvaluation;
using testing::SgdTrainer;
using testing::StepLosses;
using testing::WorstRelative;

std::shared_ptr<const Dataset> Data() { return testing::VariableLengthTokens(96, 5); }

std::shared_ptr<TestModel> Model(bool unused) {
  torch::manual_seed(11);
  return std::make_shared<TestModel>(*BuildDecoder(*NamedDecoderConfig("tiny")), unused);
}

int Run() {
  auto env = DistributedEnvFromEnvironment();
  if (!env.ok()) {
    LOG(ERROR) << env.status();
    return 1;
  }
  InitLogging("ddp_equivalence", env->rank);
  const bool unused = absl::GetFlag(FLAGS_unused);
  proto::TrainingArguments ddp_args =
      EquivalenceArgs(2, absl::StrCat(absl::GetFlag(FLAGS_output_dir), "/ddp_rank", env->rank));
  ddp_args.mutable_ddp()->set_find_unused_parameters(absl::GetFlag(FLAGS_find_unused));
  auto ddp_model = Model(unused);
  SgdTrainer ddp(ddp_args, ddp_model, Data());
  auto ddp_out = ddp.Train();
  if (!ddp_out.ok()) {
    LOG(ERROR) << "DDP training failed: " << ddp_out.status().message();
    return 3;
  }
  if (unused) {
    LOG(INFO) << "trained with an unused parameter (find_unused_parameters on)";
    return 0;
  }
  // Evaluate and predict across ranks on 23 samples: the last global batch repeats samples,
  // which must count for nothing; predictions come back gathered, in dataset order.
  ddp_args.set_per_device_eval_batch_size(2);
  auto eval_data = testing::VariableLengthTokens(23, 9);
  Trainer ddp_eval(ddp_args, ddp_model, nullptr, eval_data, nullptr);
  auto ddp_outputs = EvaluateAndPredict(ddp_eval, eval_data);
  if (!ddp_outputs.ok()) {
    LOG(ERROR) << "DDP evaluation failed: " << ddp_outputs.status();
    return 1;
  }
  if (env->rank != 0) return 0;

  auto local_model = Model(false);
  auto local_engine = LocalEngine::Create(proto::LocalEngineConfig(), MixedPrecision::kNone);
  SgdTrainer local(EquivalenceArgs(2 * env->world_size, absl::GetFlag(FLAGS_output_dir) + "/local"),
                   local_model, Data(), nullptr, std::move(*local_engine));
  if (!local.Train().ok()) return 1;

  const std::vector<double> a = StepLosses(ddp), b = StepLosses(local);
  if (a.size() != 5 || b.size() != 5) {
    LOG(ERROR) << "expected 5 logged losses, got " << a.size() << " and " << b.size();
    return 1;
  }
  const double worst_loss = WorstRelative(a, b);
  const double worst_param =
      MaxRelativeDifference(Parameters(*ddp_model), Parameters(*local_model));
  LOG(INFO) << "world " << env->world_size << ": DDP losses " << a[0] << " ... " << a[4]
            << "; local " << b[0] << " ... " << b[4] << "; max relative difference: loss "
            << worst_loss << ", parameters " << worst_param;
  // The same (DDP-trained) model evaluated by one process.
  proto::TrainingArguments eval_args =
      EquivalenceArgs(2, absl::GetFlag(FLAGS_output_dir) + "/local_eval");
  eval_args.set_per_device_eval_batch_size(5);
  Trainer local_eval(
      eval_args, ddp_model, nullptr, eval_data,
      std::move(*LocalEngine::Create(proto::LocalEngineConfig(), MixedPrecision::kNone)));
  auto local_outputs = EvaluateAndPredict(local_eval, eval_data);
  if (!local_outputs.ok()) return 1;
  const bool same_evaluation =
      SameEvaluation(*ddp_outputs, *local_outputs, 1e-5, /*samples=*/23, "evaluation, DDP");
  const bool ok = worst_loss < 1e-5 && worst_param < 1e-5 && same_evaluation;
  std::cout << (ok ? "EQUIVALENT" : "MISMATCH") << std::endl;
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace cpptrain

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return cpptrain::Run();
}
