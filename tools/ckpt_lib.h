// What //tools:ckpt does, as a library: inspect a checkpoint directory (checkpoint/checkpoint.h)
// or a Hugging Face model directory, and convert between the full form (model.safetensors) and
// the sharded form (shard-SSSSS-of-NNNNN.safetensors + manifest.pb) that FullyShard ranks load.
//
// Both conversions stream: each output file's entries are declared first, then each tensor is
// read (a view of the memory-mapped input, or assembled from its pieces) and appended, so
// memory stays bounded by the largest tensor, not the model. Outputs are atomic.
//
//   CT_RETURN_IF_ERROR(InspectCheckpoint("/ckpt/checkpoint-100", std::cout));
//   CT_ASSIGN_OR_RETURN(ConvertResult sharded, ConvertToSharded("/hf/qwen3", "/ckpt/q8", 8));
//   CT_ASSIGN_OR_RETURN(ConvertResult full, ConvertToFull("/ckpt/q8", "/hf/qwen3-tuned"));
#ifndef CPPTRAIN_TOOLS_CKPT_LIB_H_
#define CPPTRAIN_TOOLS_CKPT_LIB_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "sharding/shard_rows.h"

namespace cpptrain {

// Writes a human-readable summary of `dir` to `out`. A checkpoint directory (one with
// manifest.pb): engine, world size, one line per tensor (name, dtype, shape, pieces, files,
// CRC-32C, whether it verifies), totals, and which of model.safetensors,
// trainer_state.textproto, rng_state_*.safetensors and the data files the manifest names
// exist. A Hugging Face model directory (model.safetensors or model.safetensors.index.json):
// one line per tensor (with its stored CRC-32C, if any, and whether it verifies) and totals.
// Both end with the verification (checkpoint/verify.h: every byte read) and its problems; a
// failed verification is printed, not returned (VerifyDirectory returns it).
absl::Status InspectCheckpoint(const std::string& dir, std::ostream& out);

// ckpt verify: reads every byte of `dir` (VerifyCheckpoint), writes the summary and every
// problem to `out`, and returns DataLoss naming the first problem when there is any.
absl::Status VerifyDirectory(const std::string& dir, std::ostream& out);

// What a conversion wrote.
struct ConvertResult {
  int64_t tensors = 0;
  int64_t bytes = 0;               // the output files' sizes on disk, manifest included
  std::vector<std::string> files;  // their paths, in the order written
};

// Writes `out_dir`/model.safetensors holding the model tensors of `dir` under their parameter
// (Hugging Face) names: a checkpoint's "model.<name>" entries, assembled from whatever pieces
// hold them (full or sharded, any world size), or every tensor of a Hugging Face directory.
// Beside it, config.json and generation_config.json (with the token ids), so transformers'
// from_pretrained loads `out_dir` as it is: written from a checkpoint's decoder config, or the
// Hugging Face directory's own files copied. Optimizer state and every other file are left out.
// `out_dir` is created if missing; it must not be `dir` nor already hold a model or checkpoint
// file.
absl::StatusOr<ConvertResult> ConvertToFull(const std::string& dir, const std::string& out_dir);

// Both conversions verify the model tensors they read first (VerifyCheckpoint) and refuse a
// damaged input, so damaged bytes never get fresh checksums.
//
// Writes the model tensors of `dir` (as ConvertToFull reads them) in the sharded form for
// `ranks` shard ranks: `out_dir`/shard-0000r-of-0000N.safetensors holds, under
// "model.<name>", rows ShardRowRange(rows, ranks, r) of each tensor (empty ranges are left
// out of the file and the manifest; a file with nothing to hold is not written); a 0-d tensor
// is stored whole as shape [1] in shard 0. `out_dir`/manifest.pb, written last, lists every
// tensor with its full shape and pieces (and their checksums, format 2), and the decoder config
// of `dir` (its manifest's, or its config.json), so LoadModelState reads it on any world size
// and ConvertToFull of it writes config.json again.
absl::StatusOr<ConvertResult> ConvertToSharded(const std::string& dir, const std::string& out_dir,
                                               int ranks);

}  // namespace cpptrain

#endif  // CPPTRAIN_TOOLS_CKPT_LIB_H_
