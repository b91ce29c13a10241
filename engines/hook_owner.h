// How a gradient hook reaches the object that installed it. The hooks sit on a parameter's
// gradient accumulator, which belongs to the model and so outlives the engine that installed
// them (a program may train one model with two Trainers in turn). The owner keeps a HookOwner
// as its last member; when the owner goes, the hooks left behind find nothing and do nothing.
//
//   HookOwner<Reducer> hooks{this};                        // the owner's last member
//   accumulator->add_post_hook(std::make_unique<MyHook>(hooks.handle(), i));
//   ... in the hook:  if (Reducer* r = handle->load()) r->OnGradient(i);
#ifndef CPPTRAIN_ENGINES_HOOK_OWNER_H_
#define CPPTRAIN_ENGINES_HOOK_OWNER_H_

#include <atomic>
#include <memory>

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

}  // namespace cpptrain

#endif  // CPPTRAIN_ENGINES_HOOK_OWNER_H_
