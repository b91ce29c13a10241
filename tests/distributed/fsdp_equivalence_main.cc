// Run under //tools:launch with N processes (Gloo on the CPU). Checks the FSDP2 engine against
// one process, through the Trainer, in four parts:
//   1. evaluate() and predict() on an untrained model, before any train(): no optimizer, no
//      gradients, each unit gathered for its forward and freed after (no rank ever holds more
//      than the root and two units); results equal one process's.
//   2. train() on the same Trainer afterwards reuses those shards: per-device batch 2,
//      accumulation 2 (the first micro-batch of each step does not communicate), 5 SGD
//      steps; rank 0 then trains the LocalEngine on the concatenated batches and compares
//      every logged loss and every parameter (gathered from the shards).
//   3. a model sharded at load time (FullyShard before any Trainer) with no engine in the
//      training arguments: the Trainer adopts its shards and trains to the same losses; and a
//      model built deferred (DecoderInit kDeferred), whose chunks the engine initializes,
//      trains to the losses of one process training the same row-seeded model built whole.
//   4. a dead collective partner is outside this program (dead_rank_test covers it).
// Variants: --reshard_after_forward=false, --wrap=none|size, --hsdp (2 x N/2 mesh),
// --checkpointing, --bf16 (looser tolerance: bf16 compute on both sides), and those of
// equivalence_variant.h (AdamW, frozen parameters, uneven batches, CPU on a CUDA host).
// With --uneven predictions cannot be gathered (no even batches): losses only.
// Prints EQUIVALENT and exits 0 when every check passes.
#include <torch/types.h>

#include <cmath>
#include <cstdlib>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "base/logging.h"
#include "base/status.h"
#include "engines/engine_factory.h"
#include "engines/local/local_engine.h"
#include "models/configs.h"
#include "sharding/fully_shard.h"
#include "sharding/rendezvous.h"
#include "tests/distributed/equivalence_variant.h"
#include "trainer/testing/trainer_testing.h"
#include "trainer/trainer.h"

ABSL_FLAG(std::string, output_dir, "/tmp/fsdp_equivalence", "where the Trainer writes");
ABSL_FLAG(bool, reshard_after_forward, true, "fsdp.reshard_after_forward for the layers");
ABSL_FLAG(std::string, wrap, "transformer", "transformer, size or none");
ABSL_FLAG(bool, hsdp, false, "a 2 x (N/2) replicate x shard mesh");
ABSL_FLAG(bool, checkpointing, false, "fsdp.activation_checkpointing");
ABSL_FLAG(bool, bf16, false, "bf16 mixed precision on both sides");
ABSL_FLAG(bool, sync_each_batch, false, "synchronize gradients on every micro-batch");
ABSL_FLAG(bool, offload, false, "fsdp.offload_params");

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

// The same shape initialized row-seeded (models/row_init.h), built whole or deferred.
std::shared_ptr<DecoderLM> RowSeededModel(DecoderInit::Mode mode) {
  proto::DecoderConfig config = *NamedDecoderConfig("tiny");
  config.set_num_hidden_layers(kLayers);
  std::shared_ptr<DecoderLM> model = *BuildDecoder(config, {mode, 23});
  Variant().Prepare(*model);
  return model;
}

std::shared_ptr<const Dataset> TrainData() { return Variant().TrainData(); }
std::unique_ptr<Trainer> MakeTrainer(const proto::TrainingArguments& args,
                                     std::shared_ptr<TrainableModel> model,
                                     std::shared_ptr<const Dataset> eval = nullptr,
                                     std::unique_ptr<Engine> engine = nullptr) {
  return Variant().MakeTrainer(args, std::move(model), TrainData(), std::move(eval),
                               std::move(engine));
}

proto::TrainingArguments Args(int per_device_batch, const std::string& dir,
                              bool distributed = true) {
  proto::TrainingArguments args = Variant().Args(per_device_batch, dir, distributed);
  args.set_per_device_eval_batch_size(2);
  if (absl::GetFlag(FLAGS_bf16)) {
    args.set_bf16(true);
    args.set_learning_rate(0.05);  // bf16 rounding times 0.5 would swamp the comparison
  }
  return args;
}

