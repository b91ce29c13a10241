#include "engines/engine_factory.h"

#include <torch/cuda.h>

#include <chrono>
#include <cstdlib>
#include <mutex>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status.h"
#include "config/training_args.h"
#include "engines/ddp/ddp_engine.h"
#include "engines/fsdp/fsdp1_engine.h"
#include "engines/fsdp/fsdp2_engine.h"
#include "engines/local/local_engine.h"
#include "engines/zero/zero3_engine.h"
#include "engines/zero/zero_engine.h"
#include "sharding/device_mesh.h"
#include "sharding/flat_shard.h"
#include "sharding/fully_shard.h"
#include "sharding/local_device.h"
#include "sharding/noop_communicator.h"
#include "sharding/rendezvous.h"

namespace cpptrain {
namespace {

// One store connection per process, and a fresh key prefix for every engine created: a
// program may build several Trainers (say, one to train, one to evaluate) and every rank
// creates them in the same order, so the n-th engine's communicators meet under "engine_n"
// instead of reading the keys an earlier communicator left behind.
absl::StatusOr<c10::intrusive_ptr<c10d::Store>> NextEngineStore(const DistributedEnv& env,
                                                                std::chrono::milliseconds timeout) {
  static std::mutex mu;
  static c10::intrusive_ptr<c10d::Store> store;
  static int created = 0;
  std::lock_guard<std::mutex> lock(mu);
  if (!store) {
    CT_ASSIGN_OR_RETURN(store, ConnectStore(env, timeout));
    // Let go of at exit ahead of the static destructors: this handler runs before the one the
    // peer watchdog registered inside ConnectStore, so each rank closes its store connection
    // before its watchdog marks it finished, and rank 0 keeps hosting until then
    // (sharding/rendezvous.h's ConnectStore). It closes the connection only when nothing else
    // (a Trainer still alive at exit) holds the store; otherwise the watchdog's handler marks
    // the rank first, as before.
    std::atexit([] {
      std::lock_guard<std::mutex> lock(mu);
      store.reset();
    });
  }
  return c10::intrusive_ptr<c10d::Store>(
      c10::make_intrusive<c10d::PrefixStore>(absl::StrCat("engine_", created++), store));
}

absl::StatusOr<std::unique_ptr<Engine>> CreateDdpEngine(const proto::TrainingArguments& args,
                                                        const DistributedEnv& env,
                                                        MixedPrecision precision) {
  const std::chrono::milliseconds timeout(int64_t{args.ddp_timeout()} * 1000);
  CT_ASSIGN_OR_RETURN(const c10::Device device, DataParallelDevice(env, args.use_cpu()));
  const char* backend = device.is_cuda() ? "nccl" : "gloo";
  if (!args.ddp_backend().empty() && args.ddp_backend() != backend) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ddp_backend=\"", args.ddp_backend(), "\" but this rank trains on ", device.str(),
        ", whose communicator is ", backend, ": the backend follows the device; ",
        device.is_cuda() ? "set use_cpu=true to train over Gloo" : "run on GPUs for NCCL",
        ", or drop ddp_backend"));
  }
  CT_ASSIGN_OR_RETURN(auto store, NextEngineStore(env, timeout));
  CT_ASSIGN_OR_RETURN(
      std::unique_ptr<Communicator> comm,
      CreateCommunicatorForDevice(store, env.rank, env.world_size, device.type(), timeout));
  CT_ASSIGN_OR_RETURN(std::unique_ptr<DdpEngine> engine,
                      DdpEngine::Create(ResolvedDdpConfig(args), precision, device,
                                        std::move(comm)));
  return std::unique_ptr<Engine>(std::move(engine));
}

// No engine, or `local`: one process trains alone. Under a launcher of several processes no
// engine means DDP, as in Hugging Face's Trainer; `local` would have every rank train its own
// copy into one output_dir, so it is refused.
absl::StatusOr<std::unique_ptr<Engine>> CreateDefaultOrLocalEngine(
    const proto::TrainingArguments& args, MixedPrecision precision) {
  CT_ASSIGN_OR_RETURN(DistributedEnv env, DistributedEnvFromEnvironment());
  if (env.world_size > 1 && args.has_local()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the training arguments select the `local` engine but WORLD_SIZE=", env.world_size,
        " (from ", env.source, "): every process would train its own copy of the model into the "
        "same output_dir. Remove `local { ... }` (with several processes the default is DDP), "
        "select `ddp {}`, `fsdp {}` or `zero {}`, or start one process"));
  }
  if (env.world_size > 1) {
    CT_LOG_RANK0(INFO) << "No engine selected and WORLD_SIZE=" << env.world_size << " (from "
                       << env.source << "): training with DDP, as Hugging Face's Trainer does; "
                       << "select `ddp {}`, `fsdp {}` or `zero {}` to configure the engine";
    return CreateDdpEngine(args, env, precision);
  }
  proto::LocalEngineConfig local = args.local();
  if (args.use_cpu() && local.device() == "auto") local.set_device("cpu");
  CT_ASSIGN_OR_RETURN(std::unique_ptr<LocalEngine> engine, LocalEngine::Create(local, precision));
  return std::unique_ptr<Engine>(std::move(engine));
}

}  // namespace

