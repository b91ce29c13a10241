// Chooses the engine from the training arguments' `engine` oneof, so the Trainer never names
// an engine class. Unset: local for one process, DDP under a launcher of several (WORLD_SIZE > 1,
// as Hugging Face's Trainer), where an explicit `local` is an error. Applications may also build an engine themselves and
// hand it to the Trainer.
//
//   CT_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, CreateEngine(args));
#ifndef CPPTRAIN_ENGINES_ENGINE_FACTORY_H_
#define CPPTRAIN_ENGINES_ENGINE_FACTORY_H_

#include <chrono>
#include <memory>

#include "absl/status/statusor.h"
#include "engines/engine.h"
#include "engines/mixed_precision.h"
#include "proto/training_args.pb.h"
#include "sharding/fully_shard.h"
#include "sharding/rendezvous.h"

namespace cpptrain {

MixedPrecision MixedPrecisionFromArgs(const proto::TrainingArguments& args);

// The device of a data-parallel rank: where CUDA is available, the GPU of its local rank
// (LocalDeviceFromEnvironment, sharding/local_device.h: cuda:<local rank>, or cuda:0 with one
// GPU per task; an error when the local rank has no GPU, or when a LOCAL_RANK disagrees with
// `env`'s launcher); the CPU otherwise or with `use_cpu`.
absl::StatusOr<c10::Device> DataParallelDevice(const DistributedEnv& env, bool use_cpu = false);

// The FSDP mesh for this process from the launcher's environment (1-D over all ranks, or
// dp_replicate_size x dp_shard_size), on the data-parallel device (the CPU with use_cpu, as
// TrainingArguments.use_cpu). For applications that
// shard a model at load time, before any Trainer:
//
//   CT_ASSIGN_OR_RETURN(ShardMesh mesh, ShardMeshFromEnvironment(fsdp, std::chrono::minutes(30)));
//   CT_RETURN_IF_ERROR(FullyShard(*model, mesh, options).status());
absl::StatusOr<ShardMesh> ShardMeshFromEnvironment(const proto::FsdpConfig& config,
                                                   std::chrono::milliseconds timeout,
                                                   bool use_cpu = false);

// With `model` sharded at load time (FullyShard), an unset engine means FSDP2 over the
// model's own mesh, `fsdp` adopts those shards, and `local`/`ddp` are an error that says so.
absl::StatusOr<std::unique_ptr<Engine>> CreateEngine(const proto::TrainingArguments& args,
                                                     const TrainableModel* model = nullptr);

}  // namespace cpptrain

#endif  // CPPTRAIN_ENGINES_ENGINE_FACTORY_H_
