// Chooses the engine from the training arguments' `engine` oneof (unset: local), so the
// Trainer never names an engine class. Applications may also build an engine themselves and
// hand it to the Trainer.
//
//   CT_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, CreateEngine(args));
#ifndef CPPTRAIN_ENGINES_ENGINE_FACTORY_H_
#define CPPTRAIN_ENGINES_ENGINE_FACTORY_H_

#include <memory>

#include "absl/status/statusor.h"
#include "engines/engine.h"
#include "engines/mixed_precision.h"
#include "proto/training_args.pb.h"
#include "sharding/rendezvous.h"

namespace cpptrain {

MixedPrecision MixedPrecisionFromArgs(const proto::TrainingArguments& args);

// The device of a data-parallel rank: cuda:<LOCAL_RANK> where CUDA is available (an error when
// the host has fewer GPUs than local ranks), the CPU otherwise.
absl::StatusOr<c10::Device> DataParallelDevice(const DistributedEnv& env);

absl::StatusOr<std::unique_ptr<Engine>> CreateEngine(const proto::TrainingArguments& args);

}  // namespace cpptrain

#endif  // CPPTRAIN_ENGINES_ENGINE_FACTORY_H_
