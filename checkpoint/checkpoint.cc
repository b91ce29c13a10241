#include "checkpoint/checkpoint.h"

#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/logging.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "checkpoint/files.h"
#include "checkpoint/optimizer_state.h"
#include "checkpoint/safetensors.h"
#include "sharding/fully_shard.h"
#include "sharding/shard_rows.h"

namespace cpptrain {
namespace {

// How a tensor of a parameter is laid out across ranks: split like the parameter (its
// ShardInfo), or whole on rank 0.
struct Layout {
  const ShardInfo* info = nullptr;  // null: kept whole
  std::vector<int64_t> shape;       // the full tensor's shape (as stored: at least 1-d)
};

// Adds `name`'s entry to the manifest with one piece per shard rank holding rows of it.
void AddToManifest(proto::CheckpointManifest& manifest, const std::string& name,
                   const std::string& key, at::ScalarType dtype,
                   const std::vector<int64_t>& logical_shape, const Layout& layout,
                   const std::string& whole_file) {
  proto::CheckpointTensor* t = manifest.add_tensors();
  t->set_name(name);
  t->set_dtype(c10::toString(dtype));
  for (int64_t d : logical_shape) t->add_shape(d);
  const int64_t rows = layout.shape[0];
  if (layout.info == nullptr) {
    proto::TensorPiece* piece = t->add_pieces();
    piece->set_file(whole_file);
    piece->set_key(key);
    piece->set_row_begin(0);
    piece->set_rows(rows);
    return;
  }
  const int shards = layout.info->shard_size;
  for (int s = 0; s < shards; ++s) {
    const RowRange range = ShardRowRange(rows, shards, s);
    if (range.rows() == 0) continue;
    proto::TensorPiece* piece = t->add_pieces();
    piece->set_file(ShardFileName(s, shards));
    piece->set_key(key);
    piece->set_row_begin(range.begin);
    piece->set_rows(range.rows());
  }
}

// Reads rows of checkpoint tensors, opening each file once.
class PieceReader {
 public:
  explicit PieceReader(std::string dir) : dir_(std::move(dir)) {}

  // Rows [begin, begin + rows) of `t`, shaped [rows, ...] (the stored shape's other dims).
  absl::StatusOr<at::Tensor> Rows(const proto::CheckpointTensor& t, int64_t begin, int64_t rows) {
    std::vector<int64_t> shape = StoredShape({t.shape().begin(), t.shape().end()});
    if (begin < 0 || begin + rows > shape[0]) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint '", dir_, "': rows [", begin, ", ",
                                                     begin + rows, ") of ", t.name(),
                                                     " asked for, but it has ", shape[0]));
    }
    shape[0] = rows;
    at::Tensor out;
    int64_t covered = 0;
    for (const proto::TensorPiece& piece : t.pieces()) {
      const int64_t a = std::max(begin, piece.row_begin());
      const int64_t b = std::min(begin + rows, piece.row_begin() + piece.rows());
      if (a >= b) continue;
      CT_ASSIGN_OR_RETURN(const SafetensorsFile* file, File(piece.file()));
      CT_ASSIGN_OR_RETURN(at::Tensor slice, file->GetSlice(piece.key(), a - piece.row_begin(),
                                                           b - piece.row_begin()));
      if (!out.defined()) out = at::empty(shape, slice.options());
      CT_RETURN_IF_ERROR(CatchTorch([&] {
        out.narrow(0, a - begin, b - a).copy_(slice.view(out.narrow(0, a - begin, b - a).sizes()));
      }));
      covered += b - a;
    }
    if (covered != rows) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint '", dir_, "': the pieces of ", t.name(), " cover ", covered, " of rows [",
          begin, ", ", begin + rows, "); the manifest or a shard file is incomplete"));
    }
    if (!out.defined()) out = at::empty(shape);  // zero rows
    return out;
  }

 private:
  absl::StatusOr<const SafetensorsFile*> File(const std::string& name) {
    auto it = files_.find(name);
    if (it == files_.end()) {
      CT_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file,
                          SafetensorsFile::Open(dir_ + "/" + name));
      it = files_.emplace(name, std::move(file)).first;
    }
    return it->second.get();
  }

  std::string dir_;
  std::map<std::string, std::unique_ptr<SafetensorsFile>> files_;
};

}  // namespace

