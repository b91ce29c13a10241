// Model and optimizer state in a checkpoint directory, readable by any engine on any world size,
// with a checksum per tensor verified on load and loading as strict as PyTorch's
// load_state_dict(strict=True).
//
// Layout of `dir`:
//   model.safetensors                 full form: every parameter whole, Hugging Face names
//                                     (tied weights once, as Hugging Face stores them)
//   shard-SSSSS-of-NNNNN.safetensors  one per shard rank: its rows of sharded tensors
//                                     ("model.<name>" in sharded form, "optimizer.<name>.<state>")
//                                     and, in shard 0, the tensors kept whole (replicated)
//   manifest.pb                       proto::CheckpointManifest (checkpoint/manifest.h): each
//                                     tensor's full shape, which rows sit in which file under
//                                     which key with which CRC-32C, the decoder's config
// FSDP writes each rank's chunks (rows [row_begin, row_begin + local_rows) of dim 0) without
// gathering them; replicated engines (local, DDP) write from rank 0. Loading reads, on each
// rank, only the rows that rank holds (all of them for a replicated engine), whatever wrote
// them: 4 FSDP ranks to 2, to one local process, and back.
//
// Integrity: each tensor's CRC-32C is computed as its bytes stream out and stored twice, in the
// manifest and in its file's safetensors header ("crc32c.<key>" in __metadata__); the manifest
// carries its own. Loading verifies every piece it reads rows of (the whole piece) and that
// the values are finite, before anything is copied; a checkpoint without checksums (manifest
// format 1) loads with one warning.
//
//   SaveModelStateOptions options;
//   options.engine_name = engine->name();
//   CT_RETURN_IF_ERROR(SaveModelState(dir, *model, engine->optimizer(), *engine, options));
//   ...
//   CT_RETURN_IF_ERROR(LoadModelState(dir, *model, engine->optimizer()));
//
// checkpoint/verify.h reads every byte of a directory without a model (tools/ckpt verify).
#ifndef CPPTRAIN_CHECKPOINT_CHECKPOINT_H_
#define CPPTRAIN_CHECKPOINT_CHECKPOINT_H_

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/manifest.h"
#include "sharding/host_group.h"
#include "module/trainable_model.h"
#include "proto/checkpoint.pb.h"

namespace cpptrain {

struct SaveModelStateOptions {
  // true: model.safetensors, gathered from the shards when the model is sharded (one tensor
  // at a time, written by rank 0). false: each shard rank writes its own rows.
  bool full_model = true;
  // Optimizer state too (when an optimizer is given).
  bool include_optimizer = true;
  // Recorded in the manifest: which engine wrote the checkpoint (e.g. "fsdp2").
  std::string engine_name = "local";
};

// Collective: every rank calls it with the same arguments. `dir` must exist (and be shared by
// all ranks). Returns once every rank's files and the manifest are durable. The ranks' checksums
// reach rank 0's manifest through one AllReduceSum. A write that fails on one rank (a full
// disk) fails the save on every rank, within the collectives the save issues anyway: that rank
// returns its own error, the others one naming it and its message ("rank 1 failed: ...",
// sharding/all_ranks_ok.h).
absl::Status SaveModelState(const std::string& dir, TrainableModel& model,
                            torch::optim::Optimizer* optimizer, HostGroup& ranks,
                            const SaveModelStateOptions& options);

struct LoadModelStateOptions {
  // true, like load_state_dict(strict=True): tensors of the checkpoint the model has no
  // parameter for, parameters the checkpoint lacks, shapes that differ, decoder config fields
  // that differ (the manifest's, or config.json's in older checkpoints) and optimizer state the
  // optimizer does not keep are one error listing them all, before anything is loaded. false
  // (TrainingArguments.load_strict): one warning each, and what matches loads. Damage (a
  // checksum mismatch, non-finite values) is an error either way.
  bool strict = true;
  // VerifyModelState passed for this directory, model and optimizer on this rank: skip the
  // checksum and finite checks, which would read every byte again.
  bool verified = false;
};

// Not collective, changes nothing: checks everything LoadModelState reads on this rank. The
// manifest's own checksum; for each piece this rank reads rows of, its dtype and shape and the
// CRC-32C of all its bytes (against the manifest's and the header's); that those rows are
// finite; and, by `options.strict`, the match with the model and the optimizer. Errors:
// DataLoss when the checkpoint is damaged (naming the directory, the file, the tensor, and both
// checksums or the bad value), InvalidArgument when it does not match the model.
absl::Status VerifyModelState(const std::string& dir, TrainableModel& model,
                              torch::optim::Optimizer* optimizer,
                              const LoadModelStateOptions& options = {});

// Not collective: each rank reads its own rows; callers on several ranks agree on the outcome
// (AllRanksOk, sharding/all_ranks_ok.h) before their next collective. Restores every parameter
// of `model` and, when `optimizer` is given and the checkpoint has its state, the optimizer's
// state for them. Checks as VerifyModelState first (unless options.verified), so an error
// leaves the model as it was; only an optimizer that refuses the state it is given fails after
// parameters were copied.
absl::Status LoadModelState(const std::string& dir, TrainableModel& model,
                            torch::optim::Optimizer* optimizer,
                            const LoadModelStateOptions& options = {});

}  // namespace cpptrain

#endif  // CPPTRAIN_CHECKPOINT_CHECKPOINT_H_
