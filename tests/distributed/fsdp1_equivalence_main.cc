// Run under //tools:launch with N processes (Gloo on the CPU). Checks the FSDP1 engine
// (fsdp { version: 1 }, flat parameters) against one process, through the Trainer:
//   1. evaluate() and predict() on an untrained model, before any train(): no optimizer, no
//      gradients; each unit's flat parameter gathered for its forward and freed after (at most
//      the root and two units at once); results equal one process's.
//   2. train() on the same Trainer afterwards reuses those flat shards: per-device batch 2,
//      accumulation 2 (the first micro-batch of each step does not communicate unless
//      --sync_each_batch), 5 steps; rank 0 then trains the LocalEngine on the concatenated
//      batches and compares every logged loss and every parameter (gathered from the flat
//      shards). The tiny decoder's parameter sizes are not multiples of 3 or 4, so flat
//      parameters are padded and pieces of one parameter straddle ranks.
//   3. a model flat-sharded at load time (FlatShard before any Trainer), handed to a Trainer
//      that names no engine: the Trainer adopts it (engine fsdp1) and trains to the same losses.
// Variants: --strategy=FULL_SHARD|SHARD_GRAD_OP|NO_SHARD|HYBRID_SHARD|HYBRID_SHARD_ZERO2
// (hybrid: a 2 x N/2 mesh), --backward_prefetch=BACKWARD_PRE|BACKWARD_POST|NO_PREFETCH,
// --forward_prefetch, --checkpointing, --offload, --sync_each_batch, --wrap=none|size, and
// those of equivalence_variant.h (AdamW, frozen parameters, uneven batches).
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
#include "sharding/flat_shard.h"
#include "sharding/rendezvous.h"
#include "tests/distributed/equivalence_variant.h"
#include "trainer/testing/trainer_testing.h"
#include "trainer/trainer.h"

ABSL_FLAG(std::string, output_dir, "/tmp/fsdp1_equivalence", "where the Trainer writes");
ABSL_FLAG(std::string, strategy, "FULL_SHARD", "fsdp.sharding_strategy");
ABSL_FLAG(std::string, backward_prefetch, "BACKWARD_PRE", "fsdp.backward_prefetch");
ABSL_FLAG(bool, forward_prefetch, false, "fsdp.forward_prefetch");
ABSL_FLAG(std::string, wrap, "transformer", "transformer, size or none");
ABSL_FLAG(bool, checkpointing, false, "fsdp.activation_checkpointing");
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

std::unique_ptr<Trainer> MakeTrainer(const proto::TrainingArguments& args,
                                     std::shared_ptr<TrainableModel> model,
                                     std::shared_ptr<const Dataset> eval = nullptr,
                                     std::unique_ptr<Engine> engine = nullptr) {
  return Variant().MakeTrainer(args, std::move(model), Variant().TrainData(), std::move(eval),
                               std::move(engine));
}

proto::TrainingArguments Args(int per_device_batch, const std::string& dir,
                              bool distributed = true) {
  proto::TrainingArguments args = Variant().Args(per_device_batch, dir, distributed);
  args.set_per_device_eval_batch_size(2);
  return args;
}

proto::FsdpConfig Fsdp1Config(int world) {
  proto::FsdpConfig fsdp;
  fsdp.set_version(1);
  proto::FsdpConfig::ShardingStrategy strategy;
  CHECK(proto::FsdpConfig::ShardingStrategy_Parse(absl::GetFlag(FLAGS_strategy), &strategy))
      << "--strategy=" << absl::GetFlag(FLAGS_strategy);
  fsdp.set_sharding_strategy(strategy);
  proto::FsdpConfig::BackwardPrefetch prefetch;
  CHECK(
      proto::FsdpConfig::BackwardPrefetch_Parse(absl::GetFlag(FLAGS_backward_prefetch), &prefetch))
      << "--backward_prefetch=" << absl::GetFlag(FLAGS_backward_prefetch);
  fsdp.set_backward_prefetch(prefetch);
  fsdp.set_forward_prefetch(absl::GetFlag(FLAGS_forward_prefetch));
  const std::string wrap = absl::GetFlag(FLAGS_wrap);
  if (wrap == "none") {
    fsdp.set_auto_wrap_policy(proto::FsdpConfig::NO_WRAP);
  } else if (wrap == "size") {
    fsdp.set_auto_wrap_policy(proto::FsdpConfig::SIZE_BASED_WRAP);
    fsdp.set_min_num_params(5000);  // a layer holds 12,352; the MLP alone 6,144
  }
  if (strategy == proto::FsdpConfig::HYBRID_SHARD ||
      strategy == proto::FsdpConfig::HYBRID_SHARD_ZERO2) {
    fsdp.set_dp_replicate_size(2);
    fsdp.set_dp_shard_size(world / 2);
  }
  fsdp.set_activation_checkpointing(absl::GetFlag(FLAGS_checkpointing));
  fsdp.set_offload_params(absl::GetFlag(FLAGS_offload));
  return fsdp;
}

proto::TrainingArguments Fsdp1Args(const std::string& dir, int world) {
  proto::TrainingArguments args = Args(2, dir);
  *args.mutable_fsdp() = Fsdp1Config(world);
  args.mutable_accelerator_config()->mutable_gradient_accumulation_kwargs()->set_sync_each_batch(
      absl::GetFlag(FLAGS_sync_each_batch));
  return args;
}

