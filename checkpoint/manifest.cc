#include "checkpoint/manifest.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "base/status.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/files.h"

namespace cpptrain {
namespace {

// Field 15 (manifest_crc32c), wire type 5 (fixed32): (15 << 3) | 5.
constexpr unsigned char kChecksumTag = 0x7d;
constexpr size_t kChecksumBytes = 5;
constexpr char kChecksumLine[] = "# crc32c ";

// Keeps the text-format parser's first error instead of logging it.
class FirstError : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (error_.empty()) error_ = absl::StrCat(line + 1, ":", column + 1, ": ", message);
  }
  void AddWarning(int, google::protobuf::io::ColumnNumber, const std::string&) override {}
  const std::string& error() const { return error_; }

 private:
  std::string error_;
};

std::string Where(const std::string& dir) {
  return absl::StrCat("checkpoint manifest '", dir, "/", kManifestFileName, "' is ");
}

}  // namespace

std::string ShardFileName(int shard, int shards) {
  return absl::StrFormat("shard-%05d-of-%05d.safetensors", shard, shards);
}

std::vector<int64_t> StoredShape(std::vector<int64_t> shape) {
  if (shape.empty()) shape.push_back(1);
  return shape;
}

std::string ManifestBytes(proto::CheckpointManifest manifest) {
  manifest.set_format_version(kManifestFormatWithChecksums);
  manifest.clear_manifest_crc32c();
  std::string bytes = manifest.SerializeAsString();
  const uint32_t crc = Crc32c(bytes);
  bytes.push_back(static_cast<char>(kChecksumTag));
  char value[4];
  std::memcpy(value, &crc, 4);  // little-endian, as protobuf's fixed32
  bytes.append(value, 4);
  return bytes;
}

absl::Status WriteManifest(const std::string& dir, const proto::CheckpointManifest& manifest) {
  return WriteFileAtomically(absl::StrCat(dir, "/", kManifestFileName), ManifestBytes(manifest));
}

bool HasChecksums(const proto::CheckpointManifest& manifest) {
  return manifest.format_version() >= kManifestFormatWithChecksums;
}

std::string WithChecksumLine(const std::string& text) {
  return absl::StrCat(text, kChecksumLine, Crc32cHex(Crc32c(text)), " of the lines above\n");
}

absl::StatusOr<std::string> ReadChecksummedText(const std::string& path, bool required) {
  const size_t slash = path.find_last_of('/');
  CT_ASSIGN_OR_RETURN(std::string text,
                      slash == std::string::npos
                          ? ReadCheckpointFile(".", path)
                          : ReadCheckpointFile(path.substr(0, slash), path.substr(slash + 1)));
  const size_t line = text.rfind(kChecksumLine);
  if (line == std::string::npos || (line > 0 && text[line - 1] != '\n')) {
    if (!required) return text;
    return absl::DataLossError(
        absl::StrCat("'", path,
                     "' is corrupted (its checksum line is missing: truncated?); use another "
                     "checkpoint"));
  }
  const std::optional<uint32_t> stored =
      ParseCrc32cHex(absl::string_view(text).substr(line + sizeof(kChecksumLine) - 1, 8));
  text.resize(line);
  const uint32_t computed = Crc32c(text);
  if (!stored.has_value() || *stored != computed) {
    return absl::DataLossError(
        absl::StrCat("'", path, "' is corrupted (checksum mismatch: expected crc32c ",
                     stored ? Crc32cHex(*stored) : "(unreadable)", ", computed ",
                     Crc32cHex(computed), "); use another checkpoint"));
  }
  return text;
}

absl::StatusOr<proto::TrainerCheckpointState> ReadTrainerState(const std::string& path,
                                                               bool required) {
  CT_ASSIGN_OR_RETURN(std::string text, ReadChecksummedText(path, required));
  proto::TrainerCheckpointState state;
  FirstError errors;
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, &state)) {
    return absl::DataLossError(absl::StrCat("'", path,
                                            "' is corrupted (could not be parsed as "
                                            "TrainerCheckpointState: ",
                                            errors.error(), "); use another checkpoint"));
  }
  return state;
}

absl::StatusOr<proto::CheckpointManifest> ReadManifest(const std::string& dir) {
  absl::StatusOr<std::string> bytes = ReadCheckpointFile(dir, kManifestFileName);
  if (absl::IsNotFound(bytes.status()) &&
      CheckpointFilePath(dir, kTrainerStateFileName).ok()) {
    // trainer_state.textproto is written after the manifest: this checkpoint was finished.
    return absl::DataLossError(absl::StrCat(
        Where(dir), "missing, but ", kTrainerStateFileName,
        " beside it marks a finished checkpoint (the Trainer writes it after the manifest): the "
        "manifest was lost or removed after the save, so the checkpoint cannot be read; use "
        "another checkpoint"));
  }
  if (!bytes.ok()) {
    return absl::Status(bytes.status().code(),
                        absl::StrCat(Where(dir), "unreadable: ", bytes.status().message(),
                                     " (is this a checkpoint directory?)"));
  }
  proto::CheckpointManifest manifest;
  if (!manifest.ParseFromString(*bytes)) {
    return absl::DataLossError(absl::StrCat(
        Where(dir), "corrupted (could not be parsed as a CheckpointManifest, ", bytes->size(),
        " bytes): the file was damaged after it was written; use another checkpoint"));
  }
  if (!manifest.has_manifest_crc32c() && !HasChecksums(manifest)) return manifest;  // format 1
  const size_t n = bytes->size();
  if (n < kChecksumBytes ||
      static_cast<unsigned char>((*bytes)[n - kChecksumBytes]) != kChecksumTag) {
    return absl::DataLossError(absl::StrCat(
        Where(dir), "corrupted (format ", manifest.format_version(),
        " but its checksum is not its last 5 bytes: truncated, or damaged at the end); use "
        "another checkpoint"));
  }
  uint32_t stored = 0;
  std::memcpy(&stored, bytes->data() + n - 4, 4);
  const uint32_t computed = Crc32c(bytes->data(), n - kChecksumBytes);
  if (stored != computed) {
    return absl::DataLossError(absl::StrCat(
        Where(dir), "corrupted (checksum mismatch: expected crc32c ", Crc32cHex(stored),
        ", computed ", Crc32cHex(computed), " over its first ", n - kChecksumBytes,
        " bytes): the file was damaged after it was written; use another checkpoint"));
  }
  return manifest;
}

}  // namespace cpptrain
