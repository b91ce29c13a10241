// Model and optimizer state in a checkpoint directory, readable by any engine on any world size.
//
// Layout of `dir`:
//   model.safetensors                 full form: every parameter whole, Hugging Face names
//                                     (tied weights once, as Hugging Face stores them)
//   shard-SSSSS-of-NNNNN.safetensors  one per shard rank: its rows of sharded tensors
//                                     ("model.<name>" in sharded form, "optimizer.<name>.<state>")
//                                     and, in shard 0, the tensors kept whole (replicated)
//   manifest.pb                       proto::CheckpointManifest: each tensor's full shape and
//                                     which rows sit in which file under which key
// FSDP writes each rank's chunks (rows [row_begin, row_begin + local_rows) of dim 0) without
// gathering them; replicated engines (local, DDP) write from rank 0. Loading reads, on each
// rank, only the rows that rank holds (all of them for a replicated engine), whatever wrote
// them: 4 FSDP ranks to 2, to one local process, and back.
//
//   CT_RETURN_IF_ERROR(SaveModelState(dir, *model, engine->optimizer(), *engine, {}));
//   ...
//   CT_RETURN_IF_ERROR(LoadModelState(dir, *model, engine->optimizer()));
#ifndef CPPTRAIN_CHECKPOINT_CHECKPOINT_H_
#define CPPTRAIN_CHECKPOINT_CHECKPOINT_H_

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engines/engine.h"
#include "models/model.h"
#include "proto/checkpoint.pb.h"

namespace cpptrain {

inline constexpr char kManifestFileName[] = "manifest.pb";
// Written last by the Trainer: its presence marks a finished checkpoint directory.
inline constexpr char kTrainerStateFileName[] = "trainer_state.textproto";

// The data file of shard rank `shard` of `shards`: shard-SSSSS-of-NNNNN.safetensors.
std::string ShardFileName(int shard, int shards);

// The shape a tensor is stored with: a 0-d tensor as one row of shape [1].
std::vector<int64_t> StoredShape(std::vector<int64_t> shape);

struct SaveModelStateOptions {
  // true: model.safetensors, gathered from the shards when the model is sharded (one tensor
  // at a time, written by rank 0). false: each shard rank writes its own rows.
  bool full_model = true;
  // Optimizer state too (when an optimizer is given).
  bool include_optimizer = true;
};

// Collective: every rank calls it with the same arguments. `dir` must exist (and be shared by
// all ranks). Returns once every rank's files and the manifest are durable.
absl::Status SaveModelState(const std::string& dir, TrainableModel& model,
                            torch::optim::Optimizer* optimizer, Engine& engine,
                            const SaveModelStateOptions& options);

// Not collective: each rank reads its own rows. Restores every parameter of `model` and, when
// `optimizer` is given and the checkpoint has its state, the optimizer's state for them.
// Errors name the directory and the tensor: a parameter the checkpoint lacks, a shape that
// differs, rows that no file holds.
absl::Status LoadModelState(const std::string& dir, TrainableModel& model,
                            torch::optim::Optimizer* optimizer);

absl::StatusOr<proto::CheckpointManifest> ReadManifest(const std::string& dir);

}  // namespace cpptrain

#endif  // CPPTRAIN_CHECKPOINT_CHECKPOINT_H_
