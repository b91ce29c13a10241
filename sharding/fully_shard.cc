#include "sharding/fully_shard.h"

#include <c10/core/DeviceGuard.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/torch.h>

#include <algorithm>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/logging.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "module/deferred.h"
#include "sharding/shard_rows.h"

namespace cpptrain {

struct FullyShardedModel::Group {
  struct Param {
    at::Tensor param;  // the registered parameter (its TensorImpl never changes)
    ShardInfo info;
    int64_t row_numel = 1;
    int64_t chunk_numel = 0;  // chunk_rows * row_numel
    int64_t offset = 0;       // of this parameter's chunk in a rank's segment, in elements
    at::Tensor shard;         // [chunk_numel], padded with zeros, sharded dtype
    at::Tensor local;         // the unpadded chunk as the parameter's shape: the data at rest
    at::Tensor full_view;     // the full parameter, a view of Group::full
    at::Tensor stashed_grad;  // the chunk's gradient, set aside while the full data is out
  };

  enum class State { kSharded, kGathering, kUnsharded };

  const Unit* unit = nullptr;
  std::string unit_class;
  bool is_root = false;
  bool reshard_after_forward = true;
  std::vector<Param> params;
  int64_t segment_numel = 0;  // S: one rank's chunks of every parameter
  at::ScalarType param_dtype = at::kFloat;
  at::ScalarType reduce_dtype = at::kFloat;
  int order_index = -1;  // position in the recorded forward order
  // Explicit prefetch targets (SetForwardPrefetch/SetBackwardPrefetch); empty: the next group.
  std::vector<Group*> forward_prefetch;
  std::vector<Group*> backward_prefetch;

  State state = State::kSharded;
  at::Tensor gather_out;  // [W * S], rank-major, while the gather is in flight
  std::unique_ptr<Work> gather_work;
  // [W * S], parameter-major. Its storage is freed at reshard and allocated again at the next
  // gather, so tensors autograd saved from the full parameters (views such as W.t()) release
  // the memory too and see the new values in backward.
  at::Tensor full;
  at::Tensor accumulated;  // [W * S] rank-major, reduce_dtype: gradients of unsynced passes
  at::Tensor reduce_out;   // [S]: this rank's reduced gradients, once `reduced`
  std::unique_ptr<Work> reduce_work;     // the reduce-scatter in flight
  std::unique_ptr<Work> replicate_work;  // HSDP: the all-reduce over replicas in flight
  bool reduced = false;                  // reduce_out holds gradients still to hand out
  bool pre_backward_done = false;
  bool post_backward_done = false;
};

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

[[noreturn]] void ThrowStatus(const absl::Status& status) {
  TORCH_CHECK(false, "FSDP: ", status.ToString());
}

void FreeStorage(const at::Tensor& t) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  storage->set_nbytes(0);
}

void AllocateStorage(const at::Tensor& t) {
  const c10::DeviceGuard on_device(t.device());  // the allocator serves the current device
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  const size_t nbytes = static_cast<size_t>(t.numel()) * t.element_size();
  if (storage->nbytes() == nbytes) return;
  storage->set_data_ptr_noswap(storage->allocator()->allocate(nbytes));
  storage->set_nbytes(nbytes);
}

// Gradients of the full parameter `grad` ([rows, ...]) as the [W, chunk_numel] rank-major
// block a reduce-scatter expects, padded with zero rows.
at::Tensor RankMajor(const at::Tensor& grad, int world, int64_t chunk_numel) {
  at::Tensor flat = grad.reshape({-1});
  if (flat.numel() == world * chunk_numel) return flat.view({world, chunk_numel});
  at::Tensor padded = at::zeros({world * chunk_numel}, grad.options());
  padded.narrow(0, 0, flat.numel()).copy_(flat);
  return padded.view({world, chunk_numel});
}

}  // namespace

// The autograd nodes call back into the model through these.
struct FullyShardedModel::Internals {
  struct Ref : torch::CustomClassHolder {
    FullyShardedModel* model = nullptr;
    Group* group = nullptr;
  };
  static void PreBackward(const Ref& ref) { ref.model->PreBackward(*ref.group); }
  static void PostBackward(const Ref& ref) { ref.model->OnPostBackward(*ref.group); }
};

