// Verifies every byte of a checkpoint directory (or a Hugging Face model directory) without a
// model: each piece's CRC-32C against the manifest and its file's header, the pieces tiling each
// tensor, floating values finite, and for Trainer checkpoints trainer_state.textproto's
// checksum and every rng_state file. tools/ckpt verify and inspect print the report.
//
//   CT_ASSIGN_OR_RETURN(CheckpointVerification report, VerifyCheckpoint(dir));
//   for (const absl::Status& problem : report.problems) std::cerr << problem << "\n";
//
// Cost: one read of every byte (CRC-32C at several GB/s with SSE4.2; then a pass of isfinite
// over floating tensors).
#ifndef CPPTRAIN_CHECKPOINT_VERIFY_H_
#define CPPTRAIN_CHECKPOINT_VERIFY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace cpptrain {

// What verification found for one piece: a tensor, or one shard of it, in one file.
struct PieceVerification {
  std::string tensor;  // checkpoints: model.<parameter>, optimizer.<parameter>.<state>
  std::string file;
  std::string key;
  std::optional<uint32_t> manifest_crc32c;
  std::optional<uint32_t> header_crc32c;
  std::optional<uint32_t> computed_crc32c;  // set when its bytes were read
  int64_t bytes = 0;
  absl::Status status;  // OK, or what is wrong with it
};

struct CheckpointVerification {
  bool is_checkpoint = true;              // false: a Hugging Face model directory (no manifest)
  int format_version = 0;                 // of the manifest
  std::vector<PieceVerification> pieces;  // in manifest (or name) order
  std::vector<absl::Status> problems;     // every error found, the pieces' and the others'
  int64_t checksummed_bytes = 0;
  int64_t unchecksummed_pieces = 0;  // no checksum anywhere to compare with
  double seconds = 0;                // spent reading and checking
};

// `dir` is a checkpoint directory (manifest.pb; a Trainer checkpoint, with
// trainer_state.textproto, whose manifest is missing is a DataLoss error naming it) or a Hugging
// Face model directory. Only tensors
// whose manifest name starts with `tensor_prefix` are read ("model." for the model alone; the
// Trainer's other files are then not checked). Errors only when `dir` is neither kind or its
// manifest cannot be read (damaged: DataLoss); everything else is in the report.
absl::StatusOr<CheckpointVerification> VerifyCheckpoint(const std::string& dir,
                                                        const std::string& tensor_prefix = "");

}  // namespace cpptrain

#endif  // CPPTRAIN_CHECKPOINT_VERIFY_H_
