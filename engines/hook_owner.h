// How a gradient hook reaches the object that installed it. The hooks sit on a parameter's
// gradient accumulator, which belongs to the model and so outlives the engine that installed
// them (a program may train one model with two Trainers in turn). The owner keeps a HookOwner
// as its last member; when the owner goes, the hooks left behind find nothing and do nothing.
//
//   HookOwner<Reducer> hooks{this};                        // the owner's last member
//   accumulators_ = InstallGradientHooks<Reducer, &Reducer::OnGradient>(params, hooks.handle());
//   ... after each accumulation into params[i].grad, while the owner lives: OnGradient(i)
#ifndef CPPTRAIN_ENGINES_HOOK_OWNER_H_
#define CPPTRAIN_ENGINES_HOOK_OWNER_H_

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <atomic>
#include <memory>
#include <vector>

namespace cpptrain {

template <typename T>
class HookOwner {
 public:
  using Handle = std::shared_ptr<const std::atomic<T*>>;

  explicit HookOwner(T* owner) : cell_(std::make_shared<std::atomic<T*>>(owner)) {}
  ~HookOwner() { cell_->store(nullptr); }
  HookOwner(const HookOwner&) = delete;
  HookOwner& operator=(const HookOwner&) = delete;

  Handle handle() const { return cell_; }

 private:
  std::shared_ptr<std::atomic<T*>> cell_;
};

namespace internal {

template <typename T, void (T::*OnGradient)(int)>
class OwnedGradientHook : public torch::autograd::FunctionPostHook {
 public:
  OwnedGradientHook(typename HookOwner<T>::Handle owner, int index)
      : owner_(std::move(owner)), index_(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    if (T* owner = owner_->load()) (owner->*OnGradient)(index_);
    return outputs;
  }

 private:
  typename HookOwner<T>::Handle owner_;
  int index_;
};

}  // namespace internal

// A post-hook on each parameter's current gradient accumulator that calls
// (owner->*OnGradient)(i) for params[i] while the owner lives. The accumulators returned keep
// the hooks; a parameter given another dtype or device by set_data gets a new accumulator
// without them (install again).
template <typename T, void (T::*OnGradient)(int)>
std::vector<std::shared_ptr<torch::autograd::Node>> InstallGradientHooks(
    const std::vector<at::Tensor>& params, typename HookOwner<T>::Handle owner) {
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;
  for (size_t i = 0; i < params.size(); ++i) {
    std::shared_ptr<torch::autograd::Node> acc = torch::autograd::impl::grad_accumulator(params[i]);
    acc->add_post_hook(
        std::make_unique<internal::OwnedGradientHook<T, OnGradient>>(owner, static_cast<int>(i)));
    accumulators.push_back(std::move(acc));
  }
  return accumulators;
}

// Drops `accumulators` (the last references: they go, and their hooks with them), so the next
// InstallGradientHooks makes new ones on the current stream; unless another holds one (a graph
// of an unfinished backward), then returns false and drops nothing.
inline bool ReleaseAccumulators(std::vector<std::shared_ptr<torch::autograd::Node>>& accumulators) {
  for (const auto& accumulator : accumulators) {
    if (accumulator.use_count() > 1) return false;
  }
  accumulators.clear();
  return true;
}

}  // namespace cpptrain

#endif  // CPPTRAIN_ENGINES_HOOK_OWNER_H_