namespace {

using Ref = FullyShardedModel::Internals::Ref;

c10::intrusive_ptr<Ref> GetRef(AutogradContext* ctx) {
  return c10::static_intrusive_pointer_cast<Ref>(ctx->saved_data["group"].toCapsule());
}

// Identity on a tensor; its backward calls `OnBackward` with the group before passing the
// gradient on.
template <void (*OnBackward)(const Ref&)>
class BackwardHookFunction : public torch::autograd::Function<BackwardHookFunction<OnBackward>> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            c10::intrusive_ptr<Ref> ref) {
    ctx->saved_data["group"] = c10::IValue::make_capsule(std::move(ref));
    return x;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    OnBackward(*GetRef(ctx));
    return {grads[0], at::Tensor()};
  }
};

// On a unit's output: runs before the unit's backward (gather again).
using PreBackwardFunction = BackwardHookFunction<&FullyShardedModel::Internals::PreBackward>;
// On a unit's input: runs once the unit's gradients are complete (reduce-scatter them).
using PostBackwardFunction = BackwardHookFunction<&FullyShardedModel::Internals::PostBackward>;

c10::intrusive_ptr<Ref> MakeRef(FullyShardedModel* model, FullyShardedModel::Group* group) {
  auto ref = c10::make_intrusive<Ref>();
  ref->model = model;
  ref->group = group;
  return ref;
}

}  // namespace

class FullyShardedModel::Hook : public UnitHook {
 public:
  Hook(FullyShardedModel* model, Group* group) : model_(model), group_(group) {}
  torch::Tensor PreForward(Unit&, torch::Tensor input) override {
    return model_->PreForward(*group_, std::move(input));
  }
  torch::Tensor PostForward(Unit&, torch::Tensor output) override {
    return model_->PostForward(*group_, std::move(output));
  }

 private:
  FullyShardedModel* model_;
  Group* group_;
};

FullyShardedModel::FullyShardedModel(ShardMesh mesh, FullyShardOptions options)
    : mesh_(std::move(mesh)), options_(std::move(options)) {}

FullyShardedModel::~FullyShardedModel() = default;

int FullyShardedModel::num_groups() const { return static_cast<int>(groups_.size()); }

std::vector<std::string> FullyShardedModel::GroupUnitClasses() const {
  std::vector<std::string> out;
  for (const auto& g : groups_) out.push_back(g->unit_class);
  return out;
}

const ShardInfo* FullyShardedModel::Find(const at::Tensor& param) const {
  auto it = by_param_.find(param.unsafeGetTensorImpl());
  return it == by_param_.end() ? nullptr : &it->second.first->params[it->second.second].info;
}

std::vector<std::pair<at::Tensor, const ShardInfo*>> FullyShardedModel::Shards() const {
  std::vector<std::pair<at::Tensor, const ShardInfo*>> out;
  for (const auto& g : groups_) {
    for (const Group::Param& p : g->params) out.emplace_back(p.param, &p.info);
  }
  return out;
}

void FullyShardedModel::CountUnsharded() {
  int n = 0;
  int64_t bytes = shard_bytes();
  for (const auto& g : groups_) {
    n += g->state != Group::State::kSharded;
    if (g->gather_out.defined()) bytes += g->gather_out.numel() * g->gather_out.element_size();
    bytes += static_cast<int64_t>(g->full.storage().nbytes());
  }
  peak_unsharded_ = std::max(peak_unsharded_, n);
  peak_parameter_bytes_ = std::max(peak_parameter_bytes_, bytes);
}

int64_t FullyShardedModel::shard_bytes() const { return shard_bytes_; }

std::vector<int64_t> FullyShardedModel::GroupFullBytes() const {
  std::vector<int64_t> out;
  for (const auto& g : groups_) out.push_back(g->full.numel() * g->full.element_size());
  return out;
}

absl::Status FullyShardedModel::Unshard(Group& group) {
  if (group.state != Group::State::kSharded) return absl::OkStatus();
  const int world = mesh_.shard->size();
  const int64_t s = group.segment_numel;
  return CatchTorch([&]() -> absl::Status {
    torch::NoGradGuard no_grad;
    at::Tensor out = at::empty(
        {world * s}, at::TensorOptions().dtype(group.param_dtype).device(device()));
    at::Tensor segment = out.narrow(0, mesh_.shard->rank() * s, s);
    for (const Group::Param& p : group.params) {
      // Offloaded chunks cross to the device in their own dtype first (a pinned, asynchronous
      // copy) and are cast there: a cross-device cast would run on the host and block.
      const at::Tensor source = p.shard.device() == out.device()
                                    ? p.shard
                                    : p.shard.to(out.device(), /*non_blocking=*/true);
      segment.narrow(0, p.offset, p.chunk_numel).copy_(source, /*non_blocking=*/true);
    }
    // Every rank has the same segment size, so all skip an empty group alike.
    if (s > 0) {
      CT_ASSIGN_OR_RETURN(group.gather_work, mesh_.shard->AllGather(segment, out));
    }
    group.gather_out = std::move(out);
    group.state = Group::State::kGathering;
    CountUnsharded();
    return absl::OkStatus();
  });
}

