#include "sharding/sharding_core.h"

#include <ATen/core/ivalue.h>
#include <c10/core/DeviceGuard.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/module.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/accumulate_gradient.h"
#include "base/logging.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "module/deferred.h"
#include "sharding/agreed_buffer.h"
#include "sharding/wrap_classes.h"

namespace cpptrain {

using Group = ShardGroup;

namespace sharding_core {

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

}  // namespace sharding_core

namespace {

using sharding_core::AllocateStorage;
using sharding_core::FreeStorage;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

[[noreturn]] void ThrowStatus(const absl::Status& status) {
  TORCH_CHECK(false, "FSDP: ", status.ToString());
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

// Moves the full gradients of `group`'s parameters into `in` ([W * S] as the reduce-scatter
// takes it), added to what it holds when `add`, else overwriting it (zeros where a gradient
// is missing, and in the flat parameter's alignment and tail padding).
void PackFullGradients(Group& group, int world, const at::Tensor& in, bool add) {
  const int64_t s = group.segment_numel;
  if (group.layout == Group::Layout::kFlat && !add) in.zero_();
  for (Group::Param& p : group.params) {
    at::Tensor grad = p.param.grad();
    p.param.mutable_grad() = at::Tensor();
    if (group.layout == Group::Layout::kFlat) {
      if (!grad.defined()) continue;
      at::Tensor slot = in.narrow(0, p.offset, p.numel);
      if (add) {
        slot.add_(grad.reshape({-1}));
      } else {
        slot.copy_(grad.reshape({-1}));
      }
      continue;
    }
    at::Tensor slot = in.view({world, s}).narrow(1, p.offset, p.chunk_numel);
    if (!grad.defined()) {
      if (!add) slot.zero_();
    } else if (add) {
      slot.add_(RankMajor(grad, world, p.chunk_numel));
    } else {
      slot.copy_(RankMajor(grad, world, p.chunk_numel));
    }
  }
}

}  // namespace

// The autograd nodes call back into the core through these.
struct ShardingCore::Internals {
  struct Ref : torch::CustomClassHolder {
    ShardingCore* core = nullptr;
    Group* group = nullptr;
  };
  static void PreBackward(const Ref& ref) { ref.core->PreBackward(*ref.group); }
  static void PostBackward(const Ref& ref) { ref.core->OnPostBackward(*ref.group); }
};

namespace {

using Ref = ShardingCore::Internals::Ref;

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
using PreBackwardFunction = BackwardHookFunction<&ShardingCore::Internals::PreBackward>;
// On a unit's input: runs once the unit's gradients are complete (reduce-scatter them).
using PostBackwardFunction = BackwardHookFunction<&ShardingCore::Internals::PostBackward>;

c10::intrusive_ptr<Ref> MakeRef(ShardingCore* core, Group* group) {
  auto ref = c10::make_intrusive<Ref>();
  ref->core = core;
  ref->group = group;
  return ref;
}

}  // namespace

class ShardingCore::Hook : public UnitHook {
 public:
  Hook(ShardingCore* core, Group* group) : core_(core), group_(group) {}
  torch::Tensor PreForward(Unit&, torch::Tensor input) override {
    return core_->PreForward(*group_, std::move(input));
  }
  torch::Tensor PostForward(Unit&, torch::Tensor output) override {
    return core_->PostForward(*group_, std::move(output));
  }

