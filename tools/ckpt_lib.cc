#include "tools/ckpt_lib.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <system_error>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/logging.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/files.h"
#include "checkpoint/hf_config.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/verify.h"
#include "proto/checkpoint.pb.h"

namespace cpptrain {
namespace {

namespace fs = std::filesystem;

constexpr char kModelPrefix[] = "model.";
constexpr char kRngStatePrefix[] = "rng_state_";
// Shard file names carry the count in five digits.
constexpr int kMaxRanks = 99999;

bool IsShardFileName(const std::string& name) {
  return absl::StartsWith(name, "shard-") && absl::StrContains(name, "-of-") &&
         absl::EndsWith(name, ".safetensors");
}

std::string Join(const std::string& dir, const std::string& name) {
  return (fs::path(dir) / name).string();
}

bool Exists(const std::string& path) {
  std::error_code ec;
  return fs::exists(path, ec);
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Dtype names a manifest may carry: c10::toString's ("Float", what SaveModelState writes) or
// the safetensors names ("F32") that proto/checkpoint.proto mentions.
struct DtypeName {
  at::ScalarType type;
  const char* safetensors;
};
constexpr DtypeName kDtypeNames[] = {
    {at::kDouble, "F64"}, {at::kFloat, "F32"}, {at::kHalf, "F16"}, {at::kBFloat16, "BF16"},
    {at::kLong, "I64"},   {at::kInt, "I32"},   {at::kShort, "I16"}, {at::kChar, "I8"},
    {at::kByte, "U8"},    {at::kBool, "BOOL"},
};

std::optional<at::ScalarType> FindDtype(const std::string& name) {
  for (const DtypeName& d : kDtypeNames) {
    if (name == c10::toString(d.type) || name == d.safetensors) return d.type;
  }
  return std::nullopt;
}

absl::StatusOr<at::ScalarType> ParseDtype(const std::string& name, const std::string& where) {
  if (std::optional<at::ScalarType> type = FindDtype(name)) return *type;
  std::vector<std::string> known;
  for (const DtypeName& d : kDtypeNames) known.push_back(c10::toString(d.type));
  return absl::InvalidArgumentError(absl::StrCat(
      where, "dtype is \"", name, "\", expected one of ", absl::StrJoin(known, ", "),
      " (or the safetensors names F32, BF16, ...): the manifest is corrupt or from another "
      "writer"));
}

enum class DirKind { kCheckpoint, kModelDir };

absl::StatusOr<DirKind> Classify(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat(
        "'", dir, "' is not a directory", ec ? absl::StrCat(" (", ec.message(), ")") : "",
        ": pass a checkpoint directory or a Hugging Face model directory"));
  }
  // A Trainer checkpoint without its manifest is a damaged checkpoint, not a model directory.
  if (Exists(Join(dir, kManifestFileName)) || Exists(Join(dir, kTrainerStateFileName))) {
    return DirKind::kCheckpoint;
  }
  if (Exists(Join(dir, kSafetensorsFileName)) || Exists(Join(dir, kSafetensorsIndexFileName))) {
    return DirKind::kModelDir;
  }
  return absl::NotFoundError(absl::StrCat(
      "'", dir, "' holds neither ", kManifestFileName, " (a checkpoint written by "
      "SaveModelState) nor ", kSafetensorsFileName, " or ", kSafetensorsIndexFileName,
      " (a Hugging Face model directory): pass a directory that holds one of them"));
}

// A model tensor of the input, under its parameter (Hugging Face) name.
struct SourceTensor {
  std::string name;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;   // the full, logical shape (0-d: empty)
  std::vector<int64_t> stored;  // at least 1-d: what rows count along
  const proto::CheckpointTensor* entry = nullptr;  // its manifest entry (checkpoints only)
};

// The model tensors of a checkpoint (any engine, any world size) or of a Hugging Face model
// directory, readable by rows. Everything is checked on Open (every piece's file, key, dtype
// and shape; rows covered exactly once), so a conversion fails before it writes anything.
class ModelSource {
 public:
  static absl::StatusOr<std::unique_ptr<ModelSource>> Open(const std::string& dir) {
    CT_ASSIGN_OR_RETURN(DirKind kind, Classify(dir));
    std::unique_ptr<ModelSource> source(new ModelSource(dir));
    if (kind == DirKind::kCheckpoint) {
      CT_RETURN_IF_ERROR(source->OpenCheckpoint());
    } else {
      CT_RETURN_IF_ERROR(source->OpenModelDir());
    }
    if (source->tensors_.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", dir, "' holds no model tensors",
          kind == DirKind::kCheckpoint ? " (no manifest entry named model.<parameter>)" : "",
          ": pass a directory with a saved model"));
    }
    // A conversion must not give damaged bytes fresh checksums.
    CT_ASSIGN_OR_RETURN(CheckpointVerification report,
                        VerifyCheckpoint(dir, kind == DirKind::kCheckpoint ? kModelPrefix : ""));
    if (!report.problems.empty()) {
      return absl::DataLossError(absl::StrCat(
          "cannot convert '", dir, "': ", report.problems.size(), " problem(s), the first: ",
          report.problems.front().message(), " (ckpt verify ", dir, " lists them all)"));
    }
    return source;
  }

  const std::vector<SourceTensor>& tensors() const { return tensors_; }
  // The manifest of a checkpoint; empty for a Hugging Face model directory.
  const proto::CheckpointManifest& manifest() const { return manifest_; }

  // Rows `range` of `t`, shaped like t.stored with dim 0 = range.rows(). When one file holds
  // them all this is a read-only view of the mapped file (no copy); otherwise they are
  // assembled into a new tensor.
  absl::StatusOr<at::Tensor> Rows(const SourceTensor& t, RowRange range) {
    if (model_dir_ != nullptr) {
      if (!t.shape.empty()) return model_dir_->GetSlice(t.name, range.begin, range.end);
      CT_ASSIGN_OR_RETURN(at::Tensor whole, model_dir_->Get(t.name));
      return CatchTorch([&] { return whole.reshape({1}).narrow(0, range.begin, range.rows()); });
    }
    std::vector<int64_t> shape = t.stored;
    shape[0] = range.rows();
    at::Tensor out;
    for (const proto::TensorPiece& piece : t.entry->pieces()) {
      const int64_t a = std::max(range.begin, piece.row_begin());
      const int64_t b = std::min(range.end, piece.row_begin() + piece.rows());
      if (a >= b) continue;
      CT_ASSIGN_OR_RETURN(const SafetensorsFile* file, File(piece.file()));
      CT_ASSIGN_OR_RETURN(at::Tensor slice,
                          PieceRows(*file, piece, a - piece.row_begin(), b - piece.row_begin()));
      if (a == range.begin && b == range.end) return slice;
      if (!out.defined()) out = at::empty(shape, at::TensorOptions().dtype(t.dtype));
      CT_RETURN_IF_ERROR(CatchTorch([&] { out.narrow(0, a - range.begin, b - a).copy_(slice); }));
    }
    if (!out.defined()) out = at::empty(shape, at::TensorOptions().dtype(t.dtype));  // no rows
    return out;
  }

 private:
  explicit ModelSource(std::string dir) : dir_(std::move(dir)) {}

  absl::Status OpenModelDir() {
    CT_ASSIGN_OR_RETURN(model_dir_, SafetensorsModelDir::Open(dir_));
    for (const std::string& name : model_dir_->names()) {
      CT_ASSIGN_OR_RETURN(SafetensorsTensorInfo info, model_dir_->Info(name));
      tensors_.push_back({name, info.dtype, info.shape, StoredShape(info.shape), nullptr});
    }
    return absl::OkStatus();
  }

  absl::Status OpenCheckpoint() {
    CT_ASSIGN_OR_RETURN(manifest_, ReadManifest(dir_));
    for (const proto::CheckpointTensor& t : manifest_.tensors()) {
      if (!absl::StartsWith(t.name(), kModelPrefix)) continue;
      const std::string where =
          absl::StrCat("checkpoint '", dir_, "', ", kManifestFileName, ", tensor ", t.name(), ": ");
      SourceTensor s;
      s.name = t.name().substr(sizeof(kModelPrefix) - 1);
      s.entry = &t;
      CT_ASSIGN_OR_RETURN(s.dtype, ParseDtype(t.dtype(), where));
      s.shape.assign(t.shape().begin(), t.shape().end());
      if (std::any_of(s.shape.begin(), s.shape.end(), [](int64_t d) { return d < 0; })) {
        return absl::DataLossError(absl::StrCat(where, "shape ", ShapeString(s.shape),
                                                " has a negative size: the manifest is corrupt"));
      }
      s.stored = StoredShape(s.shape);
      CT_RETURN_IF_ERROR(CheckPieces(s, where));
      tensors_.push_back(std::move(s));
    }
    return absl::OkStatus();
  }

  // The pieces of `t` cover rows [0, stored[0]) exactly once, and each names a tensor of its
  // file with the tensor's dtype and the piece's shape.
  absl::Status CheckPieces(const SourceTensor& t, const std::string& where) {
    std::vector<const proto::TensorPiece*> pieces;
    for (const proto::TensorPiece& piece : t.entry->pieces()) pieces.push_back(&piece);
    std::sort(pieces.begin(), pieces.end(), [](const auto* a, const auto* b) {
      return a->row_begin() < b->row_begin();
    });
    int64_t next = 0;
    for (const proto::TensorPiece* piece : pieces) {
      const std::string at_piece = absl::StrCat(where, "piece ", piece->key(), " in ",
                                                piece->file(), " (rows [", piece->row_begin(),
                                                ", ", piece->row_begin() + piece->rows(), ")): ");
      if (piece->rows() < 0 || piece->row_begin() != next) {
        return absl::DataLossError(absl::StrCat(
            at_piece, "expected it to begin at row ", next, " with rows >= 0",
            piece->row_begin() > next ? absl::StrCat("; rows [", next, ", ", piece->row_begin(),
                                                     ") are in no piece")
                                      : "; it overlaps the piece before it",
            ": the manifest is corrupt or a shard file was not listed"));
      }
      next += piece->rows();
      absl::StatusOr<const SafetensorsFile*> opened = File(piece->file());
      if (!opened.ok()) {
        return absl::Status(opened.status().code(),
                            absl::StrCat(at_piece, opened.status().message()));
      }
      const SafetensorsFile* file = *opened;
      absl::StatusOr<SafetensorsTensorInfo> info = file->Info(piece->key());
      if (!info.ok()) {
        return absl::DataLossError(absl::StrCat(at_piece, info.status().message()));
      }
      std::vector<int64_t> expected = t.stored;
      expected[0] = piece->rows();
      const bool shape_ok =
          info->shape == expected || (info->shape.empty() && expected == StoredShape({}));
      if (!shape_ok || info->dtype != t.dtype) {
        return absl::DataLossError(absl::StrCat(
            at_piece, "the file holds ", c10::toString(info->dtype), " ",
            ShapeString(info->shape), ", but the manifest says ", c10::toString(t.dtype), " ",
            ShapeString(expected), ": the file and the manifest are from different saves"));
      }
    }
    if (next != t.stored[0]) {
      return absl::DataLossError(absl::StrCat(
          where, "the pieces cover rows [0, ", next, ") of ", t.stored[0],
          ": the manifest is incomplete (a shard file was not listed?)"));
    }
    return absl::OkStatus();
  }

  // Rows [begin, end) of a piece's tensor (a view of the mapped file).
  static absl::StatusOr<at::Tensor> PieceRows(const SafetensorsFile& file,
                                              const proto::TensorPiece& piece, int64_t begin,
                                              int64_t end) {
    CT_ASSIGN_OR_RETURN(SafetensorsTensorInfo info, file.Info(piece.key()));
    if (!info.shape.empty()) return file.GetSlice(piece.key(), begin, end);
    CT_ASSIGN_OR_RETURN(at::Tensor whole, file.Get(piece.key()));  // 0-d: one row
    return CatchTorch([&] { return whole.reshape({1}).narrow(0, begin, end - begin); });
  }

  absl::StatusOr<const SafetensorsFile*> File(const std::string& name) {
    auto it = files_.find(name);
    if (it == files_.end()) {
      // Checked before it is opened: a plain name in the directory, a regular file, no link.
      CT_ASSIGN_OR_RETURN(const std::string path, CheckpointFilePath(dir_, name));
      CT_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(path));
      it = files_.emplace(name, std::move(file)).first;
    }
    return it->second.get();
  }

  std::string dir_;
  proto::CheckpointManifest manifest_;  // SourceTensor::entry points into it
  std::unique_ptr<SafetensorsModelDir> model_dir_;
  std::map<std::string, std::unique_ptr<SafetensorsFile>> files_;
  std::vector<SourceTensor> tensors_;
};

