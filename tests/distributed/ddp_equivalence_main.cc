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
#include <cstdlib>
#include <iostream>

#include <torch/torch.h>

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

using testing::MaxRelativeDifference;
using testing::Parameters;
using testing::SgdTrainer;

std::shared_ptr<const Dataset> Data() { return testing::VariableLengthTokens(96, 5); }

std::shared_ptr<TestModel> Model(bool unused) {
  torch::manual_seed(11);
  return std::make_shared<TestModel>(*BuildDecoder(*NamedDecoderConfig("tiny")), unused);
}

proto::TrainingArguments Args(int per_device_batch, const std::string& dir) {
  proto::TrainingArguments args;
  args.set_output_dir(dir);
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

int Run() {
  auto env = DistributedEnvFromEnvironment();
  if (!env.ok()) {
    LOG(ERROR) << env.status();
    return 1;
  }
  InitLogging("ddp_equivalence", env->rank);
  const bool unused = absl::GetFlag(FLAGS_unused);
  proto::TrainingArguments ddp_args =
      Args(2, absl::StrCat(absl::GetFlag(FLAGS_output_dir), "/ddp_rank", env->rank));
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
  auto ddp_metrics = ddp_eval.Evaluate();
  auto ddp_predictions = ddp_eval.Predict(eval_data);
  if (!ddp_metrics.ok() || !ddp_predictions.ok()) {
    LOG(ERROR) << "DDP evaluation failed: "
               << (ddp_metrics.ok() ? ddp_predictions.status() : ddp_metrics.status());
    return 1;
  }
  if (env->rank != 0) return 0;

  auto local_model = Model(false);
  auto local_engine = LocalEngine::Create(proto::LocalEngineConfig(), MixedPrecision::kNone);
  SgdTrainer local(Args(2 * env->world_size, absl::GetFlag(FLAGS_output_dir) + "/local"),
                   local_model, Data(), nullptr, std::move(*local_engine));
  if (!local.Train().ok()) return 1;

  const std::vector<double> a = StepLosses(ddp), b = StepLosses(local);
  double worst_loss = 0, worst_param = 0;
  if (a.size() != 5 || b.size() != 5) {
    LOG(ERROR) << "expected 5 logged losses, got " << a.size() << " and " << b.size();
    return 1;
  }
  for (size_t i = 0; i < a.size(); ++i) worst_loss = std::max(worst_loss, std::fabs(a[i] - b[i]) / std::fabs(b[i]));
  worst_param = MaxRelativeDifference(Parameters(*ddp_model), Parameters(*local_model));
  LOG(INFO) << "world " << env->world_size << ": DDP losses " << a[0] << " ... " << a[4]
            << "; local " << b[0] << " ... " << b[4] << "; max relative difference: loss "
            << worst_loss << ", parameters " << worst_param;
  // The same (DDP-trained) model evaluated by one process.
  proto::TrainingArguments eval_args = Args(2, absl::GetFlag(FLAGS_output_dir) + "/local_eval");
  eval_args.set_per_device_eval_batch_size(5);
  Trainer local_eval(eval_args, ddp_model, nullptr, eval_data,
                     std::move(*LocalEngine::Create(proto::LocalEngineConfig(),
                                                    MixedPrecision::kNone)));
  auto local_metrics = local_eval.Evaluate();
  auto local_predictions = local_eval.Predict(eval_data);
  if (!local_metrics.ok() || !local_predictions.ok()) return 1;
  const double eval_difference =
      std::fabs(ddp_metrics->at("eval_loss") - local_metrics->at("eval_loss")) /
      local_metrics->at("eval_loss");
  const bool same_shape =
      ddp_predictions->predictions.sizes() == local_predictions->predictions.sizes();
  // Logits at padding positions depend on how batches were padded; compare real tokens only.
  const torch::Tensor real = local_predictions->label_ids.ne(-100).unsqueeze(-1);
  const bool same_predictions =
      same_shape && ddp_predictions->label_ids.equal(local_predictions->label_ids) &&
      torch::allclose(ddp_predictions->predictions * real,
                      local_predictions->predictions * real, 1e-4, 1e-5);
  LOG(INFO) << "evaluation: eval_loss " << ddp_metrics->at("eval_loss") << " (DDP) vs "
            << local_metrics->at("eval_loss") << " (one process), relative difference "
            << eval_difference << "; predictions " << ddp_predictions->predictions.sizes()
            << " vs " << local_predictions->predictions.sizes()
            << (same_predictions ? ", equal" : ", DIFFERENT");
  const bool ok = worst_loss < 1e-5 && worst_param < 1e-5 && eval_difference < 1e-6 &&
                  same_predictions && ddp_predictions->predictions.size(0) == 23;
  std::cout << (ok ? "EQUIVALENT" : "MISMATCH") << std::endl;
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace cpptrain

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return cpptrain::Run();
}