absl::Status FullyShardedModel::WaitUnshard(Group& group) {
  CT_RETURN_IF_ERROR(Unshard(group));
  if (group.state == Group::State::kUnsharded) return absl::OkStatus();
  absl::Status waited = group.gather_work ? group.gather_work->Wait() : absl::OkStatus();
  group.gather_work.reset();
  if (!waited.ok()) {
    group.gather_out = at::Tensor();
    group.state = Group::State::kSharded;
    return waited;
  }
  const int world = mesh_.shard->size();
  return CatchTorch([&] {
    torch::NoGradGuard no_grad;
    AllocateStorage(group.full);
    const at::Tensor by_rank = group.gather_out.view({world, group.segment_numel});
    for (Group::Param& p : group.params) {
      group.full.narrow(0, world * p.offset, world * p.chunk_numel)
          .view({world, p.chunk_numel})
          .copy_(by_rank.narrow(1, p.offset, p.chunk_numel));
      if (p.param.grad().defined()) {
        p.stashed_grad = p.param.grad();
        p.param.mutable_grad() = at::Tensor();
      }
      p.param.set_data(p.full_view);
    }
    CountUnsharded();  // the gather buffer and the full parameters, both alive here
    group.gather_out = at::Tensor();
    group.state = Group::State::kUnsharded;
  });
}

void FullyShardedModel::Reshard(Group& group) {
  if (group.state == Group::State::kGathering) {
    // A prefetch nobody used: complete it (every rank issued it) and drop it.
    absl::Status waited = group.gather_work ? group.gather_work->Wait() : absl::OkStatus();
    if (!waited.ok() && hook_error_.ok()) hook_error_ = waited;
    group.gather_work.reset();
    group.gather_out = at::Tensor();
    group.state = Group::State::kSharded;
    return;
  }
  if (group.state != Group::State::kUnsharded) return;
  for (Group::Param& p : group.params) {
    p.param.set_data(p.local);
    // The chunk's own gradient comes back; a full-shaped gradient still here belongs to a
    // backward that never reached this group's post-backward (it failed) and is dropped.
    p.param.mutable_grad() = std::move(p.stashed_grad);
    p.stashed_grad = at::Tensor();
  }
  FreeStorage(group.full);
  group.state = Group::State::kSharded;
}

void FullyShardedModel::Prefetch(const Group& group, int direction) {
  std::vector<Group*> targets = direction > 0 ? group.forward_prefetch : group.backward_prefetch;
  if (targets.empty()) {
    if (!order_recorded_ || group.order_index < 0) return;
    const int n = static_cast<int>(forward_order_.size());
    // Backward runs the root first, then the units in reverse forward order.
    int next;
    if (direction > 0) {
      next = group.order_index + 1;
    } else {
      if (!options_.backward_prefetch) return;
      next = group.is_root ? n - 1 : group.order_index - 1;
    }
    if (next < 0 || next >= n) return;
    targets.push_back(forward_order_[next]);
  }
  for (Group* target : targets) {
    if (target->is_root || (direction < 0 && target->pre_backward_done)) continue;
    absl::Status status = Unshard(*target);
    if (!status.ok()) ThrowStatus(status);
  }
}

absl::Status FullyShardedModel::SetPrefetch(const Unit& unit,
                                            const std::vector<const Unit*>& targets, bool forward) {
  auto find = [&](const Unit* u) -> Group* {
    for (const auto& g : groups_) {
      if (g->unit == u) return g.get();
    }
    return nullptr;
  };
  Group* group = find(&unit);
  if (group == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prefetch: unit ", unit.unit_class(), " has no shard group of its own (is it wrapped?)"));
  }
  std::vector<Group*> resolved;
  for (const Unit* target : targets) {
    Group* g = target ? find(target) : nullptr;
    if (g == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "prefetch: a target of unit ", unit.unit_class(), " has no shard group of its own"));
    }
    resolved.push_back(g);
  }
  (forward ? group->forward_prefetch : group->backward_prefetch) = std::move(resolved);
  return absl::OkStatus();
}