proto::TrainingArguments FsdpArgs(const std::string& dir, int world) {
  proto::TrainingArguments args = Args(2, dir);
  proto::FsdpConfig* fsdp = args.mutable_fsdp();
  fsdp->set_version(2);
  fsdp->set_reshard_after_forward(absl::GetFlag(FLAGS_reshard_after_forward));
  const std::string wrap = absl::GetFlag(FLAGS_wrap);
  if (wrap == "none") {
    fsdp->set_auto_wrap_policy(proto::FsdpConfig::NO_WRAP);
  } else if (wrap == "size") {
    fsdp->set_auto_wrap_policy(proto::FsdpConfig::SIZE_BASED_WRAP);
    fsdp->set_min_num_params(5000);  // a layer holds 12,352; the MLP alone 6,144
  }
  if (absl::GetFlag(FLAGS_hsdp)) {
    fsdp->set_dp_replicate_size(2);
    fsdp->set_dp_shard_size(world / 2);
  }
  fsdp->set_activation_checkpointing(absl::GetFlag(FLAGS_checkpointing));
  fsdp->set_offload_params(absl::GetFlag(FLAGS_offload));
  args.mutable_accelerator_config()->mutable_gradient_accumulation_kwargs()->set_sync_each_batch(
      absl::GetFlag(FLAGS_sync_each_batch));
  return args;
}

// Every parameter's full value, gathered from the shards (all ranks take part).
absl::StatusOr<std::vector<torch::Tensor>> FullParameters(DecoderLM& model) {
  FullyShardedModel* sharded = FullyShardedOf(model);
  if (sharded == nullptr) return absl::InternalError("the model is not sharded");
  std::vector<torch::Tensor> out;
  for (const auto& p : model.parameters()) {
    CT_ASSIGN_OR_RETURN(torch::Tensor full, sharded->GatherFull(p));
    out.push_back(full.to(torch::kFloat));
  }
  return out;
}