std::string ShardFileName(int shard, int shards) {
  return absl::StrFormat("shard-%05d-of-%05d.safetensors", shard, shards);
}

std::vector<int64_t> StoredShape(std::vector<int64_t> shape) {
  if (shape.empty()) shape.push_back(1);
  return shape;
}

absl::StatusOr<proto::CheckpointManifest> ReadManifest(const std::string& dir) {
  CT_ASSIGN_OR_RETURN(std::string bytes, ReadFile(dir + "/" + kManifestFileName));
  proto::CheckpointManifest manifest;
  if (!manifest.ParseFromString(bytes)) {
    return absl::DataLossError(absl::StrCat("'", dir, "/", kManifestFileName,
                                            "' is not a CheckpointManifest (corrupt file?)"));
  }
  return manifest;
}

absl::Status SaveModelState(const std::string& dir, TrainableModel& model,
                            torch::optim::Optimizer* optimizer, Engine& engine,
                            const SaveModelStateOptions& options) {
  FullyShardedModel* sharded = FullyShardedOf(model);
  const int rank = engine.rank();
  const int shards = sharded ? sharded->mesh().shard->size() : 1;
  const int shard = sharded ? sharded->mesh().shard->rank() : 0;
  // One replica writes: rank = replica * shards + shard, so replica 0 is ranks [0, shards).
  const bool writes = sharded ? rank < shards : rank == 0;
  const std::string my_file = ShardFileName(shard, shards);
  const std::string whole_file = ShardFileName(0, shards);

  proto::CheckpointManifest manifest;
  manifest.set_engine(engine.name());
  manifest.set_world_size(engine.world_size());
  std::vector<std::pair<std::string, at::Tensor>> mine;  // this rank's shard-file entries
  const auto params = model.named_parameters(/*recurse=*/true);

  std::unique_ptr<SafetensorsWriter> full_writer;
  if (options.full_model && rank == 0) {
    std::vector<SafetensorsWriter::Entry> entries;
    for (const auto& item : params) {
      const ShardInfo* info = sharded ? sharded->Find(item.value()) : nullptr;
      entries.push_back({item.key(), info ? info->dtype : item.value().scalar_type(),
                         info ? info->global_shape : item.value().sizes().vec()});
    }
    CT_ASSIGN_OR_RETURN(full_writer, SafetensorsWriter::Create(dir + "/" + kSafetensorsFileName,
                                                               entries, {{"format", "pt"}}));
  }
  for (const auto& item : params) {
    const std::string& name = item.key();
    const at::Tensor& p = item.value();
    const ShardInfo* info = sharded ? sharded->Find(p) : nullptr;
    const std::vector<int64_t> global = info ? info->global_shape : p.sizes().vec();
    const at::ScalarType dtype = info ? info->dtype : p.scalar_type();
    const Layout split{info, StoredShape(global)};
    if (options.full_model) {
      AddToManifest(manifest, "model." + name, name, dtype, global, Layout{nullptr, split.shape},
                    kSafetensorsFileName);
      at::Tensor whole = p.detach();
      if (info != nullptr) {
        CT_ASSIGN_OR_RETURN(whole, sharded->GatherFull(p));  // every rank takes part
      }
      if (full_writer) CT_RETURN_IF_ERROR(full_writer->Append(name, whole));
    } else {
      AddToManifest(manifest, "model." + name, "model." + name, dtype, global, split, whole_file);
      if (writes && (info ? info->local_rows > 0 : true)) {
        mine.emplace_back("model." + name, p.detach().reshape(StoredShape(p.sizes().vec())));
      }
    }
    if (optimizer == nullptr || !options.include_optimizer) continue;
    for (const auto& [state_name, value] : ExportOptimizerState(*optimizer, p)) {
      const std::string key = absl::StrCat("optimizer.", name, ".", state_name);
      // Shaped like the parameter: split like it. Anything else (step): whole, from rank 0.
      const bool split_like_param = info != nullptr && value.sizes() == p.sizes();
      const std::vector<int64_t> logical = split_like_param ? global : value.sizes().vec();
      AddToManifest(manifest, key, key, value.scalar_type(), logical,
                    split_like_param ? split : Layout{nullptr, StoredShape(logical)}, whole_file);
      const bool write_it =
          split_like_param ? writes && info->local_rows > 0 : (sharded ? rank == 0 : writes);
      if (write_it)
        mine.emplace_back(key, value.detach().reshape(StoredShape(value.sizes().vec())));
    }
  }
  if (full_writer) CT_RETURN_IF_ERROR(full_writer->Finish());
  if (writes && !mine.empty()) CT_RETURN_IF_ERROR(WriteSafetensors(dir + "/" + my_file, mine));
  CT_RETURN_IF_ERROR(engine.Barrier());
  if (rank == 0) {
    CT_RETURN_IF_ERROR(
        WriteFileAtomically(dir + "/" + kManifestFileName, manifest.SerializeAsString()));
  }
  return engine.Barrier();
}