torch::Tensor FullyShardedModel::PreForward(Group& group, torch::Tensor input) {
  if (!order_recorded_ && group.order_index < 0) {
    group.order_index = static_cast<int>(forward_order_.size());
    forward_order_.push_back(&group);
  }
  absl::Status status = Unshard(group);
  if (status.ok()) Prefetch(group, +1);
  if (status.ok()) status = WaitUnshard(group);
  if (!status.ok()) ThrowStatus(status);
  const bool grad = at::GradMode::is_enabled();
  if (grad) {
    group.pre_backward_done = false;
    group.post_backward_done = false;
  }
  if (options_.cast_forward_inputs && options_.param_dtype && input.is_floating_point()) {
    input = input.to(*options_.param_dtype);
  }
  if (grad && input.requires_grad()) {
    input = PostBackwardFunction::apply(input, MakeRef(this, &group));
  }
  return input;
}

torch::Tensor FullyShardedModel::PostForward(Group& group, torch::Tensor output) {
  const bool grad = at::GradMode::is_enabled();
  if (!grad || group.reshard_after_forward) Reshard(group);
  if (group.is_root) {
    order_recorded_ = true;
    if (options_.output_dtype && output.is_floating_point()) {
      output = output.to(*options_.output_dtype);
    }
  }
  if (grad && output.requires_grad()) {
    output = PreBackwardFunction::apply(output, MakeRef(this, &group));
  }
  return output;
}

void FullyShardedModel::PreBackward(Group& group) {
  if (group.pre_backward_done) return;
  group.pre_backward_done = true;
  absl::Status status = Unshard(group);
  if (status.ok()) Prefetch(group, -1);
  if (status.ok()) status = WaitUnshard(group);
  if (!status.ok()) {
    if (hook_error_.ok()) hook_error_ = status;
    ThrowStatus(status);
  }
}

void FullyShardedModel::OnPostBackward(Group& group) {
  absl::Status status = PostBackward(group);
  if (!status.ok()) {
    if (hook_error_.ok()) hook_error_ = status;
    ThrowStatus(status);
  }
}

// Moves the full gradients of `group`'s parameters into `by_rank` ([W, S], rank-major),
// added to what it holds when `add`, else overwriting it (zeros where a gradient is missing).
void FullyShardedModel::PackFullGradients(Group& group, const at::Tensor& by_rank, bool add) {
  const int world = mesh_.shard->size();
  for (Group::Param& p : group.params) {
    at::Tensor grad = p.param.grad();
    p.param.mutable_grad() = at::Tensor();
    at::Tensor slot = by_rank.narrow(1, p.offset, p.chunk_numel);
    if (!grad.defined()) {
      if (!add) slot.zero_();
    } else if (add) {
      slot.add_(RankMajor(grad, world, p.chunk_numel));
    } else {
      slot.copy_(RankMajor(grad, world, p.chunk_numel));
    }
  }
}

absl::Status FullyShardedModel::PostBackward(Group& group) {
  if (group.post_backward_done) return absl::OkStatus();
  group.post_backward_done = true;
  // A group this backward never gathered (its unit did not run) has no full gradients, but
  // with sync on it still owes the reduction of what the unsynced passes accumulated.
  const bool full_grads = group.state == Group::State::kUnsharded;
  if (!full_grads && !(sync_ && group.accumulated.defined())) return absl::OkStatus();
  const int world = mesh_.shard->size();
  const int64_t s = group.segment_numel;
  CT_RETURN_IF_ERROR(CatchTorch([&]() -> absl::Status {
    torch::NoGradGuard no_grad;
    // The previous group's reduce-scatter completes first (on CUDA the stream waits; its
    // input buffer is released), so one group's full gradients are in flight at a time.
    if (sync_ && last_reduced_ != nullptr && last_reduced_ != &group) {
      CT_RETURN_IF_ERROR(CompleteReduceScatter(*last_reduced_));
    }
    const bool add = group.accumulated.defined();
    at::Tensor in =
        add ? group.accumulated
            : at::empty({world * s},
                        at::TensorOptions().dtype(group.reduce_dtype).device(device()));
    group.accumulated = at::Tensor();
    if (full_grads) PackFullGradients(group, in.view({world, s}), add);
    if (!sync_) {
      group.accumulated = in;
      return absl::OkStatus();
    }
    if (s == 0) return absl::OkStatus();
    at::Tensor out = at::empty({s}, in.options());
    CT_ASSIGN_OR_RETURN(group.reduce_work, mesh_.shard->ReduceScatter(in, out, ReduceOp::kSum));
    group.reduce_out = std::move(out);
    group.reduced = true;
    last_reduced_ = &group;
    return absl::OkStatus();
  }));
  Reshard(group);
  return absl::OkStatus();
}