int Run() {
  auto env = DistributedEnvFromEnvironment();
  if (!env.ok()) return Fail(env.status(), "environment");
  InitLogging("fsdp_equivalence", env->rank);
  const std::string dir = absl::GetFlag(FLAGS_output_dir);
  const bool bf16 = absl::GetFlag(FLAGS_bf16);
  const double tolerance = bf16 ? 2e-2 : 1e-5;
  const MixedPrecision precision = bf16 ? MixedPrecision::kBf16 : MixedPrecision::kNone;

  // 1 and 2: evaluate and predict first, then train, on one Trainer.
  auto model = Model();
  std::unique_ptr<Trainer> fsdp_trainer =
      MakeTrainer(FsdpArgs(absl::StrCat(dir, "/fsdp_rank", env->rank), env->world_size), model,
                  Variant().EvalData());
  Trainer& fsdp = *fsdp_trainer;
  auto untrained = Variant().Evaluation(fsdp);
  if (!untrained.ok()) return Fail(untrained.status(), "evaluate/predict before train");
  FullyShardedModel* sharded = FullyShardedOf(*model);
  if (sharded == nullptr) return Fail(absl::InternalError("not sharded"), "evaluate");
  const int peak = sharded->peak_unsharded();
  // Root + the unit running + one prefetched.
  bool never_whole = sharded->num_groups() < 3 || peak <= 3;
  LOG(INFO) << "evaluation held at most " << peak << " of " << sharded->num_groups()
            << " groups unsharded at once";
  {
    const std::vector<int64_t> full = sharded->GroupFullBytes();
    int64_t model_bytes = 0, largest_unit = 0;
    for (size_t i = 0; i < full.size(); ++i) {
      model_bytes += full[i];
      if (i + 1 < full.size()) largest_unit = std::max(largest_unit, full[i]);
    }
    const int64_t root = full.back();
    // The root stays gathered for the whole forward; one unit computes while the next one's
    // gather is in flight, and a group's gather buffer lives until its copy-out is done.
    const int64_t bound =
        sharded->shard_bytes() + std::max(root + 3 * largest_unit, 2 * root + largest_unit);
    LOG(INFO) << "evaluation peak parameter storage " << sharded->peak_parameter_bytes()
              << " bytes on this rank: chunks " << sharded->shard_bytes() << ", 1/N of the model "
              << model_bytes / sharded->mesh().shard->size() << ", root " << root
              << ", largest unit " << largest_unit << ", whole model " << model_bytes
              << " (bound: chunks + root + 3 units, or chunks + 2 roots + 1 unit: " << bound << ")";
    never_whole = never_whole && sharded->peak_parameter_bytes() <= bound;
  }
  auto trained = fsdp.Train();
  if (!trained.ok()) return Fail(trained.status(), "FSDP training");
  auto fsdp_params = FullParameters(*model);
  if (!fsdp_params.ok()) return Fail(fsdp_params.status(), "gathering parameters");

  // 3: sharded at load time, handed to a Trainer that names no engine.
  auto preloaded = Model();
  proto::FsdpConfig load_config;
  load_config.set_version(2);
  auto mesh = ShardMeshFromEnvironment(load_config, std::chrono::seconds(60), Variant().use_cpu);
  if (!mesh.ok()) return Fail(mesh.status(), "load-time mesh");
  FullyShardOptions options;
  options.reshard_after_forward = absl::GetFlag(FLAGS_reshard_after_forward);
  if (bf16) {
    options.param_dtype = at::kBFloat16;
    options.reduce_dtype = at::kFloat;
  }
  auto shard = FullyShard(*preloaded, *mesh, options);
  if (!shard.ok()) return Fail(shard.status(), "FullyShard at load time");
  proto::TrainingArguments plain = Args(2, absl::StrCat(dir, "/preloaded_rank", env->rank));
  std::unique_ptr<Trainer> adopted_trainer = MakeTrainer(plain, preloaded);
  Trainer& adopted = *adopted_trainer;
  auto adopted_out = adopted.Train();
  if (!adopted_out.ok()) return Fail(adopted_out.status(), "training a model sharded at load time");
  const double adopted_difference = WorstRelative(StepLosses(adopted), StepLosses(fsdp));
  LOG(INFO) << "sharded at load time, no engine configured: engine " << adopted.engine()->name()
            << ", losses differ from the configured FSDP run by " << adopted_difference;

  // The same load-time-sharded model with DDP configured: a clear error, on every rank.
  proto::TrainingArguments ddp_args = plain;
  ddp_args.mutable_ddp();
  auto refused = MakeTrainer(ddp_args, preloaded)->Train();
  const bool ddp_refused =
      !refused.ok() && refused.status().message().find("sharded at load time") != std::string::npos;
  LOG(INFO) << "DDP configured for a sharded model: " << refused.status();
  if (!ddp_refused) return Fail(absl::InternalError("DDP accepted a sharded model"), "ddp");

  // 3b: built deferred (no rank ever allocates a whole tensor), initialized into its shards by
  // the engine; rank 0 compares with one process training the same model built whole.
  auto deferred_model = RowSeededModel(DecoderInit::Mode::kDeferred);
  std::unique_ptr<Trainer> deferred_trainer = MakeTrainer(
      FsdpArgs(absl::StrCat(dir, "/deferred_rank", env->rank), env->world_size), deferred_model);
  Trainer& deferred = *deferred_trainer;
  auto deferred_out = deferred.Train();
  if (!deferred_out.ok()) return Fail(deferred_out.status(), "training a deferred model");

  if (env->rank != 0) return 0;
  auto seeded_model = RowSeededModel(DecoderInit::Mode::kRowSeeded);
  std::unique_ptr<Trainer> seeded_trainer =
      MakeTrainer(Args(2 * env->world_size, dir + "/seeded", false), seeded_model, nullptr,
                  std::move(*LocalEngine::Create(Variant().LocalConfig(), precision)));
  Trainer& seeded = *seeded_trainer;
  if (!seeded.Train().ok()) return 1;
  const double deferred_difference = WorstRelative(StepLosses(deferred), StepLosses(seeded));
  LOG(INFO) << "built deferred and initialized into shards: losses differ from one process "
               "training the row-seeded model built whole by "
            << deferred_difference;
  // One process: the same evaluation of an untrained model, then the same training.
  auto local_model = Model();
  proto::TrainingArguments local_args = Args(2 * env->world_size, dir + "/local", false);
  local_args.set_per_device_eval_batch_size(5);
  std::unique_ptr<Trainer> local_trainer =
      MakeTrainer(local_args, local_model, Variant().EvalData(),
                  std::move(*LocalEngine::Create(Variant().LocalConfig(), precision)));
  Trainer& local = *local_trainer;
  auto local_untrained = Variant().Evaluation(local);
  if (!local_untrained.ok()) return Fail(local_untrained.status(), "local evaluation");
  const bool eval_ok = Variant().SameEvaluationOrLoss(*untrained, *local_untrained,
                                                      bf16 ? 5e-2 : 1e-5, "untrained model, FSDP");
  if (!local.Train().ok()) return 1;
  const std::vector<double> a = StepLosses(fsdp), b = StepLosses(local);
  const double worst_loss = WorstRelative(a, b);
  const double worst_param = Variant().WorstParameterDifference(*fsdp_params, *local_model);
  LOG(INFO) << "world " << env->world_size << " (" << Variant().Describe() << "): FSDP losses "
            << a.front() << " ... " << a.back()
            << "; local " << b.front() << " ... " << b.back() << "; max relative difference: loss "
            << worst_loss << ", parameters " << worst_param;
  const bool ok = eval_ok && never_whole && a.size() == 5 && worst_loss < tolerance &&
                  worst_param < (bf16 ? 5e-2 : Variant().ParameterTolerance()) &&
                  adopted_difference < 1e-6 &&
                  StepLosses(seeded).size() == 5 && deferred_difference < tolerance &&
                  adopted.engine()->name() == "fsdp2";
  std::cout << (ok ? "EQUIVALENT" : "MISMATCH") << std::endl;
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace cpptrain

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return cpptrain::Run();
}
