// ShardingCore: what FSDP1 (flat parameters), FSDP2 (per-parameter dim-0 shards) and ZeRO-3
// share. A model's parameters are split into groups (a wrapped unit each, the root for the
// rest); each group is sharded along a mesh (ShardMesh), gathered into one full buffer around
// its unit's forward and backward, freed through its storage after, and its gradients are
// reduce-scattered after its backward (then all-reduced over replicas for HSDP). The core owns
// the groups' life cycle: the unit hooks, the autograd nodes of pre- and post-backward, the
// recorded forward order and prefetching, the state machine (sharded, gathering, unsharded),
// gradient accumulation without sync, and waiting for every collective.
//
// How a group's parameters map onto its per-rank segment is the group's Layout, chosen by the
// engine that builds it:
//   kPerParameter (FSDP2, sharding/fully_shard.h): each parameter's rows are split over the
//     shard ranks; a rank's segment is its chunks side by side, so a gather lands rank-major
//     and is copied out into the parameter-major full buffer.
//   kFlat (FSDP1, sharding/flat_shard.h): the parameters flattened and concatenated are one
//     flat parameter padded to a multiple of the shard size and split evenly; a gather lands
//     straight in the full buffer, and the parameters are views of it.
//
// Engines do not build a ShardingCore themselves: FullyShard and FlatShard do, and return
// their subclass. Both are driven the same way:
//   CT_RETURN_IF_ERROR(core->BeginForward());   loss = ...; CT_RETURN_IF_ERROR(core->EndForward());
//   CT_RETURN_IF_ERROR(core->BeginBackward());  loss.backward();
//   CT_RETURN_IF_ERROR(core->FinishBackward());
//
// Streams: collectives are issued on the communicator's stream; Work::Wait makes the current
// stream wait for them (Unshard issues, WaitUnshard waits; post-backward issues the
// reduce-scatter, the next group's post-backward and FinishBackward wait).
//
// One shard rank: a gather or reduce-scatter over one rank would only copy, so none is issued.
// Unshard copies (and casts) the shards straight into the full buffer, with no gather buffer.
// Without replicas, with the local parts on the device, a synchronized post-backward with
// nothing accumulated hands each full gradient to its local part as autograd made it: in the
// local part's dtype, or bf16 with HoldBf16Gradients (an optimizer that reads bf16 gradients
// of fp32 parameters), else cast to it; nothing is packed, so under bf16 that costs no pass
// and 2 bytes a parameter. Otherwise post-backward's packed gradients are the reduced segment.
#ifndef CPPTRAIN_SHARDING_SHARDING_CORE_H_
#define CPPTRAIN_SHARDING_SHARDING_CORE_H_

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
  // kTransformer: unit classes to wrap, or Hugging Face's names for them (ResolveWrapClasses);
  // empty: the model's LayerUnitClasses().
  std::vector<std::string> classes;
  // kSize: a unit is wrapped when it holds at least this many parameters.
  int64_t min_num_params = 0;
};

// Where a sharded parameter sits in the full tensor.
struct ShardInfo {
  std::string name;                   // the model's parameter name
  std::vector<int64_t> global_shape;  // the full tensor's shape
  // Per-parameter layout: rows of dim 0 (FSDP2). Zero in the flat layout.
  int64_t chunk_rows = 0;  // rows per rank, padded: ceil(rows / shard size)
  int64_t row_begin = 0;   // this rank's first row of dim 0
  int64_t local_rows = 0;  // rows this rank holds (0 <= local_rows <= chunk_rows)
  // Flat layout (FSDP1): this rank holds elements [element_begin, element_begin +
  // local_numel) of the flattened parameter, as a 1-d tensor.
  int64_t element_begin = 0;
  int64_t local_numel = 0;
  int shard_rank = 0;
  int shard_size = 1;
  int replicate_size = 1;
  at::ScalarType dtype = at::kFloat;  // the sharded (optimizer) dtype
};