absl::Status FullyShardedModel::CompleteReduceScatter(Group& group) {
  if (group.reduce_work == nullptr) return absl::OkStatus();
  absl::Status waited = group.reduce_work->Wait();
  group.reduce_work.reset();
  CT_RETURN_IF_ERROR(waited);
  if (mesh_.replicate != nullptr) {
    CT_ASSIGN_OR_RETURN(group.replicate_work,
                        mesh_.replicate->AllReduce(group.reduce_out, ReduceOp::kSum));
  }
  return absl::OkStatus();
}

absl::Status FullyShardedModel::FinishBackward() {
  absl::Status status = std::move(hook_error_);
  hook_error_ = absl::OkStatus();
  order_recorded_ = true;
  // Groups no input gradient reached (the root; units whose input needs no gradient), in the
  // same order on every rank.
  std::vector<Group*> order;
  for (auto it = groups_.rbegin(); it != groups_.rend(); ++it) order.push_back(it->get());
  for (Group* g : order) {
    const bool owes = g->state == Group::State::kUnsharded || (sync_ && g->accumulated.defined());
    if (owes && status.ok()) status = PostBackward(*g);
  }
  for (Group* g : order) {
    if (!g->reduced) continue;
    g->reduced = false;
    absl::Status waited = CompleteReduceScatter(*g);
    if (waited.ok() && g->replicate_work != nullptr) waited = g->replicate_work->Wait();
    g->replicate_work.reset();
    if (!waited.ok()) {
      if (status.ok()) status = waited;
      g->reduce_out = at::Tensor();
      continue;
    }
    absl::Status assigned = CatchTorch([&] {
      torch::NoGradGuard no_grad;
      for (Group::Param& p : g->params) {
        if (!p.param.requires_grad()) continue;
        at::Tensor grad = g->reduce_out.narrow(0, p.offset, p.info.local_rows * p.row_numel)
                              .view(p.local.sizes())
                              .to(p.local.device(), p.info.dtype);
        if (p.param.grad().defined()) {
          p.param.mutable_grad().add_(grad);
        } else {
          p.param.mutable_grad() = grad;
        }
      }
    });
    if (!assigned.ok() && status.ok()) status = assigned;
    g->reduce_out = at::Tensor();
  }
  last_reduced_ = nullptr;
  absl::Status resharded = ReshardAll();
  if (status.ok()) status = resharded;
  for (const auto& g : groups_) {
    g->pre_backward_done = false;
    g->post_backward_done = false;
  }
  return status;
}

void FullyShardedModel::DiscardGradients() {
  for (const auto& g : groups_) {
    for (const auto& work : {g->reduce_work.get(), g->replicate_work.get()}) {
      if (work != nullptr) (void)work->Synchronize();  // nothing may still write the buffers
    }
    g->reduce_work.reset();
    g->replicate_work.reset();
    g->reduce_out = at::Tensor();
    g->reduced = false;
    g->accumulated = at::Tensor();
    g->pre_backward_done = false;
    g->post_backward_done = false;
  }
  last_reduced_ = nullptr;
}

absl::Status FullyShardedModel::ReshardAll() {
  for (const auto& g : groups_) Reshard(*g);
  absl::Status status = std::move(hook_error_);
  hook_error_ = absl::OkStatus();
  return status;
}

absl::Status FullyShardedModel::BeginForward() {
  Group& root = *groups_.back();
  if (!order_recorded_ && root.order_index < 0) {
    root.order_index = static_cast<int>(forward_order_.size());
    forward_order_.push_back(&root);
  }
  CT_RETURN_IF_ERROR(Unshard(root));
  CT_RETURN_IF_ERROR(CatchTorch([&] { Prefetch(root, +1); }));
  return WaitUnshard(root);
}

absl::Status FullyShardedModel::EndForward() {
  order_recorded_ = true;
  Group& root = *groups_.back();
  if (!at::GradMode::is_enabled()) return ReshardAll();
  if (root.reshard_after_forward) Reshard(root);
  return absl::OkStatus();
}

absl::Status FullyShardedModel::BeginBackward() {
  Group& root = *groups_.back();
  return CatchTorch([&] { PreBackward(root); });
}