// Creates `out_dir` if needed and checks that writing a model there replaces nothing.
absl::Status PrepareOutputDir(const std::string& in_dir, const std::string& out_dir) {
  std::error_code ec;
  if (fs::exists(out_dir, ec) && !fs::is_directory(out_dir, ec)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "output '", out_dir, "' exists and is not a directory: pass a directory path"));
  }
  fs::create_directories(out_dir, ec);
  if (ec) {
    return absl::PermissionDeniedError(absl::StrCat("cannot create the output directory '",
                                                    out_dir, "': ", ec.message()));
  }
  if (fs::equivalent(in_dir, out_dir, ec)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the output directory '", out_dir, "' is the input directory '", in_dir,
        "': write the conversion to another directory"));
  }
  std::vector<std::string> conflicts;
  for (const fs::directory_entry& entry : fs::directory_iterator(out_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name == kManifestFileName || name == kSafetensorsFileName ||
        name == kSafetensorsIndexFileName || IsShardFileName(name)) {
      conflicts.push_back(name);
    }
  }
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot list the output directory '", out_dir, "': ", ec.message()));
  }
  if (!conflicts.empty()) {
    std::sort(conflicts.begin(), conflicts.end());
    return absl::FailedPreconditionError(absl::StrCat(
        "the output directory '", out_dir, "' already holds ", absl::StrJoin(conflicts, ", "),
        ": remove those files or choose another directory (ckpt does not overwrite a model)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> FileSize(const std::string& path) {
  std::error_code ec;
  const std::uintmax_t size = fs::file_size(path, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("cannot stat '", path, "': ", ec.message()));
  }
  return static_cast<int64_t>(size);
}

// Writes `rows` with every column padded to its widest cell, indented by two spaces.
void PrintTable(const std::vector<std::vector<std::string>>& rows, std::ostream& out) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    if (widths.size() < row.size()) widths.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  for (const auto& row : rows) {
    std::string line = " ";
    for (size_t i = 0; i < row.size(); ++i) {
      absl::StrAppend(&line, " ", row[i]);
      if (i + 1 < row.size()) line.append(widths[i] - row[i].size(), ' ');
    }
    out << line << "\n";
  }
}

