#include "sharding/flat_shard.h"

#include <ATen/ATen.h>
#include <torch/utils.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "module/deferred.h"

namespace cpptrain {
namespace {

using sharding_core::Assignment;
using Param = ShardGroup::Param;

CoreOptions CoreOptionsOf(const FlatShardOptions& options) {
  CoreOptions core;
  core.device = *options.device;
  core.param_dtype = options.param_dtype;
  core.cast_forward_inputs = options.cast_forward_inputs;
  core.forward_prefetch = options.forward_prefetch;
  core.backward_prefetch = options.backward_prefetch;
  return core;
}

int64_t RoundUp(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

// Lays the group's parameters out in the flat parameter (aligned starts), pads it to a
// multiple of the shard size and gives each parameter this rank's intersection.
void LayOut(ShardGroup& group, const ShardMesh& mesh, int alignment_bytes) {
  const int world = mesh.shard->size();
  const int rank = mesh.shard->rank();
  int64_t end = 0;
  for (Param& p : group.params) {
    const int64_t align = std::max<int64_t>(
        1, alignment_bytes / static_cast<int64_t>(c10::elementSize(p.info.dtype)));
    p.offset = RoundUp(end, align);
    end = p.offset + p.numel;
  }
  group.segment_numel = RoundUp(end, world) / world;
  const int64_t s = group.segment_numel;
  const int64_t mine = rank * s;
  for (Param& p : group.params) {
    const int64_t begin = std::max(p.offset, mine);
    const int64_t stop = std::min(p.offset + p.numel, mine + s);
    p.info.local_numel = std::max<int64_t>(0, stop - begin);
    p.info.element_begin = p.info.local_numel > 0 ? begin - p.offset : 0;
    p.local_offset = p.info.local_numel > 0 ? begin - mine : 0;
  }
}

// Fills `slot`, elements [element_begin, +local_numel) of a deferred parameter, with the
// model's initial values from the rows that cover them, a block of rows at a time (the values
// do not depend on the split), so at most ~8 MiB of rows exist beside the shard: a rank's piece
// of a large embedding is never allocated twice.
absl::Status InitializePiece(TrainableModel& model, const Param& p, at::Tensor slot) {
  const FlatPieceRows piece = RowsCoveringPiece(p.info);
  const int64_t row_numel = std::max<int64_t>(1, p.row_numel);
  constexpr int64_t kBlockBytes = int64_t{8} << 20;
  const int64_t block_rows = std::max<int64_t>(
      1, kBlockBytes / (row_numel * static_cast<int64_t>(c10::elementSize(p.info.dtype))));
  std::vector<int64_t> shape = p.info.global_shape;
  if (shape.empty()) shape = {1};
  int64_t done = 0;  // elements of the piece filled so far
  for (int64_t row = piece.rows.begin; row < piece.rows.end; row += block_rows) {
    shape[0] = std::min(block_rows, piece.rows.end - row);
    at::Tensor rows = at::zeros(shape, at::TensorOptions().dtype(p.info.dtype));
    CT_RETURN_IF_ERROR(model.InitializeRows(p.info.name, row, rows));
    const int64_t first = row == piece.rows.begin ? piece.skip : 0;
    const int64_t take = std::min(shape[0] * row_numel - first, p.info.local_numel - done);
    slot.narrow(0, done, take).copy_(rows.reshape({-1}).narrow(0, first, take));
    done += take;
  }
  return absl::OkStatus();
}

// This rank's S elements of the group's flat parameter: rank 0's values scattered (sync),
// then pieces of parameters that are deferred (on rank 0 under sync, here otherwise)
// initialized by this rank; without sync the rank's own values.
absl::Status FillFlatShard(TrainableModel& model, const ShardMesh& mesh, ShardGroup& group,
                           const std::vector<bool>& deferred_at_source, bool sync,
                           c10::Device device) {
  const int world = mesh.shard->size();
  const int64_t s = group.segment_numel;
  const at::ScalarType dtype = group.params.empty() ? at::kFloat : group.params[0].info.dtype;
  const at::TensorOptions on_device = at::TensorOptions().dtype(dtype).device(device);
  at::Tensor shard = at::zeros({s}, on_device);
  // Nothing to scatter when rank 0 has no values for the group (all deferred there, as under
  // cpu_ram_efficient_loading): rank 0 then never holds the group's full flat parameter.
  const bool from_source = std::find(deferred_at_source.begin(), deferred_at_source.end(),
                                     false) != deferred_at_source.end();
  if (sync && s > 0 && from_source) {
    at::Tensor parts;
    if (mesh.shard->rank() == 0) {
      parts = at::zeros({world * s}, on_device);
      for (size_t i = 0; i < group.params.size(); ++i) {
        const Param& p = group.params[i];
        if (deferred_at_source[i]) continue;
        parts.narrow(0, p.offset, p.numel).copy_(p.param.detach().reshape({-1}));
      }
    }
    CT_ASSIGN_OR_RETURN(std::unique_ptr<Work> scattered, mesh.shard->Scatter(parts, shard, 0));
    CT_RETURN_IF_ERROR(scattered->Synchronize());
    if (mesh.replicate != nullptr) {
      CT_ASSIGN_OR_RETURN(std::unique_ptr<Work> work, mesh.replicate->Broadcast(shard, 0));
      CT_RETURN_IF_ERROR(work->Synchronize());
    }
  }
  for (size_t i = 0; i < group.params.size(); ++i) {
    const Param& p = group.params[i];
    if (p.info.local_numel == 0 || (sync && !deferred_at_source[i])) continue;
    at::Tensor slot = shard.narrow(0, p.local_offset, p.info.local_numel);
    if (IsDeferred(p.param)) {
      CT_RETURN_IF_ERROR(InitializePiece(model, p, slot));
    } else {
      slot.copy_(
          p.param.detach().reshape({-1}).narrow(0, p.info.element_begin, p.info.local_numel));
    }
  }
  group.flat_shard = shard;
  return absl::OkStatus();
}

absl::Status CheckOneDtype(const ShardGroup& group) {
  for (const Param& p : group.params) {
    if (p.info.dtype == group.params.front().info.dtype) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "FlatShard: unit ", group.unit_class, " holds ", group.params.front().info.name, " in ",
        c10::toString(group.params.front().info.dtype), " and ", p.info.name, " in ",
        c10::toString(p.info.dtype),
        ": FSDP1 flattens a unit's parameters into one tensor of one dtype; give them one dtype "
        "(param_dtype sets only the gathered dtype) or wrap them in different units"));
  }
  return absl::OkStatus();
}

// Shards, views and the freed full buffer of one group, once its parameters are listed.
absl::Status BuildGroup(TrainableModel& model, const ShardMesh& mesh,
                        const FlatShardOptions& options, const std::vector<bool>& deferred,
                        bool sync, ShardGroup& group) {
  CT_RETURN_IF_ERROR(CheckOneDtype(group));
  LayOut(group, mesh, options.alignment_bytes);
  const c10::Device device = *options.device;
  CT_ASSIGN_OR_RETURN(group.param_dtype, sharding_core::GroupDtype(group, options.param_dtype));
  group.reduce_dtype = options.reduce_dtype.value_or(group.param_dtype);
  return CatchTorch([&]() -> absl::Status {
    CT_RETURN_IF_ERROR(FillFlatShard(model, mesh, group, deferred, sync, device));
    if (options.offload_params && device.is_cuda()) {
      group.flat_shard = group.flat_shard.cpu().pin_memory();
    }
    const int world = mesh.shard->size();
    group.full = at::empty({world * group.segment_numel},
                           at::TensorOptions().dtype(group.param_dtype).device(device));
    for (Param& p : group.params) {
      p.local = group.flat_shard.narrow(0, p.local_offset, p.info.local_numel);
      p.full_view = group.full.narrow(0, p.offset, p.numel).view(p.info.global_shape);
      p.param.set_data(p.local);
    }
    sharding_core::FreeStorage(group.full);
    return absl::OkStatus();
  });
}

absl::Status CastBuffers(TrainableModel& model, std::optional<at::ScalarType> dtype) {
  if (!dtype) return absl::OkStatus();
  return CatchTorch([&] {
    for (auto& buffer : model.buffers(/*recurse=*/true)) {
      if (buffer.is_floating_point()) buffer.set_data(buffer.to(*dtype));
    }
  });
}

}  // namespace

