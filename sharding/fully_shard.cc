#include "sharding/fully_shard.h"

#include <ATen/ATen.h>
#include <torch/utils.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "module/deferred.h"
#include "sharding/shard_rows.h"

namespace cpptrain {
namespace {

using sharding_core::Assignment;
using Param = ShardGroup::Param;

CoreOptions CoreOptionsOf(const FullyShardOptions& options) {
  CoreOptions core;
  core.device = *options.device;
  core.param_dtype = options.param_dtype;
  core.cast_forward_inputs = options.cast_forward_inputs;
  core.output_dtype = options.output_dtype;
  core.forward_prefetch = true;
  core.backward_prefetch = options.backward_prefetch ? CoreOptions::BackwardPrefetch::kPre
                                                     : CoreOptions::BackwardPrefetch::kNone;
  return core;
}

// This rank's padded chunk of `a`, into p.shard: rank 0's values scattered (sync and rank 0
// holds them), the rank's own rows initialized (deferred), or copied from the parameter.
absl::Status FillChunk(TrainableModel& model, const ShardMesh& mesh, const Assignment& a,
                       bool from_rank_zero, c10::Device device, Param& p) {
  const int world = mesh.shard->size();
  const int rank = mesh.shard->rank();
  std::vector<int64_t> local_shape = p.info.global_shape;
  local_shape[0] = p.info.local_rows;
  const int64_t local_numel = p.info.local_rows * p.row_numel;
  const at::TensorOptions on_device = at::TensorOptions().dtype(p.info.dtype).device(device);
  if (from_rank_zero) {
    // Shard rank 0 sends each rank its padded chunk; with HSDP the replicas then take
    // replica 0's (the other replicas' scatters carry whatever their rank 0 holds).
    at::Tensor chunk = at::empty({p.chunk_numel}, on_device);
    at::Tensor parts;
    if (rank == 0) {
      parts = at::zeros({world * p.chunk_numel}, on_device);
      if (!IsDeferred(a.param)) {
        parts.narrow(0, 0, a.param.numel()).copy_(a.param.detach().reshape({-1}));
      }
    }
    CT_ASSIGN_OR_RETURN(std::unique_ptr<Work> scattered, mesh.shard->Scatter(parts, chunk, 0));
    CT_RETURN_IF_ERROR(scattered->Synchronize());
    if (mesh.replicate != nullptr) {
      CT_ASSIGN_OR_RETURN(std::unique_ptr<Work> work, mesh.replicate->Broadcast(chunk, 0));
      CT_RETURN_IF_ERROR(work->Synchronize());
    }
    p.shard.copy_(chunk);
  } else if (IsDeferred(a.param)) {
    // Never allocated whole: this rank fills its own rows (the same on every replica).
    at::Tensor rows = at::zeros({local_numel}, at::TensorOptions().dtype(p.info.dtype));
    CT_RETURN_IF_ERROR(model.InitializeRows(a.name, p.info.row_begin, rows.view(local_shape)));
    p.shard.narrow(0, 0, local_numel).copy_(rows);
  } else {
    // This rank's own rows, copied from wherever the parameter is.
    p.shard.narrow(0, 0, local_numel)
        .copy_(
            a.param.detach().reshape({-1}).narrow(0, p.info.row_begin * p.row_numel, local_numel));
  }
  return absl::OkStatus();
}

// The parameter's metadata and place in its group's segment (chunks side by side).
Param MakeParam(const Assignment& a, const ShardMesh& mesh, ShardGroup& group) {
  const int world = mesh.shard->size();
  Param p;
  p.param = a.param;
  p.info.name = a.name;
  p.info.global_shape = a.param.sizes().vec();
  p.info.dtype = a.param.scalar_type();
  p.info.shard_rank = mesh.shard->rank();
  p.info.shard_size = world;
  p.info.replicate_size = mesh.replicate ? mesh.replicate->size() : 1;
  p.numel = a.param.numel();
  const int64_t rows = p.info.global_shape[0];
  p.row_numel = rows == 0 ? 0 : p.numel / rows;
  const RowRange mine = ShardRowRange(rows, world, p.info.shard_rank);
  p.info.chunk_rows = ShardChunkRows(rows, world);
  p.info.row_begin = mine.begin;
  p.info.local_rows = mine.rows();
  p.info.element_begin = mine.begin * p.row_numel;
  p.info.local_numel = mine.rows() * p.row_numel;
  p.chunk_numel = p.info.chunk_rows * p.row_numel;
  p.offset = group.segment_numel;
  p.local_offset = p.offset;
  group.segment_numel += p.chunk_numel;
  return p;
}

}  // namespace

FullyShardedModel::FullyShardedModel(ShardMesh mesh, FullyShardOptions options, CoreOptions core)
    : ShardingCore(std::move(mesh), std::move(core)), options_(std::move(options)) {}

const ShardInfo* FullyShardedModel::Find(const at::Tensor& param) const {
  const std::pair<ShardGroup*, size_t>* where = Locate(param);
  return where == nullptr ? nullptr : &where->first->params[where->second].info;
}

FullyShardedModel* FullyShardedOf(const TrainableModel& model) {
  return dynamic_cast<FullyShardedModel*>(model.sharding());
}

absl::StatusOr<FullyShardedModel*> FullyShard(TrainableModel& model, ShardMesh mesh,
                                              const FullyShardOptions& options) {
  if (model.sharding() != nullptr) {
    return absl::FailedPreconditionError(
        "FullyShard: the model is already sharded; hand it to the Trainer as it is");
  }
  CT_ASSIGN_OR_RETURN(const c10::Device device,
                      sharding_core::ResolveDevice(mesh, options.device, "FullyShard"));
  if (options.offload_params && !device.is_cuda()) {
    LOG(WARNING) << "FSDP offload_params on " << device.str()
                 << ": parameters already live in CPU memory, nothing to offload";
  }
  std::vector<Unit*> units;
  std::vector<Assignment> assignments;
  CT_RETURN_IF_ERROR(sharding_core::AssignGroups(model, options.wrap, &units, &assignments));
  for (const Assignment& a : assignments) {
    if (a.param.dim() == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("FullyShard: parameter ", a.name,
                       " is 0-dimensional and cannot be split along dim "
                       "0: give it shape [1]"));
    }
  }
  FullyShardOptions resolved = options;
  resolved.device = device;
  auto state = std::shared_ptr<FullyShardedModel>(
      new FullyShardedModel(mesh, resolved, CoreOptionsOf(resolved)));
  FullyShardedModel& s = *state;
  s.groups_ = sharding_core::MakeGroups(model, units, ShardGroup::Layout::kPerParameter,
                                        options.reshard_after_forward.value_or(true),
                                        options.root_reshard_after_forward.value_or(false));
  const int world = mesh.shard->size();
  const c10::Device shard_device = options.offload_params ? c10::Device(c10::kCPU) : device;
  torch::NoGradGuard no_grad;
  // With sync_module_states, rank 0's values win: each rank receives only its chunk of them
  // (a scatter), except where rank 0's parameter is deferred too; then every rank initializes
  // its own rows, which agree by construction.
  const bool sync = options.sync_module_states && mesh.world_size() > 1;
  CT_ASSIGN_OR_RETURN(const std::vector<int32_t> root_deferred,
                      sharding_core::RankZeroDeferred(mesh, device, assignments, sync));
  for (size_t index = 0; index < assignments.size(); ++index) {
    const Assignment& a = assignments[index];
    ShardGroup& group = *s.groups_[a.group];
    Param p = MakeParam(a, mesh, group);
    CT_RETURN_IF_ERROR(CatchTorch([&]() -> absl::Status {
      p.shard =
          at::zeros({p.chunk_numel}, at::TensorOptions().dtype(p.info.dtype).device(shard_device));
      CT_RETURN_IF_ERROR(FillChunk(model, mesh, a, sync && root_deferred[index] == 0, device, p));
      if (options.offload_params && device.is_cuda()) p.shard = p.shard.pin_memory();
      std::vector<int64_t> local_shape = p.info.global_shape;
      local_shape[0] = p.info.local_rows;
      p.local = p.shard.narrow(0, 0, p.info.local_numel).view(local_shape);
      p.param.set_data(p.local);
      return absl::OkStatus();
    }));
    group.params.push_back(std::move(p));
  }
  for (auto& group : s.groups_) {
    CT_ASSIGN_OR_RETURN(group->param_dtype, sharding_core::GroupDtype(*group, options.param_dtype));
    group->reduce_dtype = options.reduce_dtype.value_or(group->param_dtype);
    CT_RETURN_IF_ERROR(CatchTorch([&] {
      group->full = at::empty({world * group->segment_numel},
                              at::TensorOptions().dtype(group->param_dtype).device(device));
      for (auto& p : group->params) {
        p.full_view = group->full.narrow(0, world * p.offset, p.numel).view(p.info.global_shape);
      }
      sharding_core::FreeStorage(group->full);
    }));
  }
  CT_RETURN_IF_ERROR(sharding_core::PlaceBuffers(model, mesh, device, options.sync_module_states));
  s.Install(model);
  int64_t total = 0;
  for (const auto& g : s.groups_) total += g->segment_numel * world;
  CT_LOG_RANK0(INFO) << "FullyShard: " << s.groups_.size() << " groups (" << units.size()
                     << " units + root) over " << world << " shard ranks"
                     << (mesh.replicate ? absl::StrCat(" x ", mesh.replicate->size(), " replicas")
                                        : std::string())
                     << ", " << total << " elements padded";
  FullyShardedModel* raw = state.get();
  model.set_sharding(std::move(state));
  return raw;
}

}  // namespace cpptrain