std::string PresentOrAbsent(const std::string& path) {
  absl::StatusOr<int64_t> size = FileSize(path);
  return size.ok() ? absl::StrCat("present (", *size, " bytes)") : "absent";
}

// The checksum and verification cells of one tensor's pieces: its CRC-32C (the manifest's, else
// the header's) or the count of pieces, and "ok", "no checksum" or "FAILED".
std::pair<std::string, std::string> ChecksumCells(
    const std::vector<const PieceVerification*>& pieces) {
  bool failed = false, unchecked = false;
  for (const PieceVerification* p : pieces) {
    failed |= !p->status.ok();
    unchecked |= !p->manifest_crc32c && !p->header_crc32c;
  }
  std::string crc = absl::StrCat(pieces.size(), " pieces");
  if (pieces.size() == 1) {
    const PieceVerification& p = *pieces[0];
    const std::optional<uint32_t> stored = p.manifest_crc32c ? p.manifest_crc32c : p.header_crc32c;
    crc = stored ? Crc32cHex(*stored) : "none";
  }
  return {crc, failed ? "FAILED" : unchecked ? "no checksum" : "ok"};
}

// The summary line of a verification and each problem.
void PrintVerification(const CheckpointVerification& report, std::ostream& out) {
  const double mb = report.checksummed_bytes / 1e6;
  out << absl::StrFormat("verification: %d pieces, %d bytes checksummed in %.3f s (%.0f MB/s)",
                         report.pieces.size(), report.checksummed_bytes, report.seconds,
                         report.seconds > 0 ? mb / report.seconds : 0.0);
  if (report.unchecksummed_pieces > 0) {
    out << ", " << report.unchecksummed_pieces << " without a checksum (written before checksums, "
        << "or by another tool)";
  }
  if (report.problems.empty()) {
    out << ": every checksum matches, every value is finite\n";
    return;
  }
  out << ": " << report.problems.size() << " problem(s)\n";
  for (const absl::Status& problem : report.problems) out << "  - " << problem.message() << "\n";
}