FlatShardedModel::FlatShardedModel(ShardMesh mesh, FlatShardOptions options, CoreOptions core)
    : ShardingCore(std::move(mesh), std::move(core)), options_(std::move(options)) {}

const ShardInfo* FlatShardedModel::FindPiece(const at::Tensor& param) const {
  const std::pair<ShardGroup*, size_t>* where = Locate(param);
  return where == nullptr ? nullptr : &where->first->params[where->second].info;
}

std::vector<std::pair<int64_t, int64_t>> FlatShardedModel::FlatSizes() const {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const auto& g : groups_) {
    const int64_t used = g->params.empty() ? 0 : g->params.back().offset + g->params.back().numel;
    out.emplace_back(used, g->segment_numel * mesh().shard->size());
  }
  return out;
}

FlatPieceRows RowsCoveringPiece(const ShardInfo& piece) {
  FlatPieceRows out;
  if (piece.local_numel == 0) return out;
  int64_t numel = 1;
  for (int64_t d : piece.global_shape) numel *= d;
  const int64_t rows = piece.global_shape.empty() ? 1 : piece.global_shape[0];
  const int64_t row_numel = rows == 0 ? 1 : std::max<int64_t>(1, numel / rows);
  out.rows.begin = piece.element_begin / row_numel;
  out.rows.end = (piece.element_begin + piece.local_numel + row_numel - 1) / row_numel;
  out.skip = piece.element_begin - out.rows.begin * row_numel;
  return out;
}

