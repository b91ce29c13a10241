// A unit is a module whose forward passes through a hook point an engine can fill. Python
// wraps any module with forward hooks; torch::nn::Module has none, so models are built from
// Units instead (DESIGN.md, "Hooks in C++"). Wrap policies pick units by unit_class().
//
//   class DecoderLayer : public Unit {
//    public:
//     DecoderLayer() : Unit("DecoderLayer") { ... }
//     torch::Tensor Forward(torch::Tensor x) {
//       return Hooked(x, [&](const torch::Tensor& h) { return Body(h); });
//     }
//   };
//   layer->set_hook(&fsdp_hook);   // the engine gathers parameters around each forward
#ifndef CPPTRAIN_MODULE_UNIT_H_
#define CPPTRAIN_MODULE_UNIT_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>

#include <torch/nn/module.h>

namespace cpptrain {

class Unit;

// State that sharding attaches to a model (FullyShard's shards, groups and hooks), kept alive
// by the model so that a model sharded at load time carries its shards into any Trainer.
class ShardingAttachment {
 public:
  virtual ~ShardingAttachment() = default;
};

// What an engine does around a unit's forward. Both calls run on the caller's thread, in
// forward order; a hook may return a different tensor (for example one wrapped by a custom
// autograd function whose backward is the unit's post-backward point).
class UnitHook {
 public:
  virtual ~UnitHook() = default;
  virtual torch::Tensor PreForward(Unit& unit, torch::Tensor input) = 0;
  virtual torch::Tensor PostForward(Unit& unit, torch::Tensor output) = 0;
};

class Unit : public torch::nn::Module {
 public:
  explicit Unit(const std::string& unit_class) : torch::nn::Module(unit_class) {}

  // The class name wrap policies match (like transformer_layer_cls_to_wrap).
  const std::string& unit_class() const { return name(); }

  // Not owned; nullptr removes the hook.
  void set_hook(UnitHook* hook) { hook_ = hook; }
  UnitHook* hook() const { return hook_; }

  // Set by sharding on the root unit; null when the model is not sharded.
  void set_sharding(std::shared_ptr<ShardingAttachment> sharding) {
    sharding_ = std::move(sharding);
  }
  ShardingAttachment* sharding() const { return sharding_.get(); }

 protected:
  // Runs `body(input)` between the hook's PreForward and PostForward (directly without one).
  torch::Tensor Hooked(torch::Tensor input,
                       const std::function<torch::Tensor(const torch::Tensor&)>& body) {
    if (hook_ == nullptr) return body(input);
    torch::Tensor in = hook_->PreForward(*this, std::move(input));
    return hook_->PostForward(*this, body(in));
  }

 private:
  UnitHook* hook_ = nullptr;
  std::shared_ptr<ShardingAttachment> sharding_;
};

}  // namespace cpptrain

#endif  // CPPTRAIN_MODULE_UNIT_H_
