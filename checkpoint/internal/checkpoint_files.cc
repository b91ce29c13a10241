#include "checkpoint/internal/checkpoint_files.h"

#include <ATen/ATen.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/files.h"
#include "checkpoint/manifest.h"

namespace cpptrain {
namespace checkpoint_internal {
namespace {

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

bool IsFloating(at::ScalarType dtype) {
  return dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf ||
         dtype == at::kDouble;
}

// Rows [a, b) of the piece's stored tensor, a read-only view (a 0-d tensor counts as one row).
absl::StatusOr<at::Tensor> PieceRows(const SafetensorsFile& file, const std::string& key, int64_t a,
                                     int64_t b) {
  CT_ASSIGN_OR_RETURN(SafetensorsTensorInfo info, file.Info(key));
  if (!info.shape.empty()) return file.GetSlice(key, a, b);
  CT_ASSIGN_OR_RETURN(at::Tensor whole, file.Get(key));
  return CatchTorch([&] { return whole.reshape({1}).narrow(0, a, b - a); });
}

}  // namespace

std::string TensorDisplayName(const std::string& manifest_name) {
  constexpr absl::string_view kModel = "model.";
  return absl::StartsWith(manifest_name, kModel) ? manifest_name.substr(kModel.size())
                                                 : manifest_name;
}

absl::StatusOr<const SafetensorsFile*> CheckpointFiles::File(const std::string& name) {
  auto it = files_.find(name);
  if (it != files_.end()) return it->second.get();
  // Checked before anything opens or maps it: a plain name, a regular file, no link.
  absl::StatusOr<std::string> path = CheckpointFilePath(dir_, name);
  if (absl::IsNotFound(path.status())) {
    return absl::DataLossError(absl::StrCat("checkpoint '", dir_, "': file '", name,
                                            "', which the manifest lists, is missing"));
  }
  if (!path.ok()) {
    return absl::DataLossError(absl::StrCat("checkpoint '", dir_, "': file '", name,
                                            "', which the manifest lists, is refused: ",
                                            path.status().message()));
  }
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> opened = SafetensorsFile::Open(*path);
  if (!opened.ok()) {
    return absl::DataLossError(absl::StrCat("checkpoint '", dir_, "': file '", name,
                                            "' is damaged: ", opened.status().message()));
  }
  return files_.emplace(name, std::move(opened).value()).first->second.get();
}

const PieceCheck& CheckpointFiles::VerifyPiece(const proto::CheckpointTensor& t,
                                               const proto::TensorPiece& piece) {
  auto [it, inserted] = checked_.try_emplace({piece.file(), piece.key()});
  PieceCheck& check = it->second;
  if (!inserted) return check;
  const std::string where = absl::StrCat("checkpoint '", dir_, "': file '", piece.file(),
                                         "', tensor '", piece.key(), "'");
  if (piece.has_crc32c()) check.manifest_crc32c = piece.crc32c();
  absl::StatusOr<const SafetensorsFile*> file = File(piece.file());
  if (!file.ok()) {
    check.status = file.status();
    return check;
  }
  absl::StatusOr<SafetensorsTensorInfo> info = (*file)->Info(piece.key());
  if (!info.ok()) {
    check.status = absl::DataLossError(
        absl::StrCat(where, ": the manifest lists it for ", t.name(),
                     " but the file does not "
                     "hold it: the file and the manifest are from different saves"));
    return check;
  }
  std::vector<int64_t> expected = StoredShape({t.shape().begin(), t.shape().end()});
  expected[0] = piece.rows();
  const bool shape_ok =
      info->shape == expected || (info->shape.empty() && expected.size() == 1 && expected[0] == 1);
  if (!shape_ok || c10::toString(info->dtype) != t.dtype()) {
    check.status = absl::DataLossError(absl::StrCat(
        where, ": the file holds ", c10::toString(info->dtype), " ", ShapeString(info->shape),
        " but the manifest says ", t.dtype(), " ", ShapeString(expected), " for ", t.name(),
        ": the header or the manifest is damaged, or they are from different saves"));
    return check;
  }
  absl::StatusOr<std::optional<uint32_t>> header = (*file)->StoredCrc32c(piece.key());
  if (header.ok()) check.header_crc32c = *header;
  check.bytes = info->end - info->begin;
  if (check.manifest_crc32c && check.header_crc32c &&
      *check.manifest_crc32c != *check.header_crc32c) {
    check.status = absl::DataLossError(absl::StrCat(
        where, ": the manifest records crc32c ", Crc32cHex(*check.manifest_crc32c),
        " but the file's header ", Crc32cHex(*check.header_crc32c),
        ": the file is not the one the manifest was written with, or one of them is damaged"));
    return check;
  }
  const std::optional<uint32_t> expected_crc =
      check.manifest_crc32c ? check.manifest_crc32c : check.header_crc32c;
  if (!expected_crc) {
    ++unchecksummed_pieces_;
    return check;
  }
  absl::StatusOr<uint32_t> computed = (*file)->ComputeCrc32c(piece.key());
  if (!computed.ok()) {
    check.status = absl::DataLossError(absl::StrCat(where, ": ", computed.status().message()));
    return check;
  }
  check.computed_crc32c = *computed;
  checksummed_bytes_ += check.bytes;
  if (*computed != *expected_crc) {
    check.status = absl::DataLossError(
        absl::StrCat(where,
                     TensorDisplayName(t.name()) == piece.key()
                         ? ""
                         : absl::StrCat(" (", TensorDisplayName(t.name()), ")"),
                     ": checksum mismatch: expected crc32c ", Crc32cHex(*expected_crc),
                     ", computed ", Crc32cHex(*computed), " over its ", check.bytes,
                     " bytes: the file was damaged after it was written; use another checkpoint"));
  }
  return check;
}

absl::Status CheckpointFiles::ForEachSlice(
    const proto::CheckpointTensor& t, int64_t begin, int64_t rows,
    const std::function<absl::Status(const proto::TensorPiece& piece, int64_t a, int64_t b,
                                     const at::Tensor& slice)>& visit) {
  const std::vector<int64_t> shape = StoredShape({t.shape().begin(), t.shape().end()});
  if (begin < 0 || rows < 0 || begin + rows > shape[0]) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint '", dir_, "': rows [", begin, ", ",
                                                   begin + rows, ") of ", t.name(),
                                                   " asked for, but it has ", shape[0]));
  }
  int64_t covered = 0;
  for (const proto::TensorPiece& piece : t.pieces()) {
    const int64_t a = std::max(begin, piece.row_begin());
    const int64_t b = std::min(begin + rows, piece.row_begin() + piece.rows());
    if (a >= b) continue;
    CT_ASSIGN_OR_RETURN(const SafetensorsFile* file, File(piece.file()));
    absl::StatusOr<at::Tensor> slice =
        PieceRows(*file, piece.key(), a - piece.row_begin(), b - piece.row_begin());
    if (!slice.ok()) {
      return absl::DataLossError(absl::StrCat("checkpoint '", dir_, "': file '", piece.file(),
                                              "', tensor '", piece.key(),
                                              "': ", slice.status().message()));
    }
    CT_RETURN_IF_ERROR(visit(piece, a, b, *slice));
    covered += b - a;
  }
  if (covered != rows) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint '", dir_, "': the pieces of ", t.name(), " cover ", covered, " of rows [",
        begin, ", ", begin + rows, "); the manifest or a shard file is incomplete"));
  }
  return absl::OkStatus();
}