FlatShardedModel* FlatShardedOf(const TrainableModel& model) {
  return dynamic_cast<FlatShardedModel*>(model.sharding());
}

absl::StatusOr<FlatShardedModel*> FlatShard(TrainableModel& model, ShardMesh mesh,
                                            const FlatShardOptions& options) {
  if (model.sharding() != nullptr) {
    return absl::FailedPreconditionError(
        "FlatShard: the model is already sharded; hand it to the Trainer as it is");
  }
  if (options.alignment_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("FlatShard: alignment_bytes is ", options.alignment_bytes, "; use 1 or more"));
  }
  CT_ASSIGN_OR_RETURN(const c10::Device device,
                      sharding_core::ResolveDevice(mesh, options.device, "FlatShard"));
  std::vector<Unit*> units;
  std::vector<Assignment> assignments;
  CT_RETURN_IF_ERROR(sharding_core::AssignGroups(model, options.wrap, &units, &assignments));
  FlatShardOptions resolved = options;
  resolved.device = device;
  auto state = std::shared_ptr<FlatShardedModel>(
      new FlatShardedModel(mesh, resolved, CoreOptionsOf(resolved)));
  FlatShardedModel& s = *state;
  s.groups_ = sharding_core::MakeGroups(model, units, ShardGroup::Layout::kFlat,
                                        options.reshard_after_forward,
                                        /*root_reshard=*/false);
  torch::NoGradGuard no_grad;
  const bool sync = options.sync_module_states && mesh.world_size() > 1;
  CT_ASSIGN_OR_RETURN(const std::vector<int32_t> root_deferred,
                      sharding_core::RankZeroDeferred(mesh, device, assignments, sync));
  std::vector<std::vector<bool>> deferred(s.groups_.size());
  for (size_t i = 0; i < assignments.size(); ++i) {
    const Assignment& a = assignments[i];
    Param p;
    p.param = a.param;
    p.info.name = a.name;
    p.info.global_shape = a.param.sizes().vec();
    p.info.dtype = a.param.scalar_type();
    p.info.shard_rank = mesh.shard->rank();
    p.info.shard_size = mesh.shard->size();
    p.info.replicate_size = mesh.replicate ? mesh.replicate->size() : 1;
    p.numel = a.param.numel();
    p.row_numel = a.param.dim() == 0 || a.param.size(0) == 0 ? 1 : p.numel / a.param.size(0);
    s.groups_[a.group]->params.push_back(std::move(p));
    deferred[a.group].push_back(sync ? root_deferred[i] != 0 : IsDeferred(a.param));
  }
  for (size_t gi = 0; gi < s.groups_.size(); ++gi) {
    CT_RETURN_IF_ERROR(BuildGroup(model, mesh, resolved, deferred[gi], sync, *s.groups_[gi]));
  }
  CT_RETURN_IF_ERROR(CastBuffers(model, options.buffer_dtype));
  CT_RETURN_IF_ERROR(sharding_core::PlaceBuffers(model, mesh, device, options.sync_module_states));
  s.Install(model);
  int64_t padded = 0, used = 0;
  for (const auto& [u, p] : s.FlatSizes()) {
    used += u;
    padded += p;
  }
  CT_LOG_RANK0(INFO) << "FlatShard: " << s.groups_.size() << " flat parameters (" << units.size()
                     << " units + root) over " << mesh.shard->size() << " shard ranks"
                     << (mesh.replicate ? absl::StrCat(" x ", mesh.replicate->size(), " replicas")
                                        : std::string())
                     << ", " << used << " elements, " << padded << " padded";
  FlatShardedModel* raw = state.get();
  model.set_sharding(std::move(state));
  return raw;
}

}  // namespace cpptrain
