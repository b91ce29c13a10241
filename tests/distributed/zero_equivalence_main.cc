// Run under //tools:launch with N processes (Gloo on the CPU). Checks the ZeRO engines
// (zero { stage: 1|2|3 }) against one process, through the Trainer:
//   1. evaluate() and predict() on an untrained model, before any train(): no optimizer;
//      results equal one process's.
//   2. train() on the same Trainer afterwards: per-device batch 2, --accumulation micro-batches
//      per step (the first does not synchronize unless --sync_each_batch), clipping to
//      --max_grad_norm, 5 steps; rank 0 then trains the LocalEngine on the concatenated
//      batches and compares every logged loss and every parameter (stage 3: gathered from the
//      flat shards). The tiny decoder's parameter sizes are not multiples of 3 or 4.
// Variants: --stage, --offload (offload_optimizer_device CPU), --bucket (reduce and allgather
// bucket sizes, elements: small values make many buckets whose parts straddle parameters),
// --persistence (stage3_param_persistence_threshold: 0 wraps every layer), --no_prefetch
// (stage3_prefetch_bucket_size 0), and those of equivalence_variant.h (AdamW, frozen, uneven).
// Prints EQUIVALENT and exits 0 when every check passes.
#include <torch/types.h>

#include <cmath>
#include <cstdlib>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "base/logging.h"
#include "base/status.h"
#include "engines/local/local_engine.h"
#include "models/configs.h"
#include "sharding/flat_shard.h"
#include "sharding/rendezvous.h"
#include "tests/distributed/equivalence_variant.h"
#include "trainer/testing/trainer_testing.h"
#include "trainer/trainer.h"

ABSL_FLAG(std::string, output_dir, "/tmp/zero_equivalence", "where the Trainer writes");
ABSL_FLAG(int, stage, 1, "zero.stage");
ABSL_FLAG(bool, offload, false, "zero.offload_optimizer_device=CPU");
ABSL_FLAG(int64_t, bucket, 500000000, "zero.reduce_bucket_size and allgather_bucket_size");
ABSL_FLAG(int64_t, persistence, 100000, "zero.stage3_param_persistence_threshold");
ABSL_FLAG(bool, no_prefetch, false, "zero.stage3_prefetch_bucket_size=0");
ABSL_FLAG(int, accumulation, 2, "gradient_accumulation_steps");
ABSL_FLAG(bool, sync_each_batch, false, "synchronize gradients on every micro-batch");
ABSL_FLAG(double, max_grad_norm, 0.1, "clip to this global norm (both sides)");

