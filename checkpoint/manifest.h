// manifest.pb, the index of a checkpoint directory (proto::CheckpointManifest: each tensor's
// full shape, which rows sit in which file, each piece's CRC-32C), written with a checksum of
// its own so that damaged bytes are told apart from a manifest of another model.
//
//   CT_RETURN_IF_ERROR(WriteManifest(dir, manifest));         // format 2, checksummed
//   CT_ASSIGN_OR_RETURN(proto::CheckpointManifest m, ReadManifest(dir));
//
// Format 2 (written here): the serialized manifest, then its CRC-32C as field manifest_crc32c,
// appended last (the final 5 bytes: tag 0x7d, the value little-endian). Format 1 (older
// checkpoints) has no checksums anywhere and is read as it is.
#ifndef CPPTRAIN_CHECKPOINT_MANIFEST_H_
#define CPPTRAIN_CHECKPOINT_MANIFEST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/checkpoint.pb.h"

namespace cpptrain {

inline constexpr char kManifestFileName[] = "manifest.pb";
// Written last by the Trainer: its presence marks a finished checkpoint directory.
inline constexpr char kTrainerStateFileName[] = "trainer_state.textproto";
// The first format with checksums (pieces, manifest) and the decoder config.
inline constexpr int kManifestFormatWithChecksums = 2;

// The data file of shard rank `shard` of `shards`: shard-SSSSS-of-NNNNN.safetensors.
std::string ShardFileName(int shard, int shards);

// The shape a tensor is stored with: a 0-d tensor as one row of shape [1].
std::vector<int64_t> StoredShape(std::vector<int64_t> shape);

// The bytes of manifest.pb for `manifest`, in format 2 (format_version set, manifest_crc32c
// computed and appended).
std::string ManifestBytes(proto::CheckpointManifest manifest);

// ManifestBytes(manifest) written atomically to `dir`/manifest.pb.
absl::Status WriteManifest(const std::string& dir, const proto::CheckpointManifest& manifest);

// Reads `dir`/manifest.pb. A damaged file is a DataLoss error naming it and saying what is
// wrong: "corrupted (could not be parsed)", "corrupted (checksum mismatch: ...)", or a format-2
// manifest without its trailing checksum ("corrupted (truncated?)"); so is a manifest.pb that is
// not a regular file (CheckpointFilePath: a link, a FIFO, a directory), and a missing one in a
// finished Trainer checkpoint (trainer_state.textproto present). Missing elsewhere: NotFound.
absl::StatusOr<proto::CheckpointManifest> ReadManifest(const std::string& dir);

// Whether the manifest carries checksums (format 2 or later).
bool HasChecksums(const proto::CheckpointManifest& manifest);

// A text file of a checkpoint (trainer_state.textproto) as written: `text`, then the comment
// line "# crc32c <8 hex digits> of the lines above" (text-format parsers skip it).
std::string WithChecksumLine(const std::string& text);

// The text of `path` without its checksum line, verified; DataLoss naming the file when the
// checksum does not match, or when the line is missing and `required` (the checkpoint's
// manifest is of format 2, which writes it; older files have none).
absl::StatusOr<std::string> ReadChecksummedText(const std::string& path, bool required);

// trainer_state.textproto at `path` (ReadChecksummedText, then the text format): DataLoss
// naming the file when the checksum fails or the text does not parse as a
// TrainerCheckpointState (with the parser's first error, line:column).
absl::StatusOr<proto::TrainerCheckpointState> ReadTrainerState(const std::string& path,
                                                               bool required);

}  // namespace cpptrain

#endif  // CPPTRAIN_CHECKPOINT_MANIFEST_H_
