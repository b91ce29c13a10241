// The data files of one checkpoint directory, read through its manifest: each file opened once,
// each piece (a tensor stored under one key of one file) verified once against its checksums,
// and rows of a tensor read or visited across whatever pieces hold them. Private to
// checkpoint/ (checkpoint.cc and the verification behind tools/ckpt verify).
//
//   CheckpointFiles files(dir, manifest);
//   CT_RETURN_IF_ERROR(files.VerifyPiece(tensor, tensor.pieces(0)));
//   CT_ASSIGN_OR_RETURN(at::Tensor rows, files.Rows(tensor, /*begin=*/0, /*rows=*/4));
#ifndef CPPTRAIN_CHECKPOINT_INTERNAL_CHECKPOINT_FILES_H_
#define CPPTRAIN_CHECKPOINT_INTERNAL_CHECKPOINT_FILES_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/safetensors.h"
#include "proto/checkpoint.pb.h"

namespace cpptrain {
namespace checkpoint_internal {

// What verifying one piece found.
struct PieceCheck {
  std::optional<uint32_t> manifest_crc32c;  // what manifest.pb records
  std::optional<uint32_t> header_crc32c;    // what the file's header records
  std::optional<uint32_t> computed_crc32c;  // of the bytes now in the file (when they were read)
  int64_t bytes = 0;
  absl::Status status;  // DataLoss naming the directory, the file and the tensor
};

class CheckpointFiles {
 public:
  explicit CheckpointFiles(std::string dir) : dir_(std::move(dir)) {}

  const std::string& dir() const { return dir_; }

  // Checks the piece: its file opens, holds the key with the manifest's dtype and the piece's
  // shape, and the bytes' CRC-32C equals the checksums recorded (the manifest's and the
  // header's, whichever exist; both must agree). Each piece is checked once; later calls return
  // the first result.
  const PieceCheck& VerifyPiece(const proto::CheckpointTensor& t, const proto::TensorPiece& piece);

  // Pieces verified so far that had no checksum to compare with (older checkpoints), and the
  // bytes checksummed.
  int64_t unchecksummed_pieces() const { return unchecksummed_pieces_; }
  int64_t checksummed_bytes() const { return checksummed_bytes_; }

  // Calls `visit` with each piece holding rows of [begin, begin + rows) of `t`, and a read-only
  // view of those rows ([b - a, ...], rows [a, b) of the tensor). Stops at the first error.
  absl::Status ForEachSlice(
      const proto::CheckpointTensor& t, int64_t begin, int64_t rows,
      const std::function<absl::Status(const proto::TensorPiece& piece, int64_t a, int64_t b,
                                       const at::Tensor& slice)>& visit);

  // Rows [begin, begin + rows) of `t` in a new tensor shaped [rows, ...] (the stored shape's
  // other dims). DataLoss when the pieces do not cover them.
  absl::StatusOr<at::Tensor> Rows(const proto::CheckpointTensor& t, int64_t begin, int64_t rows);

  // The data file `name` of the directory, opened on first use. DataLoss naming it when it is
  // missing or does not open.
  absl::StatusOr<const SafetensorsFile*> File(const std::string& name);

 private:
  std::string dir_;
  std::map<std::string, std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::pair<std::string, std::string>, PieceCheck> checked_;  // by (file, key)
  int64_t unchecksummed_pieces_ = 0;
  int64_t checksummed_bytes_ = 0;
};

// How errors name a manifest tensor: a parameter by its name ("model.norm.weight" for the entry
// "model.model.norm.weight"), optimizer state by its entry ("optimizer.<parameter>.<state>").
std::string TensorDisplayName(const std::string& manifest_name);

// DataLoss naming `name` and where the first bad value is, when the floating tensor `values`
// (rows [row_offset, ...) of it) holds NaN or infinity. Other dtypes pass.
absl::Status CheckFinite(const std::string& where, const std::string& name,
                         const at::Tensor& values, int64_t row_offset);

}  // namespace checkpoint_internal
}  // namespace cpptrain

#endif  // CPPTRAIN_CHECKPOINT_INTERNAL_CHECKPOINT_FILES_H_