absl::StatusOr<at::Tensor> FullyShardedModel::GatherFull(const at::Tensor& param) {
  auto it = by_param_.find(param.unsafeGetTensorImpl());
  if (it == by_param_.end()) {
    return absl::NotFoundError("GatherFull: the tensor is not a parameter sharded by FullyShard");
  }
  const Group& g = *it->second.first;
  const Group::Param& p = g.params[it->second.second];
  if (g.state == Group::State::kUnsharded) {
    return p.param.detach().to(at::kCPU, p.info.dtype, /*non_blocking=*/false, /*copy=*/true);
  }
  const int world = mesh_.shard->size();
  at::Tensor out;
  CT_RETURN_IF_ERROR(CatchTorch([&]() -> absl::Status {
    at::Tensor input = p.shard.to(device());
    out = at::empty({world * p.chunk_numel}, input.options());
    CT_ASSIGN_OR_RETURN(std::unique_ptr<Work> work, mesh_.shard->AllGather(input, out));
    CT_RETURN_IF_ERROR(work->Synchronize());
    out = out.narrow(0, 0, p.info.global_shape[0] * p.row_numel)
              .view(p.info.global_shape)
              .to(at::kCPU);
    return absl::OkStatus();
  }));
  return out;
}

FullyShardedModel* FullyShardedOf(const TrainableModel& model) {
  return dynamic_cast<FullyShardedModel*>(model.sharding());
}

namespace {

struct Assignment {
  std::string name;
  at::Tensor param;
  int group = 0;
};

// Walks the module tree: each parameter belongs to the innermost wrapped unit above it (the
// root group is index `root_index`). Units are numbered in pre-order.
void AssignParameters(torch::nn::Module& module, const std::string& prefix, int group,
                      const std::function<bool(const Unit&)>& wrap, std::vector<Unit*>* units,
                      std::vector<Assignment>* out) {
  for (const auto& item : module.named_parameters(/*recurse=*/false)) {
    out->push_back({prefix + item.key(), item.value(), group});
  }
  for (const auto& child : module.named_children()) {
    int child_group = group;
    if (auto* unit = dynamic_cast<Unit*>(child.value().get()); unit != nullptr && wrap(*unit)) {
      child_group = static_cast<int>(units->size());
      units->push_back(unit);
    }
    AssignParameters(*child.value(), prefix + child.key() + ".", child_group, wrap, units, out);
  }
}

int64_t CountParameters(const torch::nn::Module& module) {
  int64_t n = 0;
  for (const auto& p : module.parameters(/*recurse=*/true)) n += p.numel();
  return n;
}

absl::Status BroadcastFromRankZero(const ShardMesh& mesh, at::Tensor& t) {
  if (mesh.replicate != nullptr) {
    CT_ASSIGN_OR_RETURN(std::unique_ptr<Work> work, mesh.replicate->Broadcast(t, 0));
    CT_RETURN_IF_ERROR(work->Synchronize());
  }
  CT_ASSIGN_OR_RETURN(std::unique_ptr<Work> work, mesh.shard->Broadcast(t, 0));
  return work->Synchronize();
}

// A tensor registered in two shard groups (weights tied across units) is sharded with the
// root, which is gathered around the whole forward and backward, so every use sees it full
// (FSDP1's rule: a shared parameter belongs to the lowest common ancestor).
void MoveTiedAcrossGroupsToRoot(int root_index, std::vector<Assignment>* assignments) {
  std::unordered_map<const c10::TensorImpl*, const Assignment*> first;
  std::unordered_map<const c10::TensorImpl*, bool> across;
  for (const Assignment& a : *assignments) {
    auto [it, inserted] = first.emplace(a.param.unsafeGetTensorImpl(), &a);
    if (inserted || it->second->group == a.group) continue;
    if (across.emplace(a.param.unsafeGetTensorImpl(), true).second) {
      CT_LOG_RANK0(INFO) << "FullyShard: " << a.name << " is the same tensor as "
                         << it->second->name
                         << " in another unit; it is sharded with the root group";
    }
  }
  for (Assignment& a : *assignments) {
    if (across.count(a.param.unsafeGetTensorImpl())) a.group = root_index;
  }
}

}  // namespace