std::map<std::string, std::vector<const PieceVerification*>> PiecesByTensor(
    const CheckpointVerification& report) {
  std::map<std::string, std::vector<const PieceVerification*>> by_tensor;
  for (const PieceVerification& p : report.pieces) by_tensor[p.tensor].push_back(&p);
  return by_tensor;
}

absl::Status InspectManifest(const std::string& dir, std::ostream& out) {
  CT_ASSIGN_OR_RETURN(proto::CheckpointManifest manifest, ReadManifest(dir));
  CT_ASSIGN_OR_RETURN(CheckpointVerification report, VerifyCheckpoint(dir));
  const auto by_tensor = PiecesByTensor(report);
  out << "checkpoint " << dir << "\n";
  out << "engine: " << (manifest.has_engine() ? manifest.engine() : "(not recorded)")
      << ", world size: " << manifest.world_size()
      << ", format version: " << manifest.format_version() << "\n";

  std::vector<std::vector<std::string>> table = {
      {"tensor", "dtype", "shape", "pieces", "files", "crc32c", "verified"}};
  int64_t model_tensors = 0, optimizer_tensors = 0, model_bytes = 0, optimizer_bytes = 0;
  int64_t unknown_dtype = 0;
  std::set<std::string> data_files;
  for (const proto::CheckpointTensor& t : manifest.tensors()) {
    std::set<std::string> files;
    for (const proto::TensorPiece& piece : t.pieces()) files.insert(piece.file());
    data_files.insert(files.begin(), files.end());
    const std::vector<int64_t> shape(t.shape().begin(), t.shape().end());
    auto pieces = by_tensor.find(t.name());
    const auto [crc, verified] = pieces == by_tensor.end()
                                     ? std::pair<std::string, std::string>{"none", "FAILED"}
                                     : ChecksumCells(pieces->second);
    table.push_back({t.name(), t.dtype(), ShapeString(shape), absl::StrCat(t.pieces_size()),
                     absl::StrCat(files.size()), crc, verified});
    const bool is_model = absl::StartsWith(t.name(), kModelPrefix);
    (is_model ? model_tensors : optimizer_tensors) += 1;
    std::optional<at::ScalarType> dtype = FindDtype(t.dtype());
    if (!dtype) {
      ++unknown_dtype;
      continue;
    }
    const int64_t bytes =
        Numel(StoredShape(shape)) * static_cast<int64_t>(c10::elementSize(*dtype));
    (is_model ? model_bytes : optimizer_bytes) += bytes;
  }
  out << "tensors:\n";
  PrintTable(table, out);
  out << "totals: " << manifest.tensors_size() << " tensors (" << model_tensors << " model, "
      << optimizer_tensors << " optimizer), " << model_bytes + optimizer_bytes << " bytes ("
      << model_bytes << " model, " << optimizer_bytes << " optimizer)";
  if (unknown_dtype > 0) out << "; " << unknown_dtype << " of unknown dtype not counted";
  out << "\n";

  std::vector<std::string> rng_files;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (absl::StartsWith(name, kRngStatePrefix)) rng_files.push_back(name);
  }
  std::sort(rng_files.begin(), rng_files.end());
  std::vector<std::vector<std::string>> files = {
      {kSafetensorsFileName, PresentOrAbsent(Join(dir, kSafetensorsFileName))},
      {kTrainerStateFileName, PresentOrAbsent(Join(dir, kTrainerStateFileName))},
      {"rng state files", rng_files.empty() ? "none"
                                            : absl::StrCat(rng_files.size(), ": ",
                                                           absl::StrJoin(rng_files, ", "))},
  };
  for (const std::string& name : data_files) {
    absl::StatusOr<int64_t> size = FileSize(Join(dir, name));
    files.push_back({name, size.ok() ? absl::StrCat("named by the manifest, present (", *size,
                                                    " bytes)")
                                     : "named by the manifest, MISSING"});
  }
  out << "files:\n";
  PrintTable(files, out);
  PrintVerification(report, out);
  return absl::OkStatus();
}