// The settings the core's hooks follow, resolved by the engine's builder.
struct CoreOptions {
  c10::Device device = c10::Device(c10::kCPU);
  // Floating inputs of each unit are cast to it when cast_forward_inputs; unset: left alone.
  std::optional<at::ScalarType> param_dtype;
  bool cast_forward_inputs = true;
  // The root's floating outputs are cast to it; unset: left as computed.
  std::optional<at::ScalarType> output_dtype;
  // Gather the next group in forward order when a group's forward starts.
  bool forward_prefetch = true;
  // In backward, gather the next group before this one computes (kPre) or once this one's
  // gradients are complete (kPost, before its reduce-scatter), or not ahead at all (kNone).
  enum class BackwardPrefetch { kPre, kPost, kNone };
  BackwardPrefetch backward_prefetch = BackwardPrefetch::kPre;
};

struct ShardGroup;

class ShardingCore : public ShardingAttachment {
 public:
  ~ShardingCore() override;

  const ShardMesh& mesh() const { return mesh_; }
  c10::Device device() const { return core_options_.device; }
  int num_groups() const;
  // The unit class of each group, root last.
  std::vector<std::string> GroupUnitClasses() const;

  // Every sharded parameter (registered tensor) with its metadata, in model order.
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
  // synchronized backward adds them in before reducing. On: each group's reduced segment is
  // added into its parameters' .grad as soon as its reduce-scatter completes (after the next
  // group's backward), when the local parts live on the compute device and there are no
  // replicas; otherwise (offload, HSDP) at FinishBackward.
  void SetGradientSync(bool enabled) { sync_ = enabled; }
  // One shard rank: whether a bf16 full gradient reaches an fp32 local part's .grad as it is
  // (see the top). The engine sets it once its optimizer is built.
  void HoldBf16Gradients(bool on) { hold_bf16_ = on; }

  // After backward: post-backward for groups no hook reached, then waits for every reduction
  // and leaves each parameter's .grad as its local part's gradient (added to what was there).
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
  // for the same parameters in the same order), on the CPU. For tests and tools: it allocates
  // its device buffer on each call, so one rank out of memory leaves the others in the gather.
  absl::StatusOr<at::Tensor> GatherFull(const at::Tensor& param);
  // The same through `staging`, a uint8 buffer on device() of GatherFullBytes() or more
  // (AllocateOnEveryRank, sharding/agreed_buffer.h), reused for every parameter: it allocates
  // nothing on the device. A failure of this rank's own copies does not skip the all-gather:
  // it goes into `*first_failure` unless one is there already, and while one is there the
  // result is undefined. An error returned is the collective's. For state dicts.
  absl::StatusOr<at::Tensor> GatherFull(const at::Tensor& param, const at::Tensor& staging,
                                        absl::Status* first_failure);
  // The most bytes GatherFull(param, staging, first_failure) uses for any parameter.
  int64_t GatherFullBytes() const;

  // Largest number of groups unsharded at once since the last ResetPeakUnsharded, and the
  // largest parameter storage this rank held at once: its shards, the gathered full groups
  // and gather buffers in flight (for tests and memory reports).
  int peak_unsharded() const { return peak_unsharded_; }
  int64_t peak_parameter_bytes() const { return peak_parameter_bytes_; }
  // The largest gradient storage this rank held at once during backward: the local parts'
  // gradients (.grad, or set aside while a group is gathered), the full gradients autograd
  // left on a group's parameters, unsynced accumulations, and reduce-scatter inputs and
  // outputs in flight. Counted where it can peak: as each group's post-backward starts and
  // once its reduce-scatter is issued.
  int64_t peak_gradient_bytes() const { return peak_gradient_bytes_; }
  // Resets the three peaks above.
  void ResetPeakUnsharded() {
    peak_unsharded_ = 0;
    peak_parameter_bytes_ = 0;
    peak_gradient_bytes_ = 0;
  }
  // Bytes of this rank's padded shards, and of each group's full parameters (root last).
  int64_t shard_bytes() const { return shard_bytes_; }
  std::vector<int64_t> GroupFullBytes() const;

  class Hook;
  struct Internals;  // entry points of the autograd nodes (sharding_core.cc)

 protected:
  ShardingCore(ShardMesh mesh, CoreOptions options);

