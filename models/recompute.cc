#include "models/recompute.h"

#include <optional>
#include <utility>

#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include "base/torch_compat.h"

namespace cpptrain {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

c10::DispatchKey AutocastKey(at::DeviceType type) {
  return type == at::kCPU ? c10::DispatchKey::AutocastCPU : c10::DispatchKey::AutocastCUDA;
}

// Autocast caches the low-precision copy of each fp32 leaf weight for its scope, whatever the
// grad mode. A copy made in the no-grad forward has no autograd history, and the recomputation
// must not reuse one, or weights would get no gradient when backward runs inside the scope.
class NoAutocastCache {
 public:
  NoAutocastCache() : previous_(at::autocast::is_autocast_cache_enabled()) {
    at::autocast::set_autocast_cache_enabled(false);
  }
  ~NoAutocastCache() { at::autocast::set_autocast_cache_enabled(previous_); }
  NoAutocastCache(const NoAutocastCache&) = delete;
  NoAutocastCache& operator=(const NoAutocastCache&) = delete;

 private:
  bool previous_;
};

// What the recomputation needs from the forward. Held by the autograd context as a capsule,
// the one IValue kind that takes an arbitrary C++ object.
struct RecomputeState : torch::CustomClassHolder {
  std::function<torch::Tensor(const torch::Tensor&)> body;
  bool input_requires_grad = false;
  at::DeviceType device_type = at::kCPU;
  bool autocast_enabled = false;
  at::ScalarType autocast_dtype = at::kFloat;
};

class RecomputeFunction : public torch::autograd::Function<RecomputeFunction> {
 public:
  // Autograd is off here (Function::apply), so the body keeps no activations.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& input,
                               c10::intrusive_ptr<RecomputeState> state) {
    ctx->save_for_backward({input});
    torch::Tensor output;
    {
      NoAutocastCache no_cache;
      output = state->body(input.detach());
    }
    ctx->saved_data["state"] = c10::IValue::make_capsule(std::move(state));
    return output;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto state = c10::static_intrusive_pointer_cast<RecomputeState>(
        ctx->saved_data["state"].toCapsule());
    const torch::Tensor input = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    torch::Tensor output;
    {
      // The autograd engine runs this with the thread state of the backward() call; bring
      // back the forward's autocast state.
      std::optional<AutocastGuard> autocast_on;
      std::optional<c10::impl::ExcludeDispatchKeyGuard> autocast_off;
      if (state->autocast_enabled) {
        autocast_on.emplace(state->device_type, state->autocast_dtype);
      } else {
        autocast_off.emplace(c10::DispatchKeySet(AutocastKey(state->device_type)));
      }
      NoAutocastCache no_cache;
      at::AutoGradMode grad_on(true);
      output = state->body(input);
    }
    torch::autograd::backward({output}, {grad_outputs[0]});
    torch::Tensor input_grad = state->input_requires_grad ? input.grad() : torch::Tensor();
    return {input_grad, torch::Tensor()};
  }
};

}  // namespace

torch::Tensor RecomputeInBackward(std::function<torch::Tensor(const torch::Tensor&)> body,
                                  const torch::Tensor& input) {
  if (!at::GradMode::is_enabled()) return body(input);
  auto state = c10::make_intrusive<RecomputeState>();
  state->body = std::move(body);
  state->input_requires_grad = input.requires_grad();
  state->device_type = input.device().type();
  state->autocast_enabled = AutocastEnabled(state->device_type);
  state->autocast_dtype = AutocastDtype(state->device_type);
  // A custom function's output joins the graph only through inputs that require grad. When
  // the input does not (frozen embeddings, raw features), a detached stand-in that does keeps
  // the body's parameters reachable; its gradient is dropped in backward.
  const torch::Tensor arg = input.requires_grad() ? input : input.detach().requires_grad_(true);
  return RecomputeFunction::apply(arg, std::move(state));
}

}  // namespace cpptrain