absl::Status InspectModelDir(const std::string& dir, std::ostream& out) {
  CT_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsModelDir> model, SafetensorsModelDir::Open(dir));
  CT_ASSIGN_OR_RETURN(CheckpointVerification report, VerifyCheckpoint(dir));
  const auto by_tensor = PiecesByTensor(report);
  const bool indexed = Exists(Join(dir, kSafetensorsIndexFileName));
  out << "model directory " << dir << " ("
      << (indexed ? kSafetensorsIndexFileName : kSafetensorsFileName) << "; no "
      << kManifestFileName << ")\n";
  std::vector<std::vector<std::string>> table = {
      {"tensor", "dtype", "shape", "file", "crc32c", "verified"}};
  int64_t bytes = 0;
  for (const std::string& name : model->names()) {
    CT_ASSIGN_OR_RETURN(SafetensorsTensorInfo info, model->Info(name));
    CT_ASSIGN_OR_RETURN(const SafetensorsFile* file, model->FileOf(name));
    auto pieces = by_tensor.find(name);
    const auto [crc, verified] = pieces == by_tensor.end()
                                     ? std::pair<std::string, std::string>{"none", "FAILED"}
                                     : ChecksumCells(pieces->second);
    table.push_back({name, c10::toString(info.dtype), ShapeString(info.shape),
                     fs::path(file->path()).filename().string(), crc, verified});
    bytes += info.end - info.begin;
  }
  out << "tensors:\n";
  PrintTable(table, out);
  out << "totals: " << table.size() - 1 << " tensors, " << bytes << " bytes\n";
  PrintVerification(report, out);
  return absl::OkStatus();
}

}  // namespace