MixedPrecision MixedPrecisionFromArgs(const proto::TrainingArguments& args) {
  if (args.bf16()) return MixedPrecision::kBf16;
  if (args.fp16()) return MixedPrecision::kFp16;
  return MixedPrecision::kNone;
}

absl::StatusOr<c10::Device> DataParallelDevice(const DistributedEnv& env, bool use_cpu) {
  if (use_cpu || !torch::cuda::is_available()) return c10::Device(c10::kCPU);
  CT_ASSIGN_OR_RETURN(const LocalDevice local,
                      LocalDeviceFromEnvironment(static_cast<int>(torch::cuda::device_count())));
  if (env.source != "single") {
    CT_RETURN_IF_ERROR(CheckSameLocalRank(local, env.local_rank, env.source));
  }
  return c10::Device(c10::kCUDA, local.cuda_index);
}

namespace {

// A mesh of `replicate` x `shard` ranks: 1-D over all ranks when replicate is 1; with shard 1
// (FSDP1's NO_SHARD) every rank is its own shard group, which a one-rank communicator serves
// exactly (its all-gather and reduce-scatter copy), and all ranks replicate.
absl::StatusOr<ShardMesh> CreateMesh(int replicate, int shard, const DistributedEnv& env,
                                     c10::Device device, std::chrono::milliseconds timeout) {
  CT_ASSIGN_OR_RETURN(auto store, NextEngineStore(env, timeout));
  if (replicate <= 1 || shard == 1) {
    CT_ASSIGN_OR_RETURN(
        std::unique_ptr<Communicator> comm,
        CreateCommunicatorForDevice(store, env.rank, env.world_size, device.type(), timeout));
    std::shared_ptr<Communicator> all(std::move(comm));
    if (replicate <= 1) return ShardMesh{all, nullptr};
    return ShardMesh{std::make_shared<NoopCommunicator>(0, 1), all};
  }
  CommunicatorFactory factory = [&](c10::intrusive_ptr<c10d::Store> group_store, int group_rank,
                                    int group_size) {
    return CreateCommunicatorForDevice(group_store, group_rank, group_size, device.type(), timeout);
  };
  CT_ASSIGN_OR_RETURN(
      std::unique_ptr<DeviceMesh> mesh,
      DeviceMesh::Create(store, env.rank, env.world_size, {replicate, shard}, factory));
  std::shared_ptr<DeviceMesh> owner(std::move(mesh));
  return ShardMesh{std::shared_ptr<Communicator>(owner, &owner->comm(1)),
                   std::shared_ptr<Communicator>(owner, &owner->comm(0))};
}

// The FSDP2 mesh: 1-D over all ranks, or [dp_replicate_size, dp_shard_size] for HSDP; FSDP1's
// follows sharding_strategy (Fsdp1MeshShape).
absl::StatusOr<ShardMesh> CreateShardMesh(const proto::FsdpConfig& config,
                                          const DistributedEnv& env, c10::Device device,
                                          std::chrono::milliseconds timeout) {
  if (config.version() == 1) {
    const auto [replicate, shard] = Fsdp1MeshShape(config, env.world_size, env.local_world_size);
    return CreateMesh(replicate, shard, env, device, timeout);
  }
  const int replicate = config.dp_replicate_size();
  const int shard =
      config.dp_shard_size() > 0 ? config.dp_shard_size() : env.world_size / replicate;
  return CreateMesh(replicate, shard, env, device, timeout);
}

}  // namespace

absl::StatusOr<ShardMesh> ShardMeshFromEnvironment(const proto::FsdpConfig& config,
                                                   std::chrono::milliseconds timeout,
                                                   bool use_cpu) {
  CT_ASSIGN_OR_RETURN(DistributedEnv env, DistributedEnvFromEnvironment());
  CT_ASSIGN_OR_RETURN(const c10::Device device, DataParallelDevice(env, use_cpu));
  return CreateShardMesh(config, env, device, timeout);
}

