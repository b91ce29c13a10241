#include "checkpoint/checkpoint.h"

#include <c10/util/accumulate.h>
#include <torch/optim/optimizer.h>
#include <torch/ordered_dict.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/fault_injection.h"
#include "base/logging.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "checkpoint/files.h"
#include "checkpoint/hf_model.h"
#include "checkpoint/internal/checkpoint_files.h"
#include "checkpoint/model_match.h"
#include "checkpoint/optimizer_state.h"
#include "checkpoint/safetensors.h"
#include "sharding/agreed_buffer.h"
#include "sharding/all_ranks_ok.h"
#include "sharding/flat_shard.h"
#include "sharding/fully_shard.h"
#include "sharding/shard_rows.h"

namespace cpptrain {
namespace {

using checkpoint_internal::CheckFinite;
using checkpoint_internal::CheckpointFiles;
using checkpoint_internal::TensorDisplayName;

constexpr char kModelPrefix[] = "model.";
constexpr char kOptimizerPrefix[] = "optimizer.";
constexpr char kLoadStrictEscape[] = "set load_strict: false (LoadModelStateOptions::strict)";

// Fault injection for tests (tests/distributed/checkpoint_faults_test.sh): one rank's write or
// read fails as a full or failing disk makes it fail. Each variable is looked up once per
// SaveModelState or LoadModelState call; unset, that getenv is all it costs.
//   CPPTRAIN_TEST_FAIL_WRITE_ON_RANK=R  on rank R (HostGroup::rank), SaveModelState's writes of
//       tensor data (model.safetensors, the rank's shard file) fail at their first tensor:
//       ResourceExhausted, "the disk is full ...: No space left on device".
//   CPPTRAIN_TEST_FAIL_READ_ON_RANK=R   in the process whose RANK (set by the launcher) is R,
//       LoadModelState's reads of the rows it copies into the model fail: EIO, after the
//       checkpoint was verified, as a disk failing in between would make them.
constexpr char kFailWriteOnRank[] = "CPPTRAIN_TEST_FAIL_WRITE_ON_RANK";
constexpr char kFailReadOnRank[] = "CPPTRAIN_TEST_FAIL_READ_ON_RANK";

// This process's rank as the launcher numbers it (RANK), for LoadModelState, which has no group.
int LaunchedRank() {
  const char* value = std::getenv("RANK");
  int rank = 0;
  return value != nullptr && absl::SimpleAtoi(value, &rank) ? rank : 0;
}

absl::Status InjectedWriteFailure(const std::string& path) {
  return absl::ErrnoToStatus(ENOSPC, absl::StrCat("cannot write '", path, "': the disk is full (",
                                                  kFailWriteOnRank, " injected it)"));
}

absl::Status InjectedReadFailure(const std::string& dir, const proto::CheckpointTensor& t) {
  return absl::ErrnoToStatus(
      EIO, absl::StrCat("checkpoint '", dir, "': cannot read tensor '", TensorDisplayName(t.name()),
                        "' from '", t.pieces_size() > 0 ? t.pieces(0).file() : "?", "' (",
                        kFailReadOnRank, " injected it)"));
}

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

// The checksums of the files this rank wrote: file -> key -> CRC-32C.
using WrittenChecksums = std::map<std::string, std::map<std::string, uint32_t>>;

// Writes `tensors` to `file` in `dir` and records their checksums. `fail`: its first tensor's
// write fails (CPPTRAIN_TEST_FAIL_WRITE_ON_RANK).
absl::Status WriteShardFile(const std::string& dir, const std::string& file,
                            const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                            WrittenChecksums& written, bool fail) {
  std::vector<SafetensorsWriter::Entry> entries;
  for (const auto& [key, tensor] : tensors) {
    entries.push_back({key, tensor.scalar_type(), tensor.sizes().vec()});
  }
  CT_ASSIGN_OR_RETURN(auto writer, SafetensorsWriter::Create(dir + "/" + file, entries));
  if (fail) return InjectedWriteFailure(dir + "/" + file);
  for (const auto& [key, tensor] : tensors) CT_RETURN_IF_ERROR(writer->Append(key, tensor));
  CT_RETURN_IF_ERROR(writer->Finish());
  for (const auto& [key, tensor] : tensors) {
    CT_ASSIGN_OR_RETURN(written[file][key], writer->Crc32cOf(key));
  }
  return absl::OkStatus();
}

// model.safetensors (rank 0's, in full form), its header written: every parameter whole.
absl::StatusOr<std::unique_ptr<SafetensorsWriter>> CreateFullWriter(
    const std::string& path, const torch::OrderedDict<std::string, at::Tensor>& params,
    FullyShardedModel* per_param, FlatShardedModel* flat) {
  std::vector<SafetensorsWriter::Entry> entries;
  for (const auto& item : params) {
    const ShardInfo* info = per_param ? per_param->Find(item.value())
                            : flat    ? flat->FindPiece(item.value())
                                      : nullptr;
    entries.push_back({item.key(), info ? info->dtype : item.value().scalar_type(),
                       info ? info->global_shape : item.value().sizes().vec()});
  }
  return SafetensorsWriter::Create(path, entries, {{"format", "pt"}});
}

// Makes model.safetensors durable and records its checksums.
absl::Status FinishFullWriter(SafetensorsWriter& writer,
                              const torch::OrderedDict<std::string, at::Tensor>& params,
                              WrittenChecksums& written) {
  CT_RETURN_IF_ERROR(writer.Finish());
  for (const auto& item : params) {
    CT_ASSIGN_OR_RETURN(written[kSafetensorsFileName][item.key()], writer.Crc32cOf(item.key()));
  }
  return absl::OkStatus();
}

// Puts every piece's checksum into rank 0's manifest: each rank contributes the pieces of the
// files it wrote, summed over ranks (each piece is written by one rank; a CRC-32C is exact in a
// double).
absl::Status GatherChecksums(HostGroup& ranks, const WrittenChecksums& written,
                             proto::CheckpointManifest& manifest) {
  std::vector<proto::TensorPiece*> pieces;
  for (proto::CheckpointTensor& t : *manifest.mutable_tensors()) {
    for (proto::TensorPiece& piece : *t.mutable_pieces()) pieces.push_back(&piece);
  }
  const int64_t n = static_cast<int64_t>(pieces.size());
  // The sum below needs the same pieces on every rank: n and n^2 sum to world * n and
  // world * n^2 exactly when every rank has n.
  const double count = static_cast<double>(n);
  CT_ASSIGN_OR_RETURN(at::Tensor counts,
                      ranks.AllReduceSum(torch::tensor({count, count * count}, torch::kFloat64)));
  counts = counts.to(torch::kCPU);
  const double world = ranks.world_size();
  if (counts[0].item<double>() != world * count ||
      counts[1].item<double>() != world * count * count) {
    return absl::InternalError(
        absl::StrCat("saving a checkpoint: the ranks list different tensors (this rank ", n,
                     " pieces, ", counts[0].item<double>() / world,
                     " on average): the optimizer holds state for some "
                     "parameters on some ranks only; save after a step every rank took, or with "
                     "save_only_model"));
  }
  at::Tensor values = torch::zeros({2 * n}, torch::kFloat64);
  double* v = values.data_ptr<double>();
  for (int64_t i = 0; i < n; ++i) {
    auto file = written.find(pieces[i]->file());
    if (file == written.end()) continue;
    auto key = file->second.find(pieces[i]->key());
    if (key == file->second.end()) continue;
    v[i] = key->second;
    v[n + i] = 1;  // written by this rank
  }
  CT_ASSIGN_OR_RETURN(at::Tensor sums, ranks.AllReduceSum(values));
  sums = sums.to(torch::kCPU).contiguous();
  const double* s = sums.data_ptr<double>();
  for (int64_t i = 0; i < n; ++i) {
    if (s[n + i] != 1) {
      return absl::InternalError(absl::StrCat("saving a checkpoint: piece ", pieces[i]->key(),
                                              " of ", pieces[i]->file(), " was written by ",
                                              s[n + i], " ranks, expected exactly 1"));
    }
    pieces[i]->set_crc32c(static_cast<uint32_t>(s[i]));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Loading: a plan (what every parameter reads), checked whole before anything is copied.

// Rows [begin, begin + rows) of a manifest tensor, viewed as `view` once read.
struct Read {
  const proto::CheckpointTensor* entry = nullptr;
  int64_t begin = 0;
  int64_t rows = 0;
  std::vector<int64_t> view;
  // FSDP1: of the rows read, flattened, elements [skip, skip + take) are this rank's piece.
  int64_t skip = 0;
  int64_t take = -1;  // -1: all of them
};

// The rows covering an FSDP1 piece (elements of the flattened tensor) of a tensor stored with
// `stored` shape, and where the piece starts in them.
Read PieceRead(const proto::CheckpointTensor* entry, const std::vector<int64_t>& stored,
               const ShardInfo& piece, std::vector<int64_t> view) {
  int64_t numel = 1;
  for (int64_t d : stored) numel *= d;
  const int64_t row_numel = stored[0] == 0 ? 1 : std::max<int64_t>(1, numel / stored[0]);
  Read read{entry, 0, 0, std::move(view), 0, piece.local_numel};
  if (piece.local_numel == 0) return read;
  read.begin = piece.element_begin / row_numel;
  const int64_t end = (piece.element_begin + piece.local_numel + row_numel - 1) / row_numel;
  read.rows = end - read.begin;
  read.skip = piece.element_begin - read.begin * row_numel;
  return read;
}

struct ParamPlan {
  std::string name;
  at::Tensor param;
  Read weights;
  std::map<std::string, Read> state;  // optimizer state by name
};

struct LoadPlan {
  std::vector<ParamPlan> params;
  LoadProblems problems;
  bool has_optimizer_state = false;  // the checkpoint holds some
};

std::vector<int64_t> ShapeOf(const proto::CheckpointTensor& t) {
  return {t.shape().begin(), t.shape().end()};
}

// The decoder config fields the checkpoint and the model disagree on: against the manifest's
// config, or an older checkpoint's config.json.
void CompareDecoderConfig(const std::string& dir, const proto::CheckpointManifest& manifest,
                          const TrainableModel& model, LoadProblems& problems) {
  const proto::DecoderConfig* decoder = AsDecoderConfig(model.ConfigProto());
  if (decoder == nullptr) return;
  if (manifest.has_decoder()) {
    problems.AddConfigDifferences(DecoderConfigDifferences(manifest.decoder(), *decoder));
    return;
  }
  absl::StatusOr<std::string> config_json = CheckpointFilePath(dir, "config.json");
  if (absl::IsNotFound(config_json.status())) return;
  absl::StatusOr<proto::DecoderConfig> saved =
      config_json.ok() ? DecoderConfigFromHfConfig(*config_json)
                       : absl::StatusOr<proto::DecoderConfig>(config_json.status());
  if (!saved.ok()) {
    LOG(WARNING) << "checkpoint '" << dir
                 << "': cannot compare the model with config.json: " << saved.status();
    return;
  }
  problems.AddConfigDifferences(
      DecoderConfigDifferences(*saved, *decoder, "the checkpoint's config.json"));
}

// Matches the model's parameters (and the optimizer's state for them) with the manifest.
LoadPlan PlanLoad(const std::string& dir, const proto::CheckpointManifest& manifest,
                  TrainableModel& model, torch::optim::Optimizer* optimizer) {
  LoadPlan plan;
  CompareDecoderConfig(dir, manifest, model, plan.problems);
  std::map<std::string, const proto::CheckpointTensor*> by_name;
  std::vector<std::string> saved_params;
  for (const proto::CheckpointTensor& t : manifest.tensors()) {
    by_name[t.name()] = &t;
    if (absl::StartsWith(t.name(), kModelPrefix)) saved_params.push_back(t.name());
    if (absl::StartsWith(t.name(), kOptimizerPrefix)) plan.has_optimizer_state = true;
  }
  FullyShardedModel* sharded = FullyShardedOf(model);
  FlatShardedModel* flat = FlatShardedOf(model);
  std::set<std::string> params;
  std::vector<std::string> param_names;
  const auto named = model.named_parameters(/*recurse=*/true);
  for (const auto& item : named) param_names.push_back(item.key());
  const int64_t saved_layers = DecoderLayerCount(saved_params);
  const int64_t model_layers = DecoderLayerCount(param_names);
  for (const auto& item : named) {
    const std::string& name = item.key();
    params.insert(name);
    const ShardInfo* info = sharded ? sharded->Find(item.value()) : nullptr;
    const ShardInfo* piece = flat ? flat->FindPiece(item.value()) : nullptr;
    const std::vector<int64_t> global = info    ? info->global_shape
                                        : piece ? piece->global_shape
                                                : item.value().sizes().vec();
    auto it = by_name.find(kModelPrefix + name);
    if (it == by_name.end()) {
      plan.problems.AddMissing(name, global, ConfigFieldHint(name, saved_layers));
      continue;
    }
    if (ShapeOf(*it->second) != global) {
      plan.problems.AddShapeMismatch(name, ShapeOf(*it->second), global);
      continue;
    }
    const int64_t begin = info ? info->row_begin : 0;
    const int64_t rows = info ? info->local_rows : StoredShape(global)[0];
    const std::vector<int64_t> local = item.value().sizes().vec();
    ParamPlan p{name, item.value(), {it->second, begin, rows, local}, {}};
    if (piece != nullptr) p.weights = PieceRead(it->second, StoredShape(global), *piece, local);
    const std::string prefix = absl::StrCat(kOptimizerPrefix, name, ".");
    for (auto s = by_name.lower_bound(prefix);
         optimizer != nullptr && s != by_name.end() && absl::StartsWith(s->first, prefix); ++s) {
      const std::vector<int64_t> shape = ShapeOf(*s->second);
      const std::string state = s->first.substr(prefix.size());
      if (state.find('.') != std::string::npos) continue;  // another parameter's (name.x.y)
      // Shaped like the parameter: split like it. Anything else (step): whole.
      const bool split_like_param = (info != nullptr || piece != nullptr) && shape == global;
      p.state[state] = !split_like_param  ? Read{s->second, 0, StoredShape(shape)[0], shape}
                       : piece != nullptr ? PieceRead(s->second, StoredShape(global), *piece, local)
                                          : Read{s->second, begin, rows, local};
    }
    plan.params.push_back(std::move(p));
  }
  for (const std::string& saved : saved_params) {
    const std::string name = saved.substr(sizeof(kModelPrefix) - 1);
    if (params.count(name) == 0) {
      plan.problems.AddUnexpected(name, ShapeOf(*by_name.at(saved)),
                                  ConfigFieldHint(name, model_layers));
    }
  }
  if (optimizer == nullptr) return plan;
  for (const auto& [saved, t] : by_name) {
    if (!absl::StartsWith(saved, kOptimizerPrefix)) continue;
    const std::string rest = saved.substr(sizeof(kOptimizerPrefix) - 1);
    const std::string param = rest.substr(0, rest.rfind('.'));
    // A parameter the model lacks is reported once, for its weights.
    if (params.count(param) == 0 && by_name.count(kModelPrefix + param) == 0) {
      plan.problems.AddUnexpected(saved, ShapeOf(*t), ConfigFieldHint(param, model_layers));
    }
  }
  return plan;
}

std::vector<const Read*> ReadsOf(const ParamPlan& p) {
  std::vector<const Read*> reads = {&p.weights};
  for (const auto& [state, read] : p.state) reads.push_back(&read);
  return reads;
}

// Checksums every piece the plan reads rows of and checks those rows are finite.
absl::Status VerifyPlan(CheckpointFiles& files, const proto::CheckpointManifest& manifest,
                        const LoadPlan& plan) {
  if (!HasChecksums(manifest)) {
    LOG(WARNING) << "checkpoint '" << files.dir() << "' has no checksums (manifest format "
                 << manifest.format_version() << ", written before they existed): its data "
                 << "cannot be verified, only checked for non-finite values";
  }
  for (const ParamPlan& p : plan.params) {
    for (const Read* read : ReadsOf(p)) {
      if (read->take == 0) continue;  // an empty FSDP1 piece reads nothing
      CT_RETURN_IF_ERROR(files.ForEachSlice(
          *read->entry, read->begin, read->rows,
          [&](const proto::TensorPiece& piece, int64_t a, int64_t, const at::Tensor& slice) {
            CT_RETURN_IF_ERROR(files.VerifyPiece(*read->entry, piece).status);
            return CheckFinite(
                absl::StrCat("checkpoint '", files.dir(), "', file '", piece.file(), "'"),
                TensorDisplayName(read->entry->name()), slice, a);
          }));
    }
  }
  return absl::OkStatus();
}

std::string Keys(const std::vector<std::string>& keys) {
  return keys.empty() ? "nothing" : absl::StrJoin(keys, ", ");
}

std::string Keys(const std::map<std::string, at::Tensor>& state) {
  std::vector<std::string> keys;
  for (const auto& [key, value] : state) keys.push_back(key);
  return Keys(keys);
}

// Restores the optimizer's state for one parameter; the state names must be the ones the
// optimizer keeps.
absl::Status ImportState(const std::string& dir, const ParamPlan& p,
                         const std::map<std::string, at::Tensor>& state,
                         torch::optim::Optimizer& optimizer, bool strict) {
  absl::Status imported = ImportOptimizerState(optimizer, p.param, state);
  if (!imported.ok()) {
    return absl::Status(imported.code(), absl::StrCat("checkpoint '", dir, "', parameter ", p.name,
                                                      ": ", imported.message()));
  }
  // Names only: ZeRO's ExportState is collective, and this runs inside one rank's read loop.
  std::vector<std::string> kept = OptimizerStateNames(optimizer, p.param);
  std::sort(kept.begin(), kept.end());
  if (Keys(kept) == Keys(state)) return absl::OkStatus();
  const std::string problem = absl::StrCat(
      "checkpoint '", dir, "': the optimizer state of ", p.name, " was saved as ", Keys(state),
      ", but the optimizer keeps ", Keys(kept), " (another optimizer type or options?)");
  if (!strict) {
    LOG(WARNING) << problem << " (not strict: loading what matches)";
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      problem, "; the parameters are loaded. Use the optimizer the checkpoint was saved with, or ",
      kLoadStrictEscape));
}

// The rows `read` names, narrowed to its FSDP1 piece when it has one.
absl::StatusOr<at::Tensor> ReadRows(CheckpointFiles& files, const Read& read) {
  if (read.take == 0) return at::empty({0});
  CT_ASSIGN_OR_RETURN(at::Tensor rows, files.Rows(*read.entry, read.begin, read.rows));
  if (read.take < 0) return rows;
  return CatchTorch([&] { return rows.reshape({-1}).narrow(0, read.skip, read.take); });
}

// Copies what the plan reads into the model and the optimizer; `fail_reads`: the first read
// fails (CPPTRAIN_TEST_FAIL_READ_ON_RANK).
absl::Status CopyPlan(CheckpointFiles& files, const LoadPlan& plan,
                      torch::optim::Optimizer* optimizer, bool strict, bool fail_reads) {
  torch::NoGradGuard no_grad;
  int64_t bytes = 0;
  for (const ParamPlan& p : plan.params) {
    if (fail_reads) return InjectedReadFailure(files.dir(), *p.weights.entry);
    CT_ASSIGN_OR_RETURN(at::Tensor data, ReadRows(files, p.weights));
    CT_RETURN_IF_ERROR(CatchTorch([&] { p.param.detach().copy_(data.view(p.weights.view)); }));
    bytes += data.numel() * data.element_size();
    if (optimizer == nullptr || p.state.empty()) continue;
    std::map<std::string, at::Tensor> state;
    for (const auto& [name, read] : p.state) {
      CT_ASSIGN_OR_RETURN(at::Tensor value, ReadRows(files, read));
      // A named copy: clang before 16 cannot capture a structured binding in a lambda.
      const std::vector<int64_t>& view = read.view;
      CT_ASSIGN_OR_RETURN(state[name], CatchTorch([&] { return value.view(view); }));
    }
    CT_RETURN_IF_ERROR(ImportState(files.dir(), p, state, *optimizer, strict));
  }
  VLOG(1) << "loaded " << bytes << " bytes of parameters from " << files.dir();
  return absl::OkStatus();
}

// FSDP1 holds each parameter as a 1-d piece of its flattened value; a sharded checkpoint
// holds rows split over the shard group as FSDP2 splits them (ShardRowRange), so that any
// engine at any world size reads it. These are the rows this rank writes.
ShardInfo RowsOfPiece(const ShardInfo& piece) {
  ShardInfo rows = piece;
  const int64_t stored_rows = StoredShape(piece.global_shape)[0];
  const RowRange range = ShardRowRange(stored_rows, piece.shard_size, piece.shard_rank);
  rows.chunk_rows = ShardChunkRows(stored_rows, piece.shard_size);
  rows.row_begin = range.begin;
  rows.local_rows = range.rows();
  return rows;
}

// `local` as the rows it is written as: as it is, or for an FSDP1 piece (every rank of the
// mesh calls it for the same tensors) its rows rebuilt from the pieces: each rank puts its
// piece into a zeroed full tensor in `staging` (FullRowsBytes), the shard group sums them, the
// rank keeps a copy of its rows. A failure of this rank's own copies does not skip the sum: it
// goes into `*first_failure` unless one is there already, and while one is there the rows
// come back undefined. An error returned is the collective's.
absl::StatusOr<at::Tensor> RowsToWrite(FlatShardedModel* flat, const ShardInfo* piece,
                                       const ShardInfo& rows, const at::Tensor& local,
                                       const at::Tensor& staging, absl::Status* first_failure) {
  if (piece == nullptr) return local.detach().reshape(StoredShape(local.sizes().vec()));
  at::Tensor full = StagingView(staging, {c10::multiply_integers(piece->global_shape)},
                                local.scalar_type());
  if (first_failure->ok()) {
    *first_failure = CatchTorch([&] {
      full.zero_();
      full.narrow(0, piece->element_begin, piece->local_numel)
          .copy_(local.detach().reshape({-1}));
    });
  }
  CT_ASSIGN_OR_RETURN(std::unique_ptr<Work> work,
                      flat->mesh().shard->AllReduce(full, ReduceOp::kSum));
  CT_RETURN_IF_ERROR(work->Synchronize());
  at::Tensor out;
  if (!first_failure->ok()) return out;
  *first_failure = CatchTorch([&] {  // a copy even on the CPU: the next tensor reuses `staging`
    out = full.view(StoredShape(piece->global_shape))
              .narrow(0, rows.row_begin, rows.local_rows)
              .to(at::kCPU, full.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
  });
  return out;
}

// The bytes RowsToWrite needs for the largest FSDP1 parameter or optimizer state it rebuilds.
int64_t FullRowsBytes(FlatShardedModel& flat,
                      const torch::OrderedDict<std::string, at::Tensor>& params,
                      torch::optim::Optimizer* optimizer) {
  int64_t most = 1;
  for (const auto& item : params) {
    const at::Tensor& p = item.value();
    const ShardInfo* piece = flat.FindPiece(p);
    if (piece == nullptr) continue;
    const int64_t numel = c10::multiply_integers(piece->global_shape);
    int64_t element = p.element_size();
    if (optimizer != nullptr) {
      for (const auto& [name, value] : ExportOptimizerState(*optimizer, p)) {
        if (value.sizes() == p.sizes()) element = std::max<int64_t>(element, value.element_size());
      }
    }
    most = std::max(most, numel * element);
  }
  return most;
}

// Device memory for a save's collectives, allocated once before them and agreed on by every
// rank (sharding/agreed_buffer.h): FSDP's full-model gathers, FSDP1's rebuilt rows. Undefined,
// with no agreement, when the save gathers nothing (every rank decides alike).
absl::StatusOr<at::Tensor> SaveStaging(HostGroup& ranks, ShardingCore* sharded,
                                       FlatShardedModel* flat,
                                       const torch::OrderedDict<std::string, at::Tensor>& params,
                                       torch::optim::Optimizer* optimizer,
                                       const SaveModelStateOptions& options) {
  if (sharded == nullptr || (!options.full_model && flat == nullptr)) return at::Tensor();
  int64_t bytes = options.full_model ? sharded->GatherFullBytes() : 1;
  if (flat != nullptr) {
    bytes = std::max(bytes, FullRowsBytes(*flat, params,
                                          options.include_optimizer ? optimizer : nullptr));
  }
  return AllocateOnEveryRank(ranks, bytes, sharded->device(), "the checkpoint's gathers");
}

// Lends an optimizer whose ExportState is collective (ZeRO's) the device scratch its gathers
// need, allocated once on every rank and agreed on (CheckpointableOptimizer::ExportScratch),
// and takes it back when the lease goes; nothing for other optimizers.
class ExportScratchLease {
 public:
  static absl::StatusOr<ExportScratchLease> Lend(HostGroup& ranks,
                                                 torch::optim::Optimizer* optimizer) {
    ExportScratchLease lease;
    auto* to = dynamic_cast<CheckpointableOptimizer*>(optimizer);
    if (to == nullptr) return lease;
    const CheckpointableOptimizer::ExportScratch need = to->ExportScratchNeeded();
    if (!need.collective) return lease;
    CT_ASSIGN_OR_RETURN(const at::Tensor scratch,
                        AllocateOnEveryRank(ranks, need.bytes, need.device,
                                            "gathering the optimizer state"));
    to->UseExportScratch(scratch);
    lease.to_ = to;
    return lease;
  }
  ExportScratchLease(ExportScratchLease&& other) noexcept : to_(other.to_) { other.to_ = nullptr; }
  ExportScratchLease& operator=(ExportScratchLease&&) = delete;
  ~ExportScratchLease() {
    if (to_ != nullptr) to_->UseExportScratch(at::Tensor());
  }

 private:
  ExportScratchLease() = default;
  CheckpointableOptimizer* to_ = nullptr;
};

// The plan for `dir`, with its problems resolved (strict: an error; else warnings when `warn`).
absl::StatusOr<LoadPlan> ResolvedPlan(const std::string& dir,
                                      const proto::CheckpointManifest& manifest,
                                      TrainableModel& model, torch::optim::Optimizer* optimizer,
                                      const LoadModelStateOptions& options, bool warn) {
  LoadPlan plan = PlanLoad(dir, manifest, model, optimizer);
  if (options.strict || warn) {
    CT_RETURN_IF_ERROR(plan.problems.Resolve(absl::StrCat("checkpoint '", dir, "'"), options.strict,
                                             kLoadStrictEscape));
  }
  if (warn && optimizer != nullptr && !plan.has_optimizer_state) {
    LOG(WARNING) << "checkpoint '" << dir << "' holds no optimizer state (saved with "
                 << "save_only_model?): the optimizer starts from nothing";
  }
  return plan;
}

}  // namespace

absl::Status SaveModelState(const std::string& dir, TrainableModel& model,
                            torch::optim::Optimizer* optimizer, HostGroup& ranks,
                            const SaveModelStateOptions& options) {
  FullyShardedModel* per_param = FullyShardedOf(model);
  FlatShardedModel* flat = FlatShardedOf(model);
  ShardingCore* sharded = per_param != nullptr ? static_cast<ShardingCore*>(per_param) : flat;
  const int rank = ranks.rank();
  const int shards = sharded ? sharded->mesh().shard->size() : 1;
  const int shard = sharded ? sharded->mesh().shard->rank() : 0;
  // One replica writes: rank = replica * shards + shard, so replica 0 is ranks [0, shards).
  const bool writes = sharded ? rank < shards : rank == 0;
  const std::string my_file = ShardFileName(shard, shards);
  const std::string whole_file = ShardFileName(0, shards);
  const std::string full_path = dir + "/" + kSafetensorsFileName;
  const bool fail_writes = FaultInjectedOnRank(kFailWriteOnRank, rank);

  proto::CheckpointManifest manifest;
  manifest.set_engine(options.engine_name);
  manifest.set_world_size(ranks.world_size());
  if (const proto::DecoderConfig* decoder = AsDecoderConfig(model.ConfigProto())) {
    *manifest.mutable_decoder() = *decoder;
  }
  std::vector<std::pair<std::string, at::Tensor>> mine;  // this rank's shard-file entries
  WrittenChecksums written;
  const auto params = model.named_parameters(/*recurse=*/true);

  // This rank's first failure: a write, or a copy around a gather. After one the rank writes
  // nothing more, but it keeps issuing every collective the others issue (the gathers, FSDP1's
  // all-reduces) and all agree on the outcome before the checksums: one full disk must not
  // leave the other ranks waiting in a collective until ddp_timeout. The device memory those
  // collectives use is allocated before them, once, and agreed on, for the same reason.
  absl::Status io;
  CT_ASSIGN_OR_RETURN(const at::Tensor staging,
                      SaveStaging(ranks, sharded, flat, params, optimizer, options));
  CT_ASSIGN_OR_RETURN(const ExportScratchLease lease,
                      ExportScratchLease::Lend(ranks, options.include_optimizer ? optimizer
                                                                                : nullptr));
  std::unique_ptr<SafetensorsWriter> full_writer;
  if (options.full_model && rank == 0) {
    auto created = CreateFullWriter(full_path, params, per_param, flat);
    if (created.ok()) full_writer = *std::move(created);
    io = created.status();
  }
  for (const auto& item : params) {
    const std::string& name = item.key();
    const at::Tensor& p = item.value();
    const ShardInfo* piece = flat ? flat->FindPiece(p) : nullptr;
    const ShardInfo rows_of_piece = piece ? RowsOfPiece(*piece) : ShardInfo();
    const ShardInfo* info = per_param ? per_param->Find(p) : piece ? &rows_of_piece : nullptr;
    const std::vector<int64_t> global = info ? info->global_shape : p.sizes().vec();
    const at::ScalarType dtype = info ? info->dtype : p.scalar_type();
    const Layout split{info, StoredShape(global)};
    if (options.full_model) {
      AddToManifest(manifest, kModelPrefix + name, name, dtype, global,
                    Layout{nullptr, split.shape}, kSafetensorsFileName);
      at::Tensor whole = p.detach();
      if (info != nullptr) {
        CT_ASSIGN_OR_RETURN(whole, sharded->GatherFull(p, staging, &io));  // every rank
      }
      if (full_writer && io.ok()) {
        io = fail_writes ? InjectedWriteFailure(full_path) : full_writer->Append(name, whole);
      }
    } else {
      AddToManifest(manifest, kModelPrefix + name, kModelPrefix + name, dtype, global, split,
                    whole_file);
      CT_ASSIGN_OR_RETURN(at::Tensor rows,
                          RowsToWrite(flat, piece, rows_of_piece, p, staging, &io));
      if (io.ok() && writes && (info ? info->local_rows > 0 : true)) {
        mine.emplace_back(kModelPrefix + name, rows);
      }
    }
    if (optimizer == nullptr || !options.include_optimizer) continue;
    for (const auto& [state_name, value] : ExportOptimizerState(*optimizer, p)) {
      const std::string key = absl::StrCat(kOptimizerPrefix, name, ".", state_name);
      // Shaped like the parameter: split like it. Anything else (step): whole, from rank 0.
      const bool split_like_param = info != nullptr && value.sizes() == p.sizes();
      const std::vector<int64_t> logical = split_like_param ? global : value.sizes().vec();
      AddToManifest(manifest, key, key, value.scalar_type(), logical,
                    split_like_param ? split : Layout{nullptr, StoredShape(logical)}, whole_file);
      const bool write_it =
          split_like_param ? writes && info->local_rows > 0 : (sharded ? rank == 0 : writes);
      at::Tensor rows = value.detach().reshape(StoredShape(value.sizes().vec()));
      if (split_like_param) {
        CT_ASSIGN_OR_RETURN(rows, RowsToWrite(flat, piece, rows_of_piece, value, staging, &io));
      }
      if (io.ok() && write_it) mine.emplace_back(key, rows);
    }
  }
  if (full_writer && io.ok()) io = FinishFullWriter(*full_writer, params, written);
  full_writer.reset();  // unfinished: removes its temporary file
  if (io.ok() && writes && !mine.empty()) {
    io = WriteShardFile(dir, my_file, mine, written, fail_writes);
  }
  CT_RETURN_IF_ERROR(AllRanksOk(ranks, io));
  CT_RETURN_IF_ERROR(GatherChecksums(ranks, written, manifest));
  // Rank 0 writes the manifest; the others wait to hear how that went.
  return AllRanksOk(ranks, rank == 0 ? WriteManifest(dir, manifest) : absl::OkStatus());
}

absl::Status VerifyModelState(const std::string& dir, TrainableModel& model,
                              torch::optim::Optimizer* optimizer,
                              const LoadModelStateOptions& options) {
  CT_ASSIGN_OR_RETURN(proto::CheckpointManifest manifest, ReadManifest(dir));
  CT_ASSIGN_OR_RETURN(LoadPlan plan,
                      ResolvedPlan(dir, manifest, model, optimizer, options, /*warn=*/false));
  CheckpointFiles files(dir);
  return VerifyPlan(files, manifest, plan);
}

absl::Status LoadModelState(const std::string& dir, TrainableModel& model,
                            torch::optim::Optimizer* optimizer,
                            const LoadModelStateOptions& options) {
  CT_ASSIGN_OR_RETURN(proto::CheckpointManifest manifest, ReadManifest(dir));
  CT_ASSIGN_OR_RETURN(LoadPlan plan,
                      ResolvedPlan(dir, manifest, model, optimizer, options, /*warn=*/true));
  CheckpointFiles files(dir);
  if (!options.verified) CT_RETURN_IF_ERROR(VerifyPlan(files, manifest, plan));
  return CopyPlan(files, plan, optimizer, options.strict,
                  FaultInjectedOnRank(kFailReadOnRank, LaunchedRank()));
}

}  // namespace cpptrain