  // For the builders, once every group holds its parameters: installs one hook per group on
  // its unit (the root's on `model`) and indexes the parameters. `groups_` is root last.
  void Install(TrainableModel& model);
  // The group and index of a sharded parameter, by identity; null when it is not one.
  const std::pair<ShardGroup*, size_t>* Locate(const at::Tensor& param) const;

  std::vector<std::unique_ptr<ShardGroup>> groups_;  // root last

 private:
  absl::Status Unshard(ShardGroup& group);      // issues the gather
  absl::Status WaitUnshard(ShardGroup& group);  // completes it; parameters become full
  void Reshard(ShardGroup& group);              // parameters become their local parts again
  absl::Status PostBackward(ShardGroup& group);
  // One shard rank, no replicas, local parts on the device (see the top).
  bool HoldsFullGradients(const ShardGroup& group) const;
  void HoldFullGradients(ShardGroup& group);
  void Prefetch(const ShardGroup& group, int direction);
  torch::Tensor PreForward(ShardGroup& group, torch::Tensor input);
  torch::Tensor PostForward(ShardGroup& group, torch::Tensor output);
  void PreBackward(ShardGroup& group);
  void OnPostBackward(ShardGroup& group);
  void CountUnsharded();
  void CountGradients();
  absl::Status CompleteReduceScatter(ShardGroup& group);
  absl::Status AssignReducedGradients(ShardGroup& group);
  absl::Status SetPrefetch(const Unit& unit, const std::vector<const Unit*>& targets, bool forward);

  ShardMesh mesh_;
  CoreOptions core_options_;
  std::vector<std::unique_ptr<Hook>> hooks_;
  std::vector<ShardGroup*> forward_order_;  // recorded on the first forward
  bool order_recorded_ = false;
  bool sync_ = true;
  bool hold_bf16_ = false;
  absl::Status hook_error_;  // a failure inside an autograd node, reported by FinishBackward
  int peak_unsharded_ = 0;
  int64_t peak_parameter_bytes_ = 0;
  int64_t peak_gradient_bytes_ = 0;
  int64_t shard_bytes_ = 0;
  ShardGroup* last_reduced_ = nullptr;  // the newest reduce-scatter, completed before the next
  // Every sharded parameter's group and index in it, by the parameter's TensorImpl.
  std::unordered_map<const c10::TensorImpl*, std::pair<ShardGroup*, size_t>> by_param_;
};

// One group of parameters sharded together (sharding_core.h's builders fill it in).
struct ShardGroup {
  enum class Layout { kPerParameter, kFlat };
  struct Param {
    at::Tensor param;  // the registered parameter (its TensorImpl never changes)
    ShardInfo info;
    int64_t numel = 0;
    int64_t row_numel = 1;
    // kPerParameter: this parameter's padded chunk per rank, and where it starts in a rank's
    // segment. kFlat: chunk_numel is unused and `offset` is its start in the flat parameter.
    int64_t chunk_numel = 0;
    int64_t offset = 0;
    int64_t local_offset = 0;  // where this rank's elements of it start in its segment
    at::Tensor shard;          // kPerParameter: [chunk_numel], padded with zeros
    at::Tensor local;          // this rank's part, the data at rest (a view of the segment)
    at::Tensor full_view;      // the full parameter, a view of ShardGroup::full
    at::Tensor stashed_grad;   // the local part's gradient, set aside while the full data is out
  };

  enum class State { kSharded, kGathering, kUnsharded };

  Layout layout = Layout::kPerParameter;
  const Unit* unit = nullptr;
  std::string unit_class;
  bool is_root = false;
  bool reshard_after_forward = true;
  std::vector<Param> params;
  int64_t segment_numel = 0;  // S: one rank's part of the group
  at::ScalarType param_dtype = at::kFloat;
  at::ScalarType reduce_dtype = at::kFloat;
  at::Tensor flat_shard;  // kFlat: this rank's [S] of the flat parameter, sharded dtype
  int order_index = -1;   // position in the recorded forward order
  // Explicit prefetch targets (SetForwardPrefetch/SetBackwardPrefetch); empty: the next group.
  std::vector<ShardGroup*> forward_prefetch;
  std::vector<ShardGroup*> backward_prefetch;