 private:
  ShardingCore* core_;
  Group* group_;
};

ShardingCore::ShardingCore(ShardMesh mesh, CoreOptions options)
    : mesh_(std::move(mesh)), core_options_(std::move(options)) {}

ShardingCore::~ShardingCore() = default;

void ShardingCore::Install(TrainableModel& model) {
  for (auto& group : groups_) {
    auto hook = std::make_unique<Hook>(this, group.get());
    if (group->is_root) {
      model.set_hook(hook.get());
    } else {
      const_cast<Unit*>(group->unit)->set_hook(hook.get());
    }
    hooks_.push_back(std::move(hook));
    for (size_t i = 0; i < group->params.size(); ++i) {
      by_param_[group->params[i].param.unsafeGetTensorImpl()] = {group.get(), i};
    }
    if (group->layout == Group::Layout::kFlat) {
      shard_bytes_ += group->flat_shard.numel() * group->flat_shard.element_size();
    } else {
      for (const auto& p : group->params) shard_bytes_ += p.shard.numel() * p.shard.element_size();
    }
  }
}

const std::pair<ShardGroup*, size_t>* ShardingCore::Locate(const at::Tensor& param) const {
  auto it = by_param_.find(param.unsafeGetTensorImpl());
  return it == by_param_.end() ? nullptr : &it->second;
}

int ShardingCore::num_groups() const { return static_cast<int>(groups_.size()); }

std::vector<std::string> ShardingCore::GroupUnitClasses() const {
  std::vector<std::string> out;
  for (const auto& g : groups_) out.push_back(g->unit_class);
  return out;
}

std::vector<std::pair<at::Tensor, const ShardInfo*>> ShardingCore::Shards() const {
  std::vector<std::pair<at::Tensor, const ShardInfo*>> out;
  for (const auto& g : groups_) {
    for (const Group::Param& p : g->params) out.emplace_back(p.param, &p.info);
  }
  return out;
}

void ShardingCore::CountUnsharded() {
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

namespace {

int64_t Bytes(const at::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

}  // namespace

void ShardingCore::CountGradients() {
  int64_t bytes = 0;
  for (const auto& g : groups_) {
    for (const Group::Param& p : g->params) bytes += Bytes(p.param.grad()) + Bytes(p.stashed_grad);
    bytes += Bytes(g->accumulated) + Bytes(g->reduce_in);
    if (!g->reduce_out.is_same(g->reduce_in)) bytes += Bytes(g->reduce_out);  // one rank: same
  }
  peak_gradient_bytes_ = std::max(peak_gradient_bytes_, bytes);
}

std::vector<int64_t> ShardingCore::GroupFullBytes() const {
  std::vector<int64_t> out;
  for (const auto& g : groups_) out.push_back(g->full.numel() * g->full.element_size());
  return out;
}

namespace {

// `t` itself on `device`, else a pinned, asynchronous transfer of it in its own dtype.
at::Tensor OnDevice(const at::Tensor& t, c10::Device device) {
  return t.device() == device ? t : t.to(device, /*non_blocking=*/true);
}

// The gather's input for the flat layout: the flat shard itself when it is on the device in
// the gather dtype (no copy-in), else a cast or transfer of it. Offloaded shards cross in
// their own dtype first (OnDevice) and are cast there: a cross-device cast would run on the
// host and block.
at::Tensor FlatGatherInput(const Group& group, c10::Device device) {
  at::Tensor input = OnDevice(group.flat_shard, device);
  if (input.scalar_type() != group.param_dtype) input = input.to(group.param_dtype);
  return input;
}

// One shard rank: the full parameters are the shards, copied and cast into place on `device`
// (offloaded shards cross in their own dtype first, as FlatGatherInput's do).
void CopyShardsIntoFull(Group& group, c10::Device device) {
  AllocateStorage(group.full);
  if (group.layout == Group::Layout::kFlat) {
    group.full.copy_(OnDevice(group.flat_shard, device), /*non_blocking=*/true);
    return;
  }
  for (const Group::Param& p : group.params) {
    group.full.narrow(0, p.offset, p.chunk_numel)
        .copy_(OnDevice(p.shard, device), /*non_blocking=*/true);
  }
}

}  // namespace

absl::Status ShardingCore::Unshard(Group& group) {
  if (group.state != Group::State::kSharded) return absl::OkStatus();
  const int world = mesh_.shard->size();
  const int64_t s = group.segment_numel;
  absl::Status status = CatchTorch([&]() -> absl::Status {
    torch::NoGradGuard no_grad;
    if (world == 1) {
      CopyShardsIntoFull(group, device());
    } else if (group.layout == Group::Layout::kFlat) {
      // One all-gather of the flat shard straight into the full flat parameter.
      AllocateStorage(group.full);
      if (s > 0) {
        CT_ASSIGN_OR_RETURN(group.gather_work,
                            mesh_.shard->AllGather(FlatGatherInput(group, device()), group.full));
      }
    } else {
      at::Tensor out =
          at::empty({world * s}, at::TensorOptions().dtype(group.param_dtype).device(device()));
      at::Tensor segment = out.narrow(0, mesh_.shard->rank() * s, s);
      for (const Group::Param& p : group.params) {
        segment.narrow(0, p.offset, p.chunk_numel)
            .copy_(OnDevice(p.shard, out.device()), /*non_blocking=*/true);
      }
      // Every rank has the same segment size, so all skip an empty group alike.
      if (s > 0) {
        CT_ASSIGN_OR_RETURN(group.gather_work, mesh_.shard->AllGather(segment, out));
      }
      group.gather_out = std::move(out);
    }
    group.state = Group::State::kGathering;
    CountUnsharded();
    return absl::OkStatus();
  });
  // A copy or gather that failed to start leaves the group sharded: nothing may stay allocated.
  if (!status.ok() && group.state == Group::State::kSharded) FreeStorage(group.full);
  return status;
}

absl::Status ShardingCore::WaitUnshard(Group& group) {
  CT_RETURN_IF_ERROR(Unshard(group));
  if (group.state == Group::State::kUnsharded) return absl::OkStatus();
  absl::Status waited = group.gather_work ? group.gather_work->Wait() : absl::OkStatus();
  group.gather_work.reset();
  if (!waited.ok()) {
    group.gather_out = at::Tensor();
    FreeStorage(group.full);
    group.state = Group::State::kSharded;
    return waited;
  }
  const int world = mesh_.shard->size();
  return CatchTorch([&] {
    torch::NoGradGuard no_grad;
    if (group.gather_out.defined()) {  // kPerParameter over several ranks: copy out
      AllocateStorage(group.full);
      const at::Tensor by_rank = group.gather_out.view({world, group.segment_numel});
      for (Group::Param& p : group.params) {
        group.full.narrow(0, world * p.offset, world * p.chunk_numel)
            .view({world, p.chunk_numel})
            .copy_(by_rank.narrow(1, p.offset, p.chunk_numel));
      }
    }
    for (Group::Param& p : group.params) {
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

void ShardingCore::Reshard(Group& group) {
  if (group.state == Group::State::kGathering) {
    // A prefetch nobody used: complete it (every rank issued it) and drop it.
    absl::Status waited = group.gather_work ? group.gather_work->Wait() : absl::OkStatus();
    if (!waited.ok() && hook_error_.ok()) hook_error_ = waited;
    group.gather_work.reset();
    group.gather_out = at::Tensor();
    FreeStorage(group.full);  // allocated for kFlat, and for one rank
    group.state = Group::State::kSharded;
    return;
  }
  if (group.state != Group::State::kUnsharded) return;
  for (Group::Param& p : group.params) {
    p.param.set_data(p.local);
    // The local part's own gradient comes back; a full-shaped gradient still here belongs to
    // a backward that never reached this group's post-backward (it failed) and is dropped.
    p.param.mutable_grad() = std::move(p.stashed_grad);
    p.stashed_grad = at::Tensor();
  }
  FreeStorage(group.full);
  group.state = Group::State::kSharded;
}

void ShardingCore::Prefetch(const Group& group, int direction) {
  std::vector<Group*> targets = direction > 0 ? group.forward_prefetch : group.backward_prefetch;
  if (targets.empty()) {
    if (!order_recorded_ || group.order_index < 0) return;
    const int n = static_cast<int>(forward_order_.size());
    // Backward runs the root first, then the units in reverse forward order.
    int next;
    if (direction > 0) {
      if (!core_options_.forward_prefetch) return;
      next = group.order_index + 1;
    } else {
      if (core_options_.backward_prefetch == CoreOptions::BackwardPrefetch::kNone) return;
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

absl::Status ShardingCore::SetPrefetch(const Unit& unit, const std::vector<const Unit*>& targets,
                                       bool forward) {
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

torch::Tensor ShardingCore::PreForward(Group& group, torch::Tensor input) {
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
  if (core_options_.cast_forward_inputs && core_options_.param_dtype && input.is_floating_point()) {
    input = input.to(*core_options_.param_dtype);
  }
  if (grad && input.requires_grad()) {
    input = PostBackwardFunction::apply(input, MakeRef(this, &group));
  }
  return input;
}

torch::Tensor ShardingCore::PostForward(Group& group, torch::Tensor output) {
  const bool grad = at::GradMode::is_enabled();
  if (!grad || group.reshard_after_forward) Reshard(group);
  if (group.is_root) {
    order_recorded_ = true;
    if (core_options_.output_dtype && output.is_floating_point()) {
      output = output.to(*core_options_.output_dtype);
    }
  }
  if (grad && output.requires_grad()) {
    output = PreBackwardFunction::apply(output, MakeRef(this, &group));
  }
  return output;
}

void ShardingCore::PreBackward(Group& group) {
  if (group.pre_backward_done) return;
  group.pre_backward_done = true;
  absl::Status status = Unshard(group);
  if (status.ok() && core_options_.backward_prefetch == CoreOptions::BackwardPrefetch::kPre) {
    Prefetch(group, -1);
  }
  if (status.ok()) status = WaitUnshard(group);
  if (!status.ok()) {
    if (hook_error_.ok()) hook_error_ = status;
    ThrowStatus(status);
  }
}

void ShardingCore::OnPostBackward(Group& group) {
  // BACKWARD_POST: the next group's gather is issued once this group's gradients exist,
  // ahead of this group's reduce-scatter.
  if (core_options_.backward_prefetch == CoreOptions::BackwardPrefetch::kPost &&
      !group.post_backward_done) {
    Prefetch(group, -1);
  }
  absl::Status status = PostBackward(group);
  if (!status.ok()) {
    if (hook_error_.ok()) hook_error_ = status;
    ThrowStatus(status);
  }
}

absl::Status ShardingCore::PostBackward(Group& group) {
  if (group.post_backward_done) return absl::OkStatus();
  group.post_backward_done = true;
  // A group this backward never gathered (its unit did not run) has no full gradients, but
  // with sync on it still owes the reduction of what the unsynced passes accumulated.
  const bool full_grads = group.state == Group::State::kUnsharded;
  if (!full_grads && !(sync_ && group.accumulated.defined())) return absl::OkStatus();
  CountGradients();  // this group's full gradients and the previous group's reduction
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
    if (full_grads && sync_ && !add && HoldsFullGradients(group)) {
      HoldFullGradients(group);
      CountGradients();
      return absl::OkStatus();
    }
    at::Tensor in = add ? group.accumulated
                        : at::empty({world * s},
                                    at::TensorOptions().dtype(group.reduce_dtype).device(device()));
    group.accumulated = at::Tensor();
    if (full_grads) {
      PackFullGradients(group, world, in, add);
    } else if (!add) {
      in.zero_();
    }
    if (!sync_) {
      group.accumulated = in;
      CountGradients();
      return absl::OkStatus();
    }
    if (s == 0) return absl::OkStatus();
    // One rank: `in` is the reduced segment, held as both until CompleteReduceScatter.
    at::Tensor out = world == 1 ? in : at::empty({s}, in.options());
    if (world > 1) {
      CT_ASSIGN_OR_RETURN(group.reduce_work,
                          mesh_.shard->ReduceScatter(in, out, ReduceOp::kSum));
    }
    group.reduce_in = std::move(in);
    group.reduce_out = std::move(out);
    group.reduced = true;
    last_reduced_ = &group;
    CountGradients();
    return absl::OkStatus();
  }));
  Reshard(group);
  return absl::OkStatus();
}

// Not where a reduce_dtype narrower than fp32 and than the gradients would round them: the
// packed path's rounding is what was asked for.
bool ShardingCore::HoldsFullGradients(const Group& group) const {
  const bool reduce_rounds = group.reduce_dtype != at::kFloat &&
                             group.reduce_dtype != group.param_dtype;
  return mesh_.shard->size() == 1 && mesh_.replicate == nullptr && !reduce_rounds &&
         std::all_of(group.params.begin(), group.params.end(),
                     [&](const Group::Param& p) { return p.local.device() == device(); });
}

// Each full gradient becomes its local part's (the same elements at one rank), set aside until
// Reshard gives it back as .grad: as autograd made it when it has the local part's dtype, or is
// bf16 and hold_bf16_; else cast. Added to a gradient already there (in the local dtype), and
// zeros for a parameter that got none, as the packed path gives it.
void ShardingCore::HoldFullGradients(Group& group) {
  for (Group::Param& p : group.params) {
    at::Tensor grad = p.param.grad();
    p.param.mutable_grad() = at::Tensor();
    if (!p.param.requires_grad()) continue;
    grad = grad.defined() ? grad.reshape(p.local.sizes())
                          : at::zeros(p.local.sizes(), p.local.options().dtype(p.info.dtype));
    AccumulateGradient(p.stashed_grad, grad, p.info.dtype, hold_bf16_);
  }
}

// Without replicas, a resharded group whose local parts live on the compute device takes its
// reduced segment into .grad here, so the segment is not kept until FinishBackward (the
// gradients held stay the local parts' plus the reductions in flight, as DeepSpeed's stage 3
// accumulates into the partition). Offloaded parts (a host copy) and HSDP (the all-reduce
// over replicas comes first) are assigned by FinishBackward.
absl::Status ShardingCore::CompleteReduceScatter(Group& group) {
  if (!group.reduce_in.defined()) return absl::OkStatus();  // none in flight (or done)
  // The current stream waits; one rank issued none.
  absl::Status waited = group.reduce_work ? group.reduce_work->Wait() : absl::OkStatus();
  group.reduce_work.reset();
  group.reduce_in = at::Tensor();
  if (!waited.ok()) {
    group.reduce_out = at::Tensor();
    group.reduced = false;
    return waited;
  }
  if (mesh_.replicate != nullptr) {
    CT_ASSIGN_OR_RETURN(group.replicate_work,
                        mesh_.replicate->AllReduce(group.reduce_out, ReduceOp::kSum));
    return absl::OkStatus();
  }
  const bool on_device =
      std::all_of(group.params.begin(), group.params.end(),
                  [&](const Group::Param& p) { return p.local.device() == device(); });
  if (group.state != Group::State::kSharded || !on_device) return absl::OkStatus();
  group.reduced = false;
  absl::Status assigned = AssignReducedGradients(group);
  group.reduce_out = at::Tensor();
  return assigned;
}

// Each parameter's .grad gets its local part of the reduced segment (added to what is there).
absl::Status ShardingCore::AssignReducedGradients(Group& g) {
  return CatchTorch([&] {
    torch::NoGradGuard no_grad;
    for (Group::Param& p : g.params) {
      if (!p.param.requires_grad()) continue;
      at::Tensor grad = g.reduce_out.narrow(0, p.local_offset, p.local.numel())
                            .view(p.local.sizes())
                            .to(p.local.device(), p.info.dtype);
      // Added to what is there, widened first when HoldFullGradients left it bf16.
      AccumulateGradient(p.param.mutable_grad(), grad, p.info.dtype, /*keep_bf16=*/false);
    }
  });
}

absl::Status ShardingCore::FinishBackward() {
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
  CountGradients();  // reductions still held (offload, HSDP) beside the local parts' gradients
  for (Group* g : order) {
    if (!g->reduced) continue;
    absl::Status waited = CompleteReduceScatter(*g);  // may assign it already
    if (waited.ok() && g->replicate_work != nullptr) waited = g->replicate_work->Wait();
    g->replicate_work.reset();
    if (waited.ok() && g->reduced) waited = AssignReducedGradients(*g);
    if (!waited.ok() && status.ok()) status = waited;
    g->reduced = false;
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

void ShardingCore::DiscardGradients() {
  for (const auto& g : groups_) {
    for (const auto& work : {g->reduce_work.get(), g->replicate_work.get()}) {
      if (work != nullptr) (void)work->Synchronize();  // nothing may still write the buffers
    }
    g->reduce_work.reset();
    g->replicate_work.reset();
    g->reduce_in = at::Tensor();
    g->reduce_out = at::Tensor();
    g->reduced = false;
    g->accumulated = at::Tensor();
    g->pre_backward_done = false;
    g->post_backward_done = false;
  }
  last_reduced_ = nullptr;
}

absl::Status ShardingCore::ReshardAll() {
  for (const auto& g : groups_) Reshard(*g);
  absl::Status status = std::move(hook_error_);
  hook_error_ = absl::OkStatus();
  return status;
}

absl::Status ShardingCore::BeginForward() {
  Group& root = *groups_.back();
  if (!order_recorded_ && root.order_index < 0) {
    root.order_index = static_cast<int>(forward_order_.size());
    forward_order_.push_back(&root);
  }
  CT_RETURN_IF_ERROR(Unshard(root));
  CT_RETURN_IF_ERROR(CatchTorch([&] { Prefetch(root, +1); }));
  return WaitUnshard(root);
}

absl::Status ShardingCore::EndForward() {
  order_recorded_ = true;
  Group& root = *groups_.back();
  if (!at::GradMode::is_enabled()) return ReshardAll();
  if (root.reshard_after_forward) Reshard(root);
  return absl::OkStatus();
}

absl::Status ShardingCore::BeginBackward() {
  Group& root = *groups_.back();
  return CatchTorch([&] { PreBackward(root); });
}

namespace {

// What one rank adds to a gather of `p`: its padded chunk, or for kFlat the group's segment.
const at::Tensor& GatheredShard(const ShardGroup& g, const ShardGroup::Param& p) {
  return g.layout == ShardGroup::Layout::kFlat ? g.flat_shard : p.shard;
}

// The bytes GatherFull(param, staging, first_failure) uses: the gathered chunks and room for this
// rank's own when it has to be brought to the device.
int64_t GatherBytes(const ShardGroup& g, const ShardGroup::Param& p, int world) {
  const at::Tensor& shard = GatheredShard(g, p);
  return (world + 1) * shard.numel() * static_cast<int64_t>(shard.element_size());
}

}  // namespace

absl::StatusOr<at::Tensor> ShardingCore::GatherFull(const at::Tensor& param) {
  const std::pair<ShardGroup*, size_t>* where = Locate(param);
  if (where == nullptr) {
    return absl::NotFoundError("GatherFull: the tensor is not a sharded parameter");
  }
  const ShardGroup& g = *where->first;
  // An unsharded group is copied from its full parameters: no gather, so a byte will do.
  const int64_t bytes = g.state == ShardGroup::State::kUnsharded
                            ? 1
                            : GatherBytes(g, g.params[where->second], mesh_.shard->size());
  CT_ASSIGN_OR_RETURN(at::Tensor staging, CatchTorch([&] {
                        return at::empty({bytes}, at::TensorOptions(at::kByte).device(device()));
                      }));
  absl::Status local;
  CT_ASSIGN_OR_RETURN(at::Tensor full, GatherFull(param, staging, &local));
  CT_RETURN_IF_ERROR(local);
  return full;
}

int64_t ShardingCore::GatherFullBytes() const {
  int64_t most = 1;
  for (const auto& g : groups_) {
    for (const ShardGroup::Param& p : g->params) {
      most = std::max(most, GatherBytes(*g, p, mesh_.shard->size()));
    }
  }
  return most;
}

absl::StatusOr<at::Tensor> ShardingCore::GatherFull(const at::Tensor& param,
                                                    const at::Tensor& staging,
                                                    absl::Status* first_failure) {
  const std::pair<ShardGroup*, size_t>* where = Locate(param);
  if (where == nullptr) {
    return absl::NotFoundError("GatherFull: the tensor is not a sharded parameter");
  }
  const ShardGroup& g = *where->first;
  const ShardGroup::Param& p = g.params[where->second];
  at::Tensor out;
  if (g.state == ShardGroup::State::kUnsharded) {  // every rank alike: no collective
    if (first_failure->ok()) {
      *first_failure = CatchTorch([&] {
        out = p.param.detach().to(at::kCPU, p.info.dtype, /*non_blocking=*/false, /*copy=*/true);
      });
    }
    return out;
  }
  const int world = mesh_.shard->size();
  const at::Tensor& shard = GatheredShard(g, p);
  const int64_t chunk = shard.numel();
  // [world * chunk] gathered, then this rank's chunk when it has to be brought to the device:
  // the all-gather reads that slot even when the copy into it failed.
  at::Tensor both = StagingView(staging, {(world + 1) * chunk}, shard.scalar_type());
  at::Tensor gathered = both.narrow(0, 0, world * chunk);
  at::Tensor input = shard;
  if (shard.device() != device()) {
    input = both.narrow(0, world * chunk, chunk);
    if (first_failure->ok()) *first_failure = CatchTorch([&] { input.copy_(shard); });
  }
  CT_ASSIGN_OR_RETURN(std::unique_ptr<Work> work, mesh_.shard->AllGather(input, gathered));
  CT_RETURN_IF_ERROR(work->Synchronize());
  if (!first_failure->ok()) return out;
  // A copy even on the CPU: the next parameter's gather overwrites `staging`.
  *first_failure = CatchTorch([&] {
    const bool flat = g.layout == ShardGroup::Layout::kFlat;
    out = gathered.narrow(0, flat ? p.offset : 0, p.numel)
              .view(p.info.global_shape)
              .to(at::kCPU, input.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
  });
  return out;
}

namespace sharding_core {
namespace {

// Walks the module tree: each parameter belongs to the innermost wrapped unit above it (the
// root group is `group` at the top). Units are numbered in pre-order.
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

void MoveTiedAcrossGroupsToRoot(int root_index, std::vector<Assignment>* assignments) {
  std::unordered_map<const c10::TensorImpl*, const Assignment*> first;
  std::unordered_map<const c10::TensorImpl*, bool> across;
  for (const Assignment& a : *assignments) {
    auto [it, inserted] = first.emplace(a.param.unsafeGetTensorImpl(), &a);
    if (inserted || it->second->group == a.group) continue;
    if (across.emplace(a.param.unsafeGetTensorImpl(), true).second) {
      CT_LOG_RANK0(INFO) << "FSDP: " << a.name << " is the same tensor as " << it->second->name
                         << " in another unit; it is sharded with the root group";
    }
  }
  for (Assignment& a : *assignments) {
    if (across.count(a.param.unsafeGetTensorImpl())) a.group = root_index;
  }
}

}  // namespace

absl::Status AssignGroups(TrainableModel& model, const WrapPolicy& policy,
                          std::vector<Unit*>* units, std::vector<Assignment>* assignments) {
  std::vector<std::string> classes;
  if (policy.kind == WrapPolicy::Kind::kTransformer) {
    CT_ASSIGN_OR_RETURN(classes, ResolveWrapClasses(model, policy.classes));
  }
  std::function<bool(const Unit&)> wrap = [&](const Unit& unit) {
    switch (policy.kind) {
      case WrapPolicy::Kind::kTransformer:
        return std::find(classes.begin(), classes.end(), unit.unit_class()) != classes.end();
      case WrapPolicy::Kind::kSize:
        return CountParameters(unit) >= policy.min_num_params;
      case WrapPolicy::Kind::kNone:
        break;
    }
    return false;
  };
  constexpr int kRootPending = -1;
  std::vector<Assignment> all;
  AssignParameters(model, "", kRootPending, wrap, units, &all);
  for (const Unit* unit : *units) {
    if (unit->hook() != nullptr) {
      return absl::FailedPreconditionError(absl::StrCat("FSDP: unit ", unit->unit_class(),
                                                        " already has a hook from another engine"));
    }
  }
  const int root_index = static_cast<int>(units->size());
  for (Assignment& a : all) {
    if (a.group == kRootPending) a.group = root_index;
  }
  MoveTiedAcrossGroupsToRoot(root_index, &all);
  std::unordered_map<const c10::TensorImpl*, bool> seen;
  for (Assignment& a : all) {
    if (seen.emplace(a.param.unsafeGetTensorImpl(), true).second) {
      assignments->push_back(std::move(a));
    }
  }
  return absl::OkStatus();
}

std::vector<std::unique_ptr<ShardGroup>> MakeGroups(TrainableModel& model,
                                                    const std::vector<Unit*>& units,
                                                    ShardGroup::Layout layout, bool units_reshard,
                                                    bool root_reshard) {
  std::vector<std::unique_ptr<ShardGroup>> groups;
  for (size_t gi = 0; gi <= units.size(); ++gi) {
    auto group = std::make_unique<ShardGroup>();
    group->layout = layout;
    group->is_root = gi == units.size();
    group->unit = group->is_root ? static_cast<const Unit*>(&model) : units[gi];
    group->unit_class = group->unit->unit_class();
    group->reshard_after_forward = group->is_root ? root_reshard : units_reshard;
    groups.push_back(std::move(group));
  }
  return groups;
}

absl::StatusOr<at::ScalarType> GroupDtype(const ShardGroup& group,
                                          std::optional<at::ScalarType> param_dtype) {
  std::vector<at::ScalarType> dtypes;
  for (const auto& p : group.params) dtypes.push_back(p.info.dtype);
  std::sort(dtypes.begin(), dtypes.end());
  dtypes.erase(std::unique(dtypes.begin(), dtypes.end()), dtypes.end());
  if (!param_dtype && dtypes.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat("FSDP: unit ", group.unit_class,
                                                   " mixes parameter dtypes; set param_dtype "
                                                   "so the group gathers in one dtype"));
  }
  return param_dtype.value_or(dtypes.empty() ? at::kFloat : dtypes.front());
}

absl::Status BroadcastFromRankZero(const ShardMesh& mesh, at::Tensor& t) {
  if (mesh.replicate != nullptr) {
    CT_ASSIGN_OR_RETURN(std::unique_ptr<Work> work, mesh.replicate->Broadcast(t, 0));
    CT_RETURN_IF_ERROR(work->Synchronize());
  }
  CT_ASSIGN_OR_RETURN(std::unique_ptr<Work> work, mesh.shard->Broadcast(t, 0));
  return work->Synchronize();
}

absl::StatusOr<std::vector<int32_t>> RankZeroDeferred(const ShardMesh& mesh, c10::Device device,
                                                      const std::vector<Assignment>& assignments,
                                                      bool sync) {
  std::vector<int32_t> out(assignments.size(), 0);
  if (!sync || assignments.empty()) return out;
  CT_RETURN_IF_ERROR(CatchTorch([&]() -> absl::Status {
    at::Tensor flags = at::empty({static_cast<int64_t>(assignments.size())}, at::kInt);
    for (size_t i = 0; i < assignments.size(); ++i) {
      flags[i] = IsDeferred(assignments[i].param) ? 1 : 0;
    }
    flags = flags.to(device);
    CT_RETURN_IF_ERROR(BroadcastFromRankZero(mesh, flags));
    flags = flags.cpu();
    for (size_t i = 0; i < assignments.size(); ++i) out[i] = flags[i].item<int32_t>();
    return absl::OkStatus();
  }));
  return out;
}

absl::Status PlaceBuffers(TrainableModel& model, const ShardMesh& mesh, c10::Device device,
                          bool sync) {
  for (auto& buffer : model.buffers(/*recurse=*/true)) {
    CT_RETURN_IF_ERROR(CatchTorch([&]() -> absl::Status {
      buffer.set_data(buffer.to(device));
      if (sync && mesh.world_size() > 1) {
        at::Tensor data = buffer.detach();
        CT_RETURN_IF_ERROR(BroadcastFromRankZero(mesh, data));
      }
      return absl::OkStatus();
    }));
  }
  return absl::OkStatus();
}

absl::StatusOr<c10::Device> ResolveDevice(const ShardMesh& mesh, std::optional<c10::Device> asked,
                                          const char* who) {
  if (mesh.shard == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": ShardMesh.shard (the communicator) is null"));
  }
  // A shard group of one rank (NO_SHARD) has no device of its own: the replicas' communicator
  // then names it (with processes sharing a GPU, NO_SHARD resolved to the CPU before).
  std::optional<c10::Device> comm_device = mesh.shard->device();
  if (!comm_device && mesh.replicate != nullptr) comm_device = mesh.replicate->device();
  const c10::Device device = asked.value_or(comm_device.value_or(c10::Device(c10::kCPU)));
  for (const auto& comm : {mesh.shard, mesh.replicate}) {
    if (comm == nullptr || !comm->device() || *comm->device() == device) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": options.device is ", device.str(), " but the ", comm->backend(),
        " communicator serves ", comm->device()->str(),
        ": leave device unset (it follows the communicator) or set it to ", comm->device()->str()));
  }
  return device;
}

}  // namespace sharding_core
}  // namespace cpptrain