absl::StatusOr<std::unique_ptr<Engine>> CreateEngine(const proto::TrainingArguments& args,
                                                     const TrainableModel* model) {
  const MixedPrecision precision = MixedPrecisionFromArgs(args);
  const FullyShardedModel* sharded = model ? FullyShardedOf(*model) : nullptr;
  if (const FlatShardedModel* flat = model ? FlatShardedOf(*model) : nullptr) {
    if (args.engine_case() == proto::TrainingArguments::ENGINE_NOT_SET ||
        (args.has_fsdp() && args.fsdp().version() == 1)) {
      proto::FsdpConfig config = args.fsdp();
      config.set_version(1);
      CT_ASSIGN_OR_RETURN(std::unique_ptr<Fsdp1Engine> engine,
                          Fsdp1Engine::Create(config, precision, flat->device(), flat->mesh()));
      return std::unique_ptr<Engine>(std::move(engine));
    }
    return absl::InvalidArgumentError(
        "the model was flat-sharded at load time (FlatShard, FSDP1) but the training arguments "
        "select another engine: remove the engine (the Trainer adopts the flat parameters) or "
        "set `fsdp { version: 1 }`");
  }
  if (sharded != nullptr) {
    if (args.engine_case() == proto::TrainingArguments::ENGINE_NOT_SET ||
        (args.has_fsdp() && args.fsdp().version() == 2)) {
      CT_ASSIGN_OR_RETURN(std::unique_ptr<Fsdp2Engine> engine,
                          Fsdp2Engine::ForShardedModel(
                              *model, args.has_fsdp() ? &args.fsdp() : nullptr, precision));
      return std::unique_ptr<Engine>(std::move(engine));
    }
    const std::string& selected =
        args.GetDescriptor()->FindFieldByNumber(args.engine_case())->name();
    return absl::InvalidArgumentError(absl::StrCat(
        "the model was sharded at load time (FullyShard over ", sharded->mesh().world_size(),
        " ranks) but the training arguments select the `", selected,
        "` engine, which needs the whole model on every rank: remove `", selected,
        "` (the Trainer then adopts the shards) or set `fsdp { version: 2 }`"));
  }
  switch (args.engine_case()) {
    case proto::TrainingArguments::ENGINE_NOT_SET:
    case proto::TrainingArguments::kLocal:
      return CreateDefaultOrLocalEngine(args, precision);
    case proto::TrainingArguments::kDdp: {
      CT_ASSIGN_OR_RETURN(DistributedEnv env, DistributedEnvFromEnvironment());
      return CreateDdpEngine(args, env, precision);
    }
    case proto::TrainingArguments::kFsdp: {
      if (args.fsdp().version() != 1 && args.fsdp().version() != 2) break;
      CT_ASSIGN_OR_RETURN(DistributedEnv env, DistributedEnvFromEnvironment());
      const std::chrono::milliseconds timeout(int64_t{args.ddp_timeout()} * 1000);
      CT_ASSIGN_OR_RETURN(const c10::Device device, DataParallelDevice(env, args.use_cpu()));
      CT_ASSIGN_OR_RETURN(ShardMesh mesh, CreateShardMesh(args.fsdp(), env, device, timeout));
      if (args.fsdp().version() == 1) {
        CT_ASSIGN_OR_RETURN(std::unique_ptr<Fsdp1Engine> engine,
                            Fsdp1Engine::Create(args.fsdp(), precision, device, std::move(mesh)));
        return std::unique_ptr<Engine>(std::move(engine));
      }
      CT_ASSIGN_OR_RETURN(std::unique_ptr<Fsdp2Engine> engine,
                          Fsdp2Engine::Create(args.fsdp(), precision, device, std::move(mesh)));
      return std::unique_ptr<Engine>(std::move(engine));
    }
    case proto::TrainingArguments::kZero: {
      const proto::ZeroConfig& zero = args.zero();
      if (zero.stage() < 1 || zero.stage() > 3) {
        return absl::InvalidArgumentError(
            absl::StrCat("zero.stage=", zero.stage(), " is unknown: use 1, 2 or 3"));
      }
      CT_ASSIGN_OR_RETURN(DistributedEnv env, DistributedEnvFromEnvironment());
      const std::chrono::milliseconds timeout(int64_t{args.ddp_timeout()} * 1000);
      CT_ASSIGN_OR_RETURN(const c10::Device device, DataParallelDevice(env, args.use_cpu()));
      if (zero.stage() == 3) {
        CT_ASSIGN_OR_RETURN(ShardMesh mesh, CreateMesh(1, env.world_size, env, device, timeout));
        CT_ASSIGN_OR_RETURN(std::unique_ptr<Zero3Engine> engine,
                            Zero3Engine::Create(zero, precision, device, std::move(mesh)));
        return std::unique_ptr<Engine>(std::move(engine));
      }
      CT_ASSIGN_OR_RETURN(auto store, NextEngineStore(env, timeout));
      CT_ASSIGN_OR_RETURN(
          std::unique_ptr<Communicator> comm,
          CreateCommunicatorForDevice(store, env.rank, env.world_size, device.type(), timeout));
      CT_ASSIGN_OR_RETURN(std::unique_ptr<ZeroEngine> engine,
                          ZeroEngine::Create(zero, precision, device, std::move(comm)));
      return std::unique_ptr<Engine>(std::move(engine));
    }
  }
  if (args.has_fsdp()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fsdp.version=", args.fsdp().version(),
        " is unknown: set fsdp.version=1 (flat parameters) or 2 (per-parameter shards)"));
  }
  const std::string& selected = args.GetDescriptor()->FindFieldByNumber(args.engine_case())->name();
  return absl::UnimplementedError(absl::StrCat(
      "the training arguments select the `", selected,
      "` engine, which this build does not contain (`local`, `ddp`, `fsdp` versions 1 and 2 and "
      "`zero` stages 1 to 3 exist): configure one of those"));
}

}  // namespace cpptrain
