// FullyShard: per-parameter dim-0 sharding of a model's units (PyTorch's FSDP2 `fully_shard`).
//
// Every parameter of a group (a unit chosen by the wrap policy, or the root for everything
// else; a tensor tied across two units goes to the root, gathered around every pass) is split along dim 0 into shard-group-size chunks of ceil(rows / size) rows
// (sharding/shard_rows.h); the last
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

namespace cpptrain {

// The communicators parameters are sharded and replicated over. `replicate` is null for plain
// FSDP; set, the world is replicate.size() x shard.size() (HSDP).
struct ShardMesh {
  std::shared_ptr<Communicator> shard;
  std::shared_ptr<Communicator> replicate;

  int world_size() const { return shard->size() * (replicate ? replicate->size() : 1); }
};

// Which units get their own shard group; the root gets the rest.
struct WrapPolicy {
  enum class Kind { kTransformer, kSize, kNone };
  Kind kind = Kind::kTransformer;
  // kTransformer: unit classes to wrap; empty: the model's LayerUnitClasses().
  std::vector<std::string> classes;
  // kSize: a unit is wrapped when it holds at least this many parameters.
  int64_t min_num_params = 0;
};

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

// Where a sharded parameter's chunk sits in the full tensor.
struct ShardInfo {
  std::string name;                   // the model's parameter name
  std::vector<int64_t> global_shape;  // the full tensor's shape
  int64_t chunk_rows = 0;             // rows per rank, padded: ceil(rows / shard size)
  int64_t row_begin = 0;              // this rank's first row of dim 0
  int64_t local_rows = 0;             // rows this rank holds (0 <= local_rows <= chunk_rows)
  int shard_rank = 0;
  int shard_size = 1;
  int replicate_size = 1;
  at::ScalarType dtype = at::kFloat;  // the sharded (optimizer) dtype
};

class FullyShardedModel : public ShardingAttachment {
 public:
  ~FullyShardedModel() override;

  const ShardMesh& mesh() const { return mesh_; }
  // The options FullyShard used, with `device` resolved.
  const FullyShardOptions& options() const { return options_; }
  c10::Device device() const { return *options_.device; }
  int num_groups() const;
  // The unit class of each group, root last.
  std::vector<std::string> GroupUnitClasses() const;

  // Metadata of a sharded parameter, by identity; null for tensors that are not.
  const ShardInfo* Find(const at::Tensor& param) const;
  // Every sharded parameter (name and registered tensor) with its metadata, in model order.
  std::vector<std::pair<at::Tensor, const ShardInfo*>> Shards() const;

  // Explicit prefetching (FSDP2's set_modules_to_forward_prefetch / _backward_prefetch): when
  // `unit`'s forward (backward) starts, the groups of `targets` are gathered too, in that
  // order, instead of the next group in the recorded order. Every rank must set the same
  // lists. Errors: a unit (or target) that is not the root or a wrapped unit.
  absl::Status SetForwardPrefetch(const Unit& unit, const std::vector<const Unit*>& targets) {
    return SetPrefetch(unit, targets, /*forward=*/true);
  }
  absl::Status SetBackwardPrefetch(const Unit& unit, const std::vector<const Unit*>& targets) {
    return SetPrefetch(unit, targets, /*forward=*/false);
  }

  // Off: backward keeps full gradients (in reduce_dtype) and communicates nothing; the next
  // synchronized backward adds them in before reducing.
  void SetGradientSync(bool enabled) { sync_ = enabled; }

  // After backward: post-backward for groups no hook reached, then waits for every reduction
  // and leaves each parameter's .grad as its chunk's gradient (added to what was there).
  absl::Status FinishBackward();

  // Forgets every gradient not yet handed to .grad: what unsynced passes accumulated and
  // reductions of a backward that did not finish (waits for those first). Engines call it
  // when gradients are zeroed, so nothing from an earlier step reaches a later one.
  void DiscardGradients();

  // Returns every group to its shards (waits for gathers in flight). Idempotent.
  absl::Status ReshardAll();

  // For callers whose model's Forward does not pass through the root's hook, and for
  // engines: gathers the root group (and prefetches the first unit) before a forward...
  absl::Status BeginForward();
  // ...and after it, reshards the root unless a backward follows (grad mode on and the root
  // keeps its parameters after forward).
  absl::Status EndForward();
  // Before loss.backward(): gathers the root again when it was resharded after forward.
  absl::Status BeginBackward();

  // The full value of a sharded parameter, gathered from every shard (all ranks must call it
  // for the same parameters in the same order), on the CPU. For state dicts and tests.
  absl::StatusOr<at::Tensor> GatherFull(const at::Tensor& param);

  // Largest number of groups unsharded at once since the last ResetPeakUnsharded, and the
  // largest parameter storage this rank held at once: its chunks, the gathered full groups
  // and gather buffers in flight (for tests and memory reports).
  int peak_unsharded() const { return peak_unsharded_; }
  int64_t peak_parameter_bytes() const { return peak_parameter_bytes_; }
  void ResetPeakUnsharded() {
    peak_unsharded_ = 0;
    peak_parameter_bytes_ = 0;
  }
  // Bytes of this rank's padded chunks, and of each group's full parameters (root last).
  int64_t shard_bytes() const;
  std::vector<int64_t> GroupFullBytes() const;

  struct Group;
  class Hook;
  struct Internals;  // entry points of the autograd nodes (fully_shard.cc)

 private:
  friend absl::StatusOr<FullyShardedModel*> FullyShard(TrainableModel& model, ShardMesh mesh,
                                                       const FullyShardOptions& options);
  FullyShardedModel(ShardMesh mesh, FullyShardOptions options);

  absl::Status Unshard(Group& group);      // issues the gather
  absl::Status WaitUnshard(Group& group);  // completes it; parameters become full
  void Reshard(Group& group);              // parameters become chunks again
  absl::Status PostBackward(Group& group);
  void PackFullGradients(Group& group, const at::Tensor& by_rank, bool add);
  void Prefetch(const Group& group, int direction);
  torch::Tensor PreForward(Group& group, torch::Tensor input);
  torch::Tensor PostForward(Group& group, torch::Tensor output);
  void PreBackward(Group& group);
  void OnPostBackward(Group& group);
  void CountUnsharded();
  absl::Status CompleteReduceScatter(Group& group);
  absl::Status SetPrefetch(const Unit& unit, const std::vector<const Unit*>& targets, bool forward);

  ShardMesh mesh_;
  FullyShardOptions options_;
  std::vector<std::unique_ptr<Group>> groups_;  // root last
  std::vector<std::unique_ptr<Hook>> hooks_;
  std::vector<Group*> forward_order_;  // recorded on the first forward
  bool order_recorded_ = false;
  bool sync_ = true;
  absl::Status hook_error_;  // a failure inside an autograd node, reported by FinishBackward
  int peak_unsharded_ = 0;
  int64_t peak_parameter_bytes_ = 0;
  int64_t shard_bytes_ = 0;
  Group* last_reduced_ = nullptr;  // the newest reduce-scatter, completed before the next one
  // Every sharded parameter's group and index in it, by the parameter's TensorImpl.
  std::unordered_map<const c10::TensorImpl*, std::pair<Group*, size_t>> by_param_;
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