  State state = State::kSharded;
  // kPerParameter over several ranks: [W * S], rank-major, while the gather is in flight (one
  // rank copies into `full` and issues no gather: both stay unset).
  at::Tensor gather_out;
  std::unique_ptr<Work> gather_work;
  // [W * S]; kPerParameter: parameter-major, kFlat: the flat parameter. Its storage is freed
  // at reshard and allocated again at the next gather, so tensors autograd saved from the
  // full parameters (views such as W.t()) release the memory too and see the new values.
  at::Tensor full;
  at::Tensor accumulated;  // [W * S] as reduced, reduce_dtype: gradients of unsynced passes
  at::Tensor reduce_in;    // [W * S]: the reduce-scatter's input, kept until it completes
  at::Tensor reduce_out;   // [S]: this rank's reduced gradients, once `reduced`
  // The reduce-scatter in flight; one rank issues none (reduce_out is then reduce_in itself).
  std::unique_ptr<Work> reduce_work;
  std::unique_ptr<Work> replicate_work;  // HSDP: the all-reduce over replicas in flight
  bool reduced = false;                  // reduce_out holds gradients still to hand out
  bool pre_backward_done = false;
  bool post_backward_done = false;
};

// Building blocks FullyShard and FlatShard share.
namespace sharding_core {

// A parameter and the group (index into the units, or the root's) it belongs to.
struct Assignment {
  std::string name;
  at::Tensor param;
  int group = 0;
};

// The units `policy` wraps, in pre-order, and every parameter's group: the innermost wrapped
// unit above it, the root (index units.size()) otherwise. A tensor registered in two groups
// (weights tied across units) goes to the root, which is gathered around the whole forward
// and backward (FSDP1's rule: a shared parameter belongs to the lowest common ancestor).
// Each tensor appears once. Errors: a unit that already has a hook; a class name that is no
// unit class of the model (ResolveWrapClasses).
absl::Status AssignGroups(TrainableModel& model, const WrapPolicy& policy,
                          std::vector<Unit*>* units, std::vector<Assignment>* assignments);

// One empty group per unit and the root last, with the unit's class and reshard setting.
std::vector<std::unique_ptr<ShardGroup>> MakeGroups(TrainableModel& model,
                                                    const std::vector<Unit*>& units,
                                                    ShardGroup::Layout layout, bool units_reshard,
                                                    bool root_reshard);

// The group's gather dtype: `param_dtype`, else its parameters' common dtype. Errors: mixed
// dtypes without param_dtype.
absl::StatusOr<at::ScalarType> GroupDtype(const ShardGroup& group,
                                          std::optional<at::ScalarType> param_dtype);

// Rank 0's flags of which parameters are deferred (models' row_init), broadcast, one per
// assignment. All zeros without sync.
absl::StatusOr<std::vector<int32_t>> RankZeroDeferred(const ShardMesh& mesh, c10::Device device,
                                                      const std::vector<Assignment>& assignments,
                                                      bool sync);

// Rank 0's tensor on every rank of the mesh (shard group, then replicas), in place.
absl::Status BroadcastFromRankZero(const ShardMesh& mesh, at::Tensor& t);

// Buffers are replicated: moved to `device` and, with `sync`, made rank 0's.
absl::Status PlaceBuffers(TrainableModel& model, const ShardMesh& mesh, c10::Device device,
                          bool sync);

// A tensor whose storage is released (and allocated again by AllocateStorage), keeping its
// shape, so views of it stay valid while holding no memory.
void FreeStorage(const at::Tensor& t);
void AllocateStorage(const at::Tensor& t);

// Errors: options.device on another device than the mesh's communicators serve.
absl::StatusOr<c10::Device> ResolveDevice(const ShardMesh& mesh, std::optional<c10::Device> asked,
                                          const char* who);

}  // namespace sharding_core

}  // namespace cpptrain

#endif  // CPPTRAIN_SHARDING_SHARDING_CORE_H_