absl::StatusOr<at::Tensor> CheckpointFiles::Rows(const proto::CheckpointTensor& t, int64_t begin,
                                                 int64_t rows) {
  std::vector<int64_t> shape = StoredShape({t.shape().begin(), t.shape().end()});
  shape[0] = rows;
  at::Tensor out;
  CT_RETURN_IF_ERROR(
      ForEachSlice(t, begin, rows,
                   [&](const proto::TensorPiece&, int64_t a, int64_t b, const at::Tensor& slice) {
                     return CatchTorch([&] {
                       if (!out.defined()) out = at::empty(shape, slice.options());
                       at::Tensor target = out.narrow(0, a - begin, b - a);
                       target.copy_(slice.view(target.sizes()));
                     });
                   }));
  if (!out.defined()) out = at::empty(shape);  // zero rows
  return out;
}

absl::Status CheckFinite(const std::string& where, const std::string& name,
                         const at::Tensor& values, int64_t row_offset) {
  if (!IsFloating(values.scalar_type()) || values.numel() == 0) return absl::OkStatus();
  // One pass without a temporary: the minimum and maximum are finite exactly when every value
  // is (aminmax propagates NaN). Only a failure pays for finding the first bad value, and so do
  // dtypes aminmax lacks (Half on the CPU in LibTorch 1.13).
  absl::StatusOr<bool> finite = CatchTorch([&] {
    const auto [lowest, highest] = at::aminmax(values);
    return std::isfinite(lowest.item<double>()) && std::isfinite(highest.item<double>());
  });
  if (finite.ok() && *finite) return absl::OkStatus();
  CT_ASSIGN_OR_RETURN(at::Tensor bad,
                      CatchTorch([&] { return at::isfinite(values).logical_not(); }));
  CT_ASSIGN_OR_RETURN(int64_t count, CatchTorch([&] { return bad.sum().item<int64_t>(); }));
  if (count == 0) return absl::OkStatus();
  CT_ASSIGN_OR_RETURN(
      int64_t first, CatchTorch([&] { return bad.reshape({-1}).nonzero().min().item<int64_t>(); }));
  const int64_t row_elements = values.dim() == 0 ? 1 : values.numel() / values.size(0);
  CT_ASSIGN_OR_RETURN(double value,
                      CatchTorch([&] { return values.reshape({-1})[first].item<double>(); }));
  return absl::DataLossError(absl::StrCat(
      where, ": tensor ", name, " holds ", count, " non-finite value", count == 1 ? "" : "s",
      " (the first, ", value, ", in row ", row_offset + first / row_elements,
      "): refusing to load weights or optimizer state that are NaN or infinite; resume from a "
      "checkpoint saved before training diverged"));
}

}  // namespace checkpoint_internal
}  // namespace cpptrain
