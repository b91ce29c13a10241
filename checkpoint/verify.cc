#include "checkpoint/verify.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <set>
#include <system_error>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "checkpoint/files.h"
#include "checkpoint/internal/checkpoint_files.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"
#include "proto/checkpoint.pb.h"

namespace cpptrain {
namespace {

using checkpoint_internal::CheckFinite;
using checkpoint_internal::CheckpointFiles;
using checkpoint_internal::PieceCheck;
using checkpoint_internal::TensorDisplayName;

constexpr char kRngStatePrefix[] = "rng_state_";

bool Exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

// DataLoss unless the pieces of `t`, by first row, cover its rows once each.
absl::Status CheckPiecesTile(const std::string& dir, const proto::CheckpointTensor& t) {
  std::vector<const proto::TensorPiece*> pieces;
  for (const proto::TensorPiece& piece : t.pieces()) pieces.push_back(&piece);
  std::sort(pieces.begin(), pieces.end(),
            [](const auto* a, const auto* b) { return a->row_begin() < b->row_begin(); });
  int64_t next = 0;
  for (const proto::TensorPiece* piece : pieces) {
    if (piece->row_begin() != next || piece->rows() < 0) break;
    next += piece->rows();
  }
  const int64_t rows = StoredShape({t.shape().begin(), t.shape().end()})[0];
  if (next == rows) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat("checkpoint '", dir, "', ", kManifestFileName, ": ",
                                          t.name(), " has ", rows,
                                          " rows, but its pieces cover [0, ", next,
                                          ") without a gap or an overlap: the manifest is "
                                          "damaged or incomplete"));
}

void VerifyPieces(const std::string& dir, const proto::CheckpointManifest& manifest,
                  const std::string& prefix, CheckpointVerification& report) {
  CheckpointFiles files(dir);
  for (const proto::CheckpointTensor& t : manifest.tensors()) {
    if (!absl::StartsWith(t.name(), prefix)) continue;
    if (absl::Status tiled = CheckPiecesTile(dir, t); !tiled.ok()) report.problems.push_back(tiled);
    for (const proto::TensorPiece& piece : t.pieces()) {
      const PieceCheck& check = files.VerifyPiece(t, piece);
      PieceVerification v{t.name(),
                          piece.file(),
                          piece.key(),
                          check.manifest_crc32c,
                          check.header_crc32c,
                          check.computed_crc32c,
                          check.bytes,
                          check.status};
      if (v.status.ok()) {
        v.status = files.ForEachSlice(
            t, piece.row_begin(), piece.rows(),
            [&](const proto::TensorPiece& p, int64_t a, int64_t, const at::Tensor& slice) {
              if (p.file() != piece.file() || p.key() != piece.key()) return absl::OkStatus();
              return CheckFinite(absl::StrCat("checkpoint '", dir, "', file '", p.file(), "'"),
                                 TensorDisplayName(t.name()), slice, a);
            });
      }
      if (!v.status.ok()) report.problems.push_back(v.status);
      report.pieces.push_back(std::move(v));
    }
  }
  report.checksummed_bytes += files.checksummed_bytes();
  report.unchecksummed_pieces += files.unchecksummed_pieces();
}

// Every tensor of a safetensors file against its stored checksum; `finite`: and its values.
void VerifyFile(const std::string& path, bool finite, CheckpointVerification& report) {
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
  if (!file.ok()) {
    report.problems.push_back(
        absl::DataLossError(absl::StrCat("'", path, "' is damaged: ", file.status().message())));
    return;
  }
  const std::string name = std::filesystem::path(path).filename().string();
  for (const std::string& key : (*file)->names()) {
    PieceVerification v{key, name, key};
    v.bytes = (*file)->Info(key)->end - (*file)->Info(key)->begin;
    v.header_crc32c = (*file)->StoredCrc32c(key).value();
    if (v.header_crc32c) {
      v.computed_crc32c = (*file)->ComputeCrc32c(key).value();
      report.checksummed_bytes += v.bytes;
      v.status = (*file)->VerifyCrc32c(key);
    } else {
      ++report.unchecksummed_pieces;
    }
    if (v.status.ok() && finite) {
      absl::StatusOr<at::Tensor> values = (*file)->Get(key);
      v.status = values.ok() ? CheckFinite(absl::StrCat("'", path, "'"), key, *values, 0)
                             : values.status();
    }
    if (!v.status.ok()) report.problems.push_back(v.status);
    report.pieces.push_back(std::move(v));
  }
}

// trainer_state.textproto and the rng_state files of a Trainer checkpoint.
void VerifyTrainerFiles(const std::string& dir, const proto::CheckpointManifest& manifest,
                        CheckpointVerification& report) {
  const std::string state_path = absl::StrCat(dir, "/", kTrainerStateFileName);
  proto::TrainerCheckpointState state;
  if (Exists(state_path)) {
    absl::StatusOr<proto::TrainerCheckpointState> read =
        ReadTrainerState(state_path, HasChecksums(manifest));
    if (read.ok()) {
      state = *std::move(read);
    } else {
      report.problems.push_back(read.status());
    }
  }
  std::set<std::string> rng_files;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (absl::StartsWith(name, kRngStatePrefix)) rng_files.insert(name);
  }
  for (const std::string& name : rng_files) {
    // Checked before it is opened: no link, no FIFO.
    absl::StatusOr<std::string> path = CheckpointFilePath(dir, name);
    if (path.ok()) {
      VerifyFile(*path, /*finite=*/false, report);
    } else {
      report.problems.push_back(path.status());
    }
  }
  if (!state.rng_state_saved()) return;
  for (int rank = 0; rank < state.world_size(); ++rank) {
    const std::string name = absl::StrCat(kRngStatePrefix, rank, ".safetensors");
    if (rng_files.count(name) == 0) {
      report.problems.push_back(absl::DataLossError(
          absl::StrCat("checkpoint '", dir, "': '", name, "' is missing (", state.world_size(),
                       " ranks saved their random state)")));
    }
  }
}

}  // namespace

absl::StatusOr<CheckpointVerification> VerifyCheckpoint(const std::string& dir,
                                                        const std::string& tensor_prefix) {
  const auto start = std::chrono::steady_clock::now();
  CheckpointVerification report;
  // A Trainer checkpoint (trainer_state.textproto) without its manifest is damaged, not a
  // Hugging Face directory: ReadManifest says the manifest is missing.
  if (Exists(absl::StrCat(dir, "/", kManifestFileName)) ||
      Exists(absl::StrCat(dir, "/", kTrainerStateFileName))) {
    CT_ASSIGN_OR_RETURN(proto::CheckpointManifest manifest, ReadManifest(dir));
    report.format_version = manifest.format_version();
    VerifyPieces(dir, manifest, tensor_prefix, report);
    if (tensor_prefix.empty()) VerifyTrainerFiles(dir, manifest, report);
  } else {
    report.is_checkpoint = false;
    absl::StatusOr<std::unique_ptr<SafetensorsModelDir>> model = SafetensorsModelDir::Open(dir);
    if (!model.ok()) {
      return absl::Status(model.status().code(),
                          absl::StrCat(model.status().message(), " (and no ", kManifestFileName,
                                       "): pass a checkpoint or a Hugging Face model directory"));
    }
    std::set<std::string> paths;
    for (const std::string& name : (*model)->names())
      paths.insert((*model)->FileOf(name).value()->path());
    for (const std::string& path : paths) VerifyFile(path, /*finite=*/true, report);
  }
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace cpptrain