namespace cpptrain {
namespace {

using testing::StepLosses;
using testing::WorstRelative;

constexpr int kLayers = 4;

const EquivalenceVariant& Variant() {
  static const EquivalenceVariant variant = VariantFromFlags();
  return variant;
}

std::shared_ptr<DecoderLM> Model() { return Variant().TinyDecoder(kLayers); }

proto::TrainingArguments Args(int per_device_batch, const std::string& dir, bool distributed) {
  proto::TrainingArguments args = Variant().Args(per_device_batch, dir, distributed);
  args.set_per_device_eval_batch_size(2);
  args.set_gradient_accumulation_steps(absl::GetFlag(FLAGS_accumulation));
  args.set_max_grad_norm(absl::GetFlag(FLAGS_max_grad_norm));
  return args;
}

proto::TrainingArguments ZeroArgs(const std::string& dir) {
  proto::TrainingArguments args = Args(2, dir, /*distributed=*/true);
  proto::ZeroConfig* zero = args.mutable_zero();
  zero->set_stage(absl::GetFlag(FLAGS_stage));
  if (absl::GetFlag(FLAGS_offload)) zero->set_offload_optimizer_device(proto::ZeroConfig::CPU);
  zero->set_reduce_bucket_size(absl::GetFlag(FLAGS_bucket));
  zero->set_allgather_bucket_size(absl::GetFlag(FLAGS_bucket));
  zero->set_stage3_param_persistence_threshold(absl::GetFlag(FLAGS_persistence));
  if (absl::GetFlag(FLAGS_no_prefetch)) zero->set_stage3_prefetch_bucket_size(0);
  args.mutable_accelerator_config()->mutable_gradient_accumulation_kwargs()->set_sync_each_batch(
      absl::GetFlag(FLAGS_sync_each_batch));
  return args;
}

// Every parameter's full value: replicated (stages 1, 2) or gathered from the flat shards
// (stage 3; all ranks take part).
absl::StatusOr<std::vector<torch::Tensor>> FullParameters(DecoderLM& model) {
  FlatShardedModel* flat = FlatShardedOf(model);
  std::vector<torch::Tensor> out;
  for (const auto& p : model.parameters()) {
    if (flat == nullptr) {
      out.push_back(p.detach().to(torch::kFloat).clone());
      continue;
    }
    CT_ASSIGN_OR_RETURN(torch::Tensor full, flat->GatherFull(p));
    out.push_back(full.to(torch::kFloat));
  }
  return out;
}

int Run() {
  auto env = DistributedEnvFromEnvironment();
  if (!env.ok()) return Fail(env.status(), "environment");
  InitLogging("zero_equivalence", env->rank);
  const std::string dir = absl::GetFlag(FLAGS_output_dir);
  const int stage = absl::GetFlag(FLAGS_stage);
  constexpr double kTolerance = 1e-5;

  auto model = Model();
  std::unique_ptr<Trainer> zero_trainer =
      Variant().MakeTrainer(ZeroArgs(absl::StrCat(dir, "/zero_rank", env->rank)), model,
                            Variant().TrainData(), Variant().EvalData());
  Trainer& zero = *zero_trainer;
  auto untrained = Variant().Evaluation(zero);
  if (!untrained.ok()) return Fail(untrained.status(), "evaluate/predict before train");
  if (zero.engine()->optimizer() != nullptr) {
    return Fail(absl::InternalError("an optimizer exists"), "evaluate before train");
  }
  auto trained = zero.Train();
  if (!trained.ok()) return Fail(trained.status(), "ZeRO training");
  if (zero.engine()->name() != absl::StrCat("zero", stage)) {
    return Fail(absl::InternalError(zero.engine()->name()), "engine is not the ZeRO stage asked");
  }
  auto zero_params = FullParameters(*model);
  if (!zero_params.ok()) return Fail(zero_params.status(), "gathering parameters");
  if (env->rank != 0) return 0;

  auto local_model = Model();
  proto::TrainingArguments local_args = Args(2 * env->world_size, dir + "/local", false);
  local_args.set_per_device_eval_batch_size(5);
  std::unique_ptr<Trainer> local_trainer = Variant().MakeTrainer(
      local_args, local_model, Variant().TrainData(), Variant().EvalData(),
      std::move(*LocalEngine::Create(Variant().LocalConfig(), MixedPrecision::kNone)));
  Trainer& local = *local_trainer;
  auto local_untrained = Variant().Evaluation(local);
  if (!local_untrained.ok()) return Fail(local_untrained.status(), "local evaluation");
  const bool eval_ok = Variant().SameEvaluationOrLoss(*untrained, *local_untrained, kTolerance,
                                                      "untrained model, ZeRO");
  if (!local.Train().ok()) return 1;
  const std::vector<double> a = StepLosses(zero), b = StepLosses(local);
  const double worst_loss = WorstRelative(a, b);
  const double worst_param = Variant().WorstParameterDifference(*zero_params, *local_model);
  LOG(INFO) << "world " << env->world_size << " (stage " << stage
            << (absl::GetFlag(FLAGS_offload) ? ", offload" : "") << ", accumulation "
            << absl::GetFlag(FLAGS_accumulation) << ", " << Variant().Describe()
            << "): ZeRO losses " << a.front() << " ... " << a.back() << "; local " << b.front()
            << " ... " << b.back() << "; max relative difference: loss " << worst_loss
            << ", parameters " << worst_param;
  const bool ok = eval_ok && a.size() == 5 && worst_loss < kTolerance &&
                  worst_param < Variant().ParameterTolerance();
  std::cout << (ok ? "EQUIVALENT" : "MISMATCH") << std::endl;
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace cpptrain

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return cpptrain::Run();
}
