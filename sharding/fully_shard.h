// FullyShard: per-parameter dim-0 sharding of a model's units (PyTorch's FSDP2 `fully_shard`),
// built on the sharding core (sharding/sharding_core.h) with the per-parameter layout.
//
// Every parameter of a group (a unit chosen by the wrap policy, or the root for everything
// else; a tensor tied across two units goes to the root, gathered around every pass) is split along
// dim 0 into shard-group-size chunks of ceil(rows / size) rows (sharding/shard_rows.h); the last
// ranks' chunks are shorter (or empty) and padded to the common size for communication. At
// rest each rank's registered parameter IS its chunk ([local_rows, ...]): the optimizer, the
// clipping and the checkpointer see shards, and ShardInfo beside it gives the global shape.
//
// Around a unit's forward the unit's hook swaps every parameter's data (not the tensor: the
// parameter stays the same autograd leaf) to its full value:
//   copy-in   the group's chunks, cast to param_dtype, into this rank's slot of one buffer
//   gather    one all-gather in place
//   copy-out  one strided copy per parameter into the full parameters
// and back to the chunk after the forward (reshard_after_forward; the root keeps its full
// parameters until backward by default). The next group's gather is issued before this
// group's forward runs (prefetch in forward order; in backward, in reverse order). The unit's
// output carries an identity autograd node whose backward gathers again (pre-backward); its
// input carries one whose backward, once the unit's gradients are complete, reduce-scatters
// them in reduce_dtype (post-backward); FinishBackward handles groups no input gradient
// reached (the root) and waits for every reduction. Gradients are summed over ranks, like DDP:
// the Trainer normalizes the loss by the global target count.
//
// HSDP: with a replicate communicator, gradients are reduce-scattered over the shard group
// and then all-reduced over the replicate group.
//
//   CT_ASSIGN_OR_RETURN(FullyShardedModel* sharded,
//                       FullyShard(*model, ShardMesh{comm, nullptr}, options));
//   loss.backward();
//   CT_RETURN_IF_ERROR(sharded->FinishBackward());
//
// After FullyShard, do not call the model's to(): the shards are placed already. The model
// owns the sharding state (Unit::sharding()); FullyShardedOf(model) finds it again, so a
// model sharded at load time can be handed to any Trainer.
#ifndef CPPTRAIN_SHARDING_FULLY_SHARD_H_
#define CPPTRAIN_SHARDING_FULLY_SHARD_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "module/trainable_model.h"
#include "sharding/communicator.h"
#include "sharding/sharding_core.h"

namespace cpptrain {

struct FullyShardOptions {
  // Where the shards (and the gathered parameters) live; unset: the shard communicator's
  // device (NCCL: its GPU; Gloo: the CPU). Set, it must match the communicator's.
  std::optional<c10::Device> device;
  WrapPolicy wrap;
  // For wrapped units; unset: true. The root: `root_reshard_after_forward`, unset: false.
  std::optional<bool> reshard_after_forward;
  std::optional<bool> root_reshard_after_forward;
  // Gathered (compute) dtype; unset: each parameter's own dtype.
  std::optional<at::ScalarType> param_dtype;
  // Gradient reduction dtype; unset: param_dtype (or the parameter's dtype).
  std::optional<at::ScalarType> reduce_dtype;
  // The root's floating outputs are cast to it; unset: left as computed.
  std::optional<at::ScalarType> output_dtype;
  // Floating inputs of each unit are cast to param_dtype.
  bool cast_forward_inputs = true;
  // Shards, their gradients and so the optimizer state stay in CPU memory; gathers copy them
  // to `device` (CUDA only; on the CPU this changes nothing).
  bool offload_params = false;
  // Rank 0's parameters and buffers win, so ranks that built or loaded different values
  // agree: each rank receives only its chunk of each parameter (a scatter, one tensor at a
  // time) and the buffers are broadcast. Rank 0 alone needs real weights; the others may be
  // built deferred (models/row_init.h) and never hold a whole tensor. Where rank 0's parameter
  // is deferred too, every rank initializes its own rows instead.
  bool sync_module_states = true;
  // Gather the next group in backward while this one computes (BACKWARD_PRE).
  bool backward_prefetch = true;
};

// The FSDP2 sharding of a model: a ShardingCore whose groups use the per-parameter layout.
// Everything about driving it (forward, backward, prefetch, gathering) is ShardingCore's.
class FullyShardedModel : public ShardingCore {
 public:
  // The options FullyShard used, with `device` resolved.
  const FullyShardOptions& options() const { return options_; }

  // Metadata of a sharded parameter, by identity; null for tensors that are not.
  const ShardInfo* Find(const at::Tensor& param) const;

 private:
  friend absl::StatusOr<FullyShardedModel*> FullyShard(TrainableModel& model, ShardMesh mesh,
                                                       const FullyShardOptions& options);
  FullyShardedModel(ShardMesh mesh, FullyShardOptions options, CoreOptions core);

  FullyShardOptions options_;
};

// Shards `model` in place over `mesh` (every rank calls it with the same model structure;
// blocks for sync_module_states). The parameters are moved to the device one at a time,
// so the device never holds more than the shards plus one full tensor. Errors: the model is
// already sharded, a 0-d parameter, no shard communicator, options.device on another device
// than the communicators serve.
absl::StatusOr<FullyShardedModel*> FullyShard(TrainableModel& model, ShardMesh mesh,
                                              const FullyShardOptions& options);

// The sharding FullyShard attached to `model`, or null.
FullyShardedModel* FullyShardedOf(const TrainableModel& model);

}  // namespace cpptrain

#endif  // CPPTRAIN_SHARDING_FULLY_SHARD_H_