// Every parameter's full value, gathered from the flat shards (all ranks take part).
absl::StatusOr<std::vector<torch::Tensor>> FullParameters(DecoderLM& model) {
  FlatShardedModel* flat = FlatShardedOf(model);
  if (flat == nullptr) return absl::InternalError("the model is not flat-sharded");
  std::vector<torch::Tensor> out;
  for (const auto& p : model.parameters()) {
    CT_ASSIGN_OR_RETURN(torch::Tensor full, flat->GatherFull(p));
    out.push_back(full.to(torch::kFloat));
  }
  return out;
}

// 3: FlatShard at load time, then a Trainer with no engine configured adopts it.
absl::StatusOr<std::vector<double>> TrainAdopted(const DistributedEnv& env,
                                                 const std::string& dir) {
  auto preloaded = Model();
  const proto::FsdpConfig config = Fsdp1Config(env.world_size);
  CT_ASSIGN_OR_RETURN(ShardMesh mesh, ShardMeshFromEnvironment(config, std::chrono::seconds(60),
                                                               Variant().use_cpu));
  FlatShardOptions options;
  options.reshard_after_forward = config.sharding_strategy() == proto::FsdpConfig::FULL_SHARD ||
                                  config.sharding_strategy() == proto::FsdpConfig::HYBRID_SHARD;
  CT_RETURN_IF_ERROR(FlatShard(*preloaded, mesh, options).status());
  proto::TrainingArguments plain = Args(2, absl::StrCat(dir, "/preloaded_rank", env.rank));
  std::unique_ptr<Trainer> adopted = MakeTrainer(plain, preloaded);
  CT_RETURN_IF_ERROR(adopted->Train().status());
  if (adopted->engine()->name() != "fsdp1") {
    return absl::InternalError(absl::StrCat("adopted by ", adopted->engine()->name()));
  }
  return StepLosses(*adopted);
}

int Run() {
  auto env = DistributedEnvFromEnvironment();
  if (!env.ok()) return Fail(env.status(), "environment");
  InitLogging("fsdp1_equivalence", env->rank);
  const std::string dir = absl::GetFlag(FLAGS_output_dir);
  constexpr double kTolerance = 1e-5;

  auto model = Model();
  std::unique_ptr<Trainer> fsdp_trainer =
      MakeTrainer(Fsdp1Args(absl::StrCat(dir, "/fsdp1_rank", env->rank), env->world_size), model,
                  Variant().EvalData());
  Trainer& fsdp = *fsdp_trainer;
  auto untrained = Variant().Evaluation(fsdp);
  if (!untrained.ok()) return Fail(untrained.status(), "evaluate/predict before train");
  FlatShardedModel* flat = FlatShardedOf(*model);
  if (flat == nullptr) return Fail(absl::InternalError("not flat-sharded"), "evaluate");
  const int peak = flat->peak_unsharded();
  const bool never_whole = flat->num_groups() < 4 || peak <= 3;
  LOG(INFO) << "evaluation held at most " << peak << " of " << flat->num_groups()
            << " flat parameters unsharded at once; peak parameter storage "
            << flat->peak_parameter_bytes() << " bytes, flat shards " << flat->shard_bytes();
  auto trained = fsdp.Train();
  if (!trained.ok()) return Fail(trained.status(), "FSDP1 training");
  if (fsdp.engine()->name() != "fsdp1") {
    return Fail(absl::InternalError(fsdp.engine()->name()), "engine is not fsdp1");
  }
  auto fsdp_params = FullParameters(*model);
  if (!fsdp_params.ok()) return Fail(fsdp_params.status(), "gathering parameters");

  auto adopted = TrainAdopted(*env, dir);
  if (!adopted.ok()) return Fail(adopted.status(), "training a model flat-sharded at load time");
  const double adopted_difference = WorstRelative(*adopted, StepLosses(fsdp));
  LOG(INFO) << "flat-sharded at load time, no engine configured: losses differ from the "
               "configured FSDP1 run by "
            << adopted_difference;

  if (env->rank != 0) return 0;
  auto local_model = Model();
  proto::TrainingArguments local_args = Args(2 * env->world_size, dir + "/local", false);
  local_args.set_per_device_eval_batch_size(5);
  std::unique_ptr<Trainer> local_trainer =
      MakeTrainer(local_args, local_model, Variant().EvalData(),
                  std::move(*LocalEngine::Create(Variant().LocalConfig(), MixedPrecision::kNone)));
  Trainer& local = *local_trainer;
  auto local_untrained = Variant().Evaluation(local);
  if (!local_untrained.ok()) return Fail(local_untrained.status(), "local evaluation");
  const bool eval_ok = Variant().SameEvaluationOrLoss(*untrained, *local_untrained, kTolerance,
                                                      "untrained model, FSDP1");
  if (!local.Train().ok()) return 1;
  const std::vector<double> a = StepLosses(fsdp), b = StepLosses(local);
  const double worst_loss = WorstRelative(a, b);
  const double worst_param = Variant().WorstParameterDifference(*fsdp_params, *local_model);
  LOG(INFO) << "world " << env->world_size << " (" << absl::GetFlag(FLAGS_strategy) << ", "
            << absl::GetFlag(FLAGS_backward_prefetch) << ", " << Variant().Describe()
            << "): FSDP1 losses " << a.front() << " ... " << a.back() << "; local " << b.front()
            << " ... " << b.back() << "; max relative difference: loss " << worst_loss
            << ", parameters " << worst_param;
  const bool ok = eval_ok && never_whole && a.size() == 5 && worst_loss < kTolerance &&
                  worst_param < Variant().ParameterTolerance() && adopted_difference < 1e-6;
  std::cout << (ok ? "EQUIVALENT" : "MISMATCH") << std::endl;
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace cpptrain

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return cpptrain::Run();
}