absl::Status InspectCheckpoint(const std::string& dir, std::ostream& out) {
  CT_ASSIGN_OR_RETURN(DirKind kind, Classify(dir));
  return kind == DirKind::kCheckpoint ? InspectManifest(dir, out) : InspectModelDir(dir, out);
}

absl::Status VerifyDirectory(const std::string& dir, std::ostream& out) {
  CT_ASSIGN_OR_RETURN(DirKind kind, Classify(dir));
  CT_ASSIGN_OR_RETURN(CheckpointVerification report, VerifyCheckpoint(dir));
  out << (kind == DirKind::kCheckpoint
              ? absl::StrCat("checkpoint ", dir, " (manifest format ", report.format_version, ")")
              : absl::StrCat("model directory ", dir))
      << "\n";
  PrintVerification(report, out);
  if (report.problems.empty()) return absl::OkStatus();
  return absl::DataLossError(
      absl::StrCat("'", dir, "' fails verification: ", report.problems.size(),
                   " problem(s), the first: ", report.problems.front().message()));
}

namespace {

// config.json and generation_config.json beside the weights, so that from_pretrained loads
// `out_dir`: written from a checkpoint's decoder config (its manifest, or an older checkpoint's
// config.json); a Hugging Face directory's own files are copied as they are (a missing
// generation_config.json is written from its config.json). A model that is not a decoder gets
// neither, with a warning.
absl::Status WriteModelConfigs(const std::string& dir, const ModelSource& source,
                               const std::string& out_dir, ConvertResult& result) {
  const std::string config_json = Join(dir, "config.json");
  const std::string generation_json = Join(dir, "generation_config.json");
  const bool checkpoint = source.manifest().tensors_size() > 0;
  if (checkpoint && source.manifest().has_decoder()) {
    CT_RETURN_IF_ERROR(WriteHfModelConfigs(source.manifest().decoder(), out_dir));
  } else if (Exists(config_json) && (checkpoint || !Exists(generation_json))) {
    CT_ASSIGN_OR_RETURN(proto::DecoderConfig config, DecoderConfigFromHfConfig(config_json));
    if (checkpoint) {
      CT_RETURN_IF_ERROR(WriteHfModelConfigs(config, out_dir));
    } else {
      CT_ASSIGN_OR_RETURN(std::string text, ReadFile(config_json));
      CT_RETURN_IF_ERROR(WriteFileAtomically(Join(out_dir, "config.json"), text));
      CT_RETURN_IF_ERROR(WriteFileAtomically(Join(out_dir, "generation_config.json"),
                                             HfGenerationConfigJson(config)));
    }
  } else if (Exists(config_json)) {
    for (const std::string& path : {config_json, generation_json}) {
      CT_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
      CT_RETURN_IF_ERROR(
          WriteFileAtomically(Join(out_dir, fs::path(path).filename().string()), text));
    }
  } else {
    LOG(WARNING) << "'" << dir << "' has no decoder config (manifest or config.json): '" << out_dir
                 << "' gets the weights without config.json";
    return absl::OkStatus();
  }
  for (const char* name : {"config.json", "generation_config.json"}) {
    result.files.push_back(Join(out_dir, name));
    CT_ASSIGN_OR_RETURN(int64_t bytes, FileSize(result.files.back()));
    result.bytes += bytes;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ConvertResult> ConvertToFull(const std::string& dir, const std::string& out_dir) {
  CT_ASSIGN_OR_RETURN(std::unique_ptr<ModelSource> source, ModelSource::Open(dir));
  CT_RETURN_IF_ERROR(PrepareOutputDir(dir, out_dir));
  std::vector<SafetensorsWriter::Entry> entries;
  for (const SourceTensor& t : source->tensors()) entries.push_back({t.name, t.dtype, t.shape});
  const std::string path = Join(out_dir, kSafetensorsFileName);
  CT_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsWriter> writer,
                      SafetensorsWriter::Create(path, entries, {{"format", "pt"}}));
  for (const SourceTensor& t : source->tensors()) {
    CT_ASSIGN_OR_RETURN(at::Tensor rows, source->Rows(t, {0, t.stored[0]}));
    CT_ASSIGN_OR_RETURN(at::Tensor whole, CatchTorch([&] { return rows.view(t.shape); }));
    CT_RETURN_IF_ERROR(writer->Append(t.name, whole));
  }
  CT_RETURN_IF_ERROR(writer->Finish());
  ConvertResult result;
  result.tensors = static_cast<int64_t>(source->tensors().size());
  CT_ASSIGN_OR_RETURN(result.bytes, FileSize(path));
  result.files.push_back(path);
  CT_RETURN_IF_ERROR(WriteModelConfigs(dir, *source, out_dir, result));
  return result;
}

absl::StatusOr<ConvertResult> ConvertToSharded(const std::string& dir, const std::string& out_dir,
                                               int ranks) {
  if (ranks < 1 || ranks > kMaxRanks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ranks is ", ranks, ": pass the number of shard ranks, from 1 to ", kMaxRanks));
  }
  CT_ASSIGN_OR_RETURN(std::unique_ptr<ModelSource> source, ModelSource::Open(dir));
  CT_RETURN_IF_ERROR(PrepareOutputDir(dir, out_dir));

  proto::CheckpointManifest manifest;
  manifest.set_engine("ckpt to-sharded");
  manifest.set_world_size(ranks);
  // The decoder config travels too, so to-full of the result writes config.json again.
  if (source->manifest().has_decoder()) {
    *manifest.mutable_decoder() = source->manifest().decoder();
  } else if (source->manifest().tensors_size() == 0 && Exists(Join(dir, "config.json"))) {
    absl::StatusOr<proto::DecoderConfig> config =
        DecoderConfigFromHfConfig(Join(dir, "config.json"));
    if (config.ok()) *manifest.mutable_decoder() = *config;
  }
  struct Slot {
    const SourceTensor* tensor;
    std::string key;
    RowRange range;
    proto::TensorPiece* piece;  // its manifest entry, which gets the checksum
  };
  std::vector<std::vector<Slot>> by_rank(ranks);
  for (const SourceTensor& t : source->tensors()) {
    proto::CheckpointTensor* entry = manifest.add_tensors();
    entry->set_name(kModelPrefix + t.name);
    entry->set_dtype(c10::toString(t.dtype));
    for (int64_t d : t.shape) entry->add_shape(d);
    // A 0-d tensor is one stored row, so the split puts it whole in shard 0.
    for (int r = 0; r < ranks; ++r) {
      const RowRange range = ShardRowRange(t.stored[0], ranks, r);
      if (range.rows() == 0) continue;
      proto::TensorPiece* piece = entry->add_pieces();
      piece->set_file(ShardFileName(r, ranks));
      piece->set_key(entry->name());
      piece->set_row_begin(range.begin);
      piece->set_rows(range.rows());
      by_rank[r].push_back({&t, entry->name(), range, piece});
    }
  }

  ConvertResult result;
  result.tensors = manifest.tensors_size();
  for (int r = 0; r < ranks; ++r) {
    if (by_rank[r].empty()) continue;
    std::vector<SafetensorsWriter::Entry> entries;
    for (const Slot& slot : by_rank[r]) {
      std::vector<int64_t> shape = slot.tensor->stored;
      shape[0] = slot.range.rows();
      entries.push_back({slot.key, slot.tensor->dtype, std::move(shape)});
    }
    const std::string path = Join(out_dir, ShardFileName(r, ranks));
    CT_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsWriter> writer,
                        SafetensorsWriter::Create(path, entries, {{"format", "pt"}}));
    for (const Slot& slot : by_rank[r]) {
      CT_ASSIGN_OR_RETURN(at::Tensor rows, source->Rows(*slot.tensor, slot.range));
      CT_RETURN_IF_ERROR(writer->Append(slot.key, rows));
    }
    CT_RETURN_IF_ERROR(writer->Finish());
    for (const Slot& slot : by_rank[r]) {
      CT_ASSIGN_OR_RETURN(uint32_t crc, writer->Crc32cOf(slot.key));
      slot.piece->set_crc32c(crc);
    }
    CT_ASSIGN_OR_RETURN(int64_t size, FileSize(path));
    result.bytes += size;
    result.files.push_back(path);
  }
  // Last, so that a manifest exists only beside complete shard files.
  const std::string manifest_path = Join(out_dir, kManifestFileName);
  CT_RETURN_IF_ERROR(WriteManifest(out_dir, manifest));
  CT_ASSIGN_OR_RETURN(int64_t size, FileSize(manifest_path));
  result.bytes += size;
  result.files.push_back(manifest_path);
  return result;
}

}  // namespace cpptrain