absl::Status LoadModelState(const std::string& dir, TrainableModel& model,
                            torch::optim::Optimizer* optimizer) {
  CT_ASSIGN_OR_RETURN(proto::CheckpointManifest manifest, ReadManifest(dir));
  std::map<std::string, const proto::CheckpointTensor*> by_name;
  for (const proto::CheckpointTensor& t : manifest.tensors()) by_name[t.name()] = &t;
  FullyShardedModel* sharded = FullyShardedOf(model);
  PieceReader reader(dir);
  torch::NoGradGuard no_grad;
  int64_t bytes = 0;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    const std::string& name = item.key();
    at::Tensor p = item.value();
    const ShardInfo* info = sharded ? sharded->Find(p) : nullptr;
    const std::vector<int64_t> global = info ? info->global_shape : p.sizes().vec();
    auto it = by_name.find("model." + name);
    if (it == by_name.end()) {
      return absl::NotFoundError(absl::StrCat(
          "checkpoint '", dir, "' has no tensor for parameter ", name,
          ": it was written for another model (or with save_only_model off and renamed)"));
    }
    const proto::CheckpointTensor& t = *it->second;
    if (std::vector<int64_t>(t.shape().begin(), t.shape().end()) != global) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint '", dir, "': ", name, " has shape ",
          c10::str(c10::IntArrayRef(std::vector<int64_t>(t.shape().begin(), t.shape().end()))),
          " but the model's is ", c10::str(c10::IntArrayRef(global)),
          ": load it into the model configuration it was written from"));
    }
    const int64_t begin = info ? info->row_begin : 0;
    const int64_t rows = info ? info->local_rows : StoredShape(global)[0];
    CT_ASSIGN_OR_RETURN(at::Tensor data, reader.Rows(t, begin, rows));
    CT_RETURN_IF_ERROR(CatchTorch([&] { p.detach().copy_(data.view(p.sizes())); }));
    bytes += data.numel() * data.element_size();
    if (optimizer == nullptr) continue;
    std::map<std::string, at::Tensor> state;
    const std::string prefix = absl::StrCat("optimizer.", name, ".");
    for (auto s = by_name.lower_bound(prefix);
         s != by_name.end() && absl::StartsWith(s->first, prefix); ++s) {
      const proto::CheckpointTensor& st = *s->second;
      const std::vector<int64_t> shape(st.shape().begin(), st.shape().end());
      const bool split_like_param = info != nullptr && shape == global;
      CT_ASSIGN_OR_RETURN(at::Tensor value, split_like_param
                                                ? reader.Rows(st, begin, rows)
                                                : reader.Rows(st, 0, StoredShape(shape)[0]));
      state[s->first.substr(prefix.size())] =
          split_like_param ? value.view(p.sizes()) : value.view(shape);
    }
    if (!state.empty()) {
      absl::Status imported = ImportOptimizerState(*optimizer, p, state);
      if (!imported.ok()) {
        return absl::Status(imported.code(), absl::StrCat("checkpoint '", dir, "', parameter ",
                                                          name, ": ", imported.message()));
      }
    }
  }
  VLOG(1) << "loaded " << bytes << " bytes of parameters from " << dir;
  return absl::OkStatus();
}

}  // namespace cpptrain
