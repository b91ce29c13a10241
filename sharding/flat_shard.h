// FlatShard: FSDP1's flat parameters (PyTorch's FullyShardedDataParallel with
// use_orig_params=True), built on the sharding core (sharding/sharding_core.h) with the flat
// layout.
//
// Each group's parameters (a unit chosen by the wrap policy, or the root for the rest; a
// tensor tied across two units goes to the root) are flattened and concatenated in model
// order, each starting at a multiple of `alignment_bytes`, into one flat parameter padded to
// a multiple of the shard group's size and split evenly: rank r holds elements
// [r * S, (r + 1) * S). At rest every original parameter is a 1-d view of its intersection
// with this rank's S elements (possibly empty), so the optimizer, weight-decay groups by
// name, frozen parameters and clipping see the original parameters; ShardInfo's
// element_begin / local_numel say which elements of the flattened tensor a rank holds.
//
// Unshard is one all-gather of the flat shard straight into the group's padded full buffer,
// of which the parameters are views (no copy-in, no copy-out); reshard frees that buffer's
// storage; the gradients are one reduce-scatter of the flat gradient (then an all-reduce over
// replicas for HYBRID_SHARD / NO_SHARD). Gradients are summed over ranks, like DDP.
//
//   FlatShardOptions options;                      // FULL_SHARD over `comm`
//   CT_ASSIGN_OR_RETURN(FlatShardedModel* flat, FlatShard(*model, ShardMesh{comm, nullptr},
//                                                         options));
//   loss.backward();
//   CT_RETURN_IF_ERROR(flat->FinishBackward());
#ifndef CPPTRAIN_SHARDING_FLAT_SHARD_H_
#define CPPTRAIN_SHARDING_FLAT_SHARD_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <optional>

#include "absl/status/statusor.h"
#include "module/trainable_model.h"
#include "sharding/shard_rows.h"
#include "sharding/sharding_core.h"

namespace cpptrain {

struct FlatShardOptions {
  // Unset: the shard communicator's device (NCCL: its GPU; Gloo: the CPU).
  std::optional<c10::Device> device;
  WrapPolicy wrap;
  // FULL_SHARD and HYBRID_SHARD: true; SHARD_GRAD_OP, _HYBRID_SHARD_ZERO2 and NO_SHARD:
  // false. The root always keeps its parameters until backward (FSDP1's rule).
  bool reshard_after_forward = true;
  // MixedPrecision: gather (compute) dtype, gradient reduction dtype, buffer dtype; unset:
  // the parameters' (buffers') own dtype, and reduce_dtype follows param_dtype.
  std::optional<at::ScalarType> param_dtype;
  std::optional<at::ScalarType> reduce_dtype;
  std::optional<at::ScalarType> buffer_dtype;
  bool cast_forward_inputs = true;
  // CPUOffload(offload_params=True): flat shards, their gradients and the optimizer state
  // stay in CPU memory (CUDA only; on the CPU this changes nothing).
  bool offload_params = false;
  // Rank 0's parameters and buffers win (its flat parameter is scattered).
  bool sync_module_states = true;
  bool forward_prefetch = false;
  CoreOptions::BackwardPrefetch backward_prefetch = CoreOptions::BackwardPrefetch::kPre;
  // Where each parameter may start in the flat parameter (PyTorch: 16 bytes).
  int alignment_bytes = 16;
};

// The FSDP1 sharding of a model. Everything about driving it is ShardingCore's.
class FlatShardedModel : public ShardingCore {
 public:
  const FlatShardOptions& options() const { return options_; }
  // Which elements of a parameter this rank holds, by identity; null for other tensors.
  const ShardInfo* FindPiece(const at::Tensor& param) const;
  // Each group's flat parameter: unpadded and padded element counts (root last).
  std::vector<std::pair<int64_t, int64_t>> FlatSizes() const;

 private:
  friend absl::StatusOr<FlatShardedModel*> FlatShard(TrainableModel& model, ShardMesh mesh,
                                                     const FlatShardOptions& options);
  FlatShardedModel(ShardMesh mesh, FlatShardOptions options, CoreOptions core);

  FlatShardOptions options_;
};

// Flattens and shards `model` in place over `mesh` (every rank calls it with the same model
// structure; blocks for sync_module_states). Errors: the model is already sharded, a group
// mixing parameter dtypes, no shard communicator, options.device on another device than the
// communicators serve.
absl::StatusOr<FlatShardedModel*> FlatShard(TrainableModel& model, ShardMesh mesh,
                                            const FlatShardOptions& options);

// The flat sharding FlatShard attached to `model`, or null.
FlatShardedModel* FlatShardedOf(const TrainableModel& model);

// The rows of dim 0 that hold a flat piece (`piece.element_begin`, `piece.local_numel`: elements
// of the flattened tensor of shape `piece.global_shape`), and where the piece starts in them:
// read rows [rows.begin, rows.end), flatten, take [skip, skip + local_numel). Empty for an
// empty piece. A 0-d tensor counts as one row.
struct FlatPieceRows {
  RowRange rows;
  int64_t skip = 0;
};
FlatPieceRows RowsCoveringPiece(const ShardInfo& piece);

}  // namespace cpptrain

#endif  // CPPTRAIN_SHARDING_FLAT_SHARD_H_