absl::StatusOr<FullyShardedModel*> FullyShard(TrainableModel& model, ShardMesh mesh,
                                              const FullyShardOptions& options) {
  if (FullyShardedOf(model) != nullptr) {
    return absl::FailedPreconditionError(
        "FullyShard: the model is already sharded; hand it to the Trainer as it is");
  }
  if (mesh.shard == nullptr) {
    return absl::InvalidArgumentError("FullyShard: ShardMesh.shard (the communicator) is null");
  }
  const std::optional<c10::Device> comm_device = mesh.shard->device();
  const c10::Device device = options.device.value_or(comm_device.value_or(c10::Device(c10::kCPU)));
  for (const auto& comm : {mesh.shard, mesh.replicate}) {
    if (comm == nullptr || !comm->device() || *comm->device() == device) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "FullyShard: FullyShardOptions.device is ", device.str(), " but the ", comm->backend(),
        " communicator serves ", comm->device()->str(), ": leave device unset (it follows the "
        "communicator) or set it to ", comm->device()->str()));
  }
  if (options.offload_params && !device.is_cuda()) {
    LOG(WARNING) << "FSDP offload_params on " << device.str()
                 << ": parameters already live in CPU memory, nothing to offload";
  }
  std::vector<std::string> classes = options.wrap.classes;
  if (options.wrap.kind == WrapPolicy::Kind::kTransformer && classes.empty()) {
    classes = model.LayerUnitClasses();
  }
  std::function<bool(const Unit&)> wrap = [&](const Unit& unit) {
    switch (options.wrap.kind) {
      case WrapPolicy::Kind::kTransformer:
        return std::find(classes.begin(), classes.end(), unit.unit_class()) != classes.end();
      case WrapPolicy::Kind::kSize:
        return CountParameters(unit) >= options.wrap.min_num_params;
      case WrapPolicy::Kind::kNone:
        break;
    }
    return false;
  };
  std::vector<Unit*> units;
  std::vector<Assignment> assignments;
  constexpr int kRootPending = -1;
  AssignParameters(model, "", kRootPending, wrap, &units, &assignments);
  for (const Unit* unit : units) {
    if (unit->hook() != nullptr) {
      return absl::FailedPreconditionError(absl::StrCat("FullyShard: unit ", unit->unit_class(),
                                                        " already has a hook from another engine"));
    }
  }
  const int root_index = static_cast<int>(units.size());
  for (Assignment& a : assignments) {
    if (a.group == kRootPending) a.group = root_index;
  }
  MoveTiedAcrossGroupsToRoot(root_index, &assignments);
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
  auto state = std::shared_ptr<FullyShardedModel>(new FullyShardedModel(mesh, resolved));
  FullyShardedModel& s = *state;
  const int world = mesh.shard->size();
  const int rank = mesh.shard->rank();
  const c10::Device shard_device = options.offload_params ? c10::Device(c10::kCPU) : device;
  for (int gi = 0; gi <= root_index; ++gi) {
    auto group = std::make_unique<FullyShardedModel::Group>();
    group->is_root = gi == root_index;
    group->unit = group->is_root ? static_cast<const Unit*>(&model) : units[gi];
    group->unit_class = group->unit->unit_class();
    group->reshard_after_forward = group->is_root
                                       ? options.root_reshard_after_forward.value_or(false)
                                       : options.reshard_after_forward.value_or(true);
    s.groups_.push_back(std::move(group));
  }
  torch::NoGradGuard no_grad;
  // With sync_module_states, rank 0's values win: each rank receives only its chunk of them
  // (a scatter), except where rank 0's parameter is deferred too; then every rank initializes
  // its own rows, which agree by construction. Which ones are deferred on rank 0 is sent first.
  const bool sync = options.sync_module_states && mesh.world_size() > 1;
  std::vector<const Assignment*> unique;
  {
    std::unordered_map<const c10::TensorImpl*, bool> seen_once;
    for (const Assignment& a : assignments) {
      if (seen_once.emplace(a.param.unsafeGetTensorImpl(), true).second) unique.push_back(&a);
    }
  }
  std::vector<int32_t> root_deferred(unique.size(), 0);
  if (sync && !unique.empty()) {
    CT_RETURN_IF_ERROR(CatchTorch([&]() -> absl::Status {
      at::Tensor flags = at::empty({static_cast<int64_t>(unique.size())}, at::kInt);
      for (size_t i = 0; i < unique.size(); ++i) flags[i] = IsDeferred(unique[i]->param) ? 1 : 0;
      flags = flags.to(device);
      CT_RETURN_IF_ERROR(BroadcastFromRankZero(mesh, flags));
      flags = flags.cpu();
      for (size_t i = 0; i < unique.size(); ++i) root_deferred[i] = flags[i].item<int32_t>();
      return absl::OkStatus();
    }));
  }
  for (size_t index = 0; index < unique.size(); ++index) {
    const Assignment& a = *unique[index];
    FullyShardedModel::Group& group = *s.groups_[a.group];
    FullyShardedModel::Group::Param p;
    p.param = a.param;
    p.info.name = a.name;
    p.info.global_shape = a.param.sizes().vec();
    p.info.dtype = a.param.scalar_type();
    p.info.shard_rank = rank;
    p.info.shard_size = world;
    p.info.replicate_size = mesh.replicate ? mesh.replicate->size() : 1;
    const int64_t rows = p.info.global_shape[0];
    p.row_numel = rows == 0 ? 0 : a.param.numel() / rows;
    const RowRange mine = ShardRowRange(rows, world, rank);
    p.info.chunk_rows = ShardChunkRows(rows, world);
    p.info.row_begin = mine.begin;
    p.info.local_rows = mine.rows();
    p.chunk_numel = p.info.chunk_rows * p.row_numel;
    p.offset = group.segment_numel;
    group.segment_numel += p.chunk_numel;
    CT_RETURN_IF_ERROR(CatchTorch([&]() -> absl::Status {
      std::vector<int64_t> local_shape = p.info.global_shape;
      local_shape[0] = p.info.local_rows;
      const int64_t local_numel = p.info.local_rows * p.row_numel;
      const at::TensorOptions on_device = at::TensorOptions().dtype(p.info.dtype).device(device);
      p.shard = at::zeros({p.chunk_numel}, on_device.device(shard_device));
      if (sync && root_deferred[index] == 0) {
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
            .copy_(a.param.detach().reshape({-1}).narrow(0, p.info.row_begin * p.row_numel,
                                                         local_numel));
      }
      if (options.offload_params && device.is_cuda()) p.shard = p.shard.pin_memory();
      p.local = p.shard.narrow(0, 0, p.info.local_rows * p.row_numel).view(local_shape);
      p.param.set_data(p.local);
      return absl::OkStatus();
    }));
    group.params.push_back(std::move(p));
  }
  for (auto& group : s.groups_) {
    std::vector<at::ScalarType> dtypes;
    for (const auto& p : group->params) dtypes.push_back(p.info.dtype);
    std::sort(dtypes.begin(), dtypes.end());
    dtypes.erase(std::unique(dtypes.begin(), dtypes.end()), dtypes.end());
    if (!options.param_dtype && dtypes.size() > 1) {
      return absl::InvalidArgumentError(absl::StrCat("FullyShard: unit ", group->unit_class,
                                                     " mixes parameter dtypes; set param_dtype "
                                                     "so the group gathers in one dtype"));
    }
    group->param_dtype = options.param_dtype.value_or(dtypes.empty() ? at::kFloat : dtypes.front());
    group->reduce_dtype = options.reduce_dtype.value_or(group->param_dtype);
    CT_RETURN_IF_ERROR(CatchTorch([&] {
      group->full = at::empty({world * group->segment_numel},
                              at::TensorOptions().dtype(group->param_dtype).device(device));
      for (auto& p : group->params) {
        p.full_view = group->full.narrow(0, world * p.offset, p.info.global_shape[0] * p.row_numel)
                          .view(p.info.global_shape);
      }
      FreeStorage(group->full);
    }));
  }
  // Buffers are replicated: placed and made equal, not sharded.
  for (auto& buffer : model.buffers(/*recurse=*/true)) {
    CT_RETURN_IF_ERROR(CatchTorch([&]() -> absl::Status {
      buffer.set_data(buffer.to(device));
      if (options.sync_module_states && mesh.world_size() > 1) {
        at::Tensor data = buffer.detach();
        CT_RETURN_IF_ERROR(BroadcastFromRankZero(mesh, data));
      }
      return absl::OkStatus();
    }));
  }
  for (int gi = 0; gi <= root_index; ++gi) {
    auto hook = std::make_unique<FullyShardedModel::Hook>(&s, s.groups_[gi].get());
    if (gi == root_index) {
      model.set_hook(hook.get());
    } else {
      units[gi]->set_hook(hook.get());
    }
    s.hooks_.push_back(std::move(hook));
  }
  int64_t total = 0;
  for (const auto& g : s.groups_) {
    total += g->segment_numel * world;
    for (size_t i = 0; i < g->params.size(); ++i) {
      const auto& p = g->params[i];
      s.shard_bytes_ += p.shard.numel() * p.shard.element_size();
      s.by_param_[p.param.unsafeGetTensorImpl()] = {g.get(), i};
    }
  }
  CT_LOG_RANK0(INFO) << "FullyShard: " << s.groups_.size() << " groups (" << root_index
                     << " units + root) over " << world << " shard ranks"
                     << (mesh.replicate ? absl::StrCat(" x ", mesh.replicate->size(), " replicas")
                                        : std::string())
                     << ", " << total << " elements padded";
  FullyShardedModel* raw = state.get();
  model.set_sharding(std::move(state));
  return raw;
}

}  // namespace cpptrain
