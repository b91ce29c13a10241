#include "models/gated_down.h"

#include <torch/csrc/autograd/custom_function.h>

#include "base/torch_compat.h"
#include "kernels/fused_ops.h"

namespace cpptrain {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Inputs: gate, up, weight, and a list of the bias or none (LibTorch 1.13's Function refuses
// undefined tensor inputs, so "no bias" is no entry).
class GatedDownFunction : public torch::autograd::Function<GatedDownFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up,
                            const at::Tensor& weight, at::TensorList bias, bool gelu_tanh,
                            bool fused) {
    const at::Tensor w = AutocastComputeCopy(weight);
    const at::Tensor b = bias.empty() ? at::Tensor() : AutocastComputeCopy(bias[0]);
    const at::Tensor product = kernels::Gated(gate, up, gelu_tanh, fused);
    const at::Tensor out = at::linear(AutocastComputeCopy(product), w, b);
    ctx->save_for_backward({gate, up, w});
    ctx->saved_data["gelu_tanh"] = gelu_tanh;
    ctx->saved_data["fused"] = fused;
    ctx->saved_data["weight_dtype"] = static_cast<int64_t>(weight.scalar_type());
    if (b.defined()) ctx->saved_data["bias_dtype"] = static_cast<int64_t>(bias[0].scalar_type());
    return out;
  }

  // The product's gradient dy w, then one pass for dgate, dup and the product again (written
  // over the product's gradient where the kernel runs), then w's gradient dy^T product.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &gate = saved[0], &up = saved[1], &w = saved[2];
    const int64_t cols = gate.size(-1);
    const at::Tensor dy = grads[0].reshape({-1, w.size(0)}).to(w.scalar_type());
    const at::Tensor dproduct = at::mm(dy, w).to(gate.scalar_type());
    const kernels::GatedGradients g = kernels::GatedBackwardRecomputing(
        gate.reshape({-1, cols}).contiguous(), up.reshape({-1, cols}).contiguous(), dproduct,
        ctx->saved_data["gelu_tanh"].toBool(), ctx->saved_data["fused"].toBool());
    auto as = [&](const at::Tensor& t, const char* dtype_key) {
      return t.to(static_cast<at::ScalarType>(ctx->saved_data[dtype_key].toInt()));
    };
    variable_list result = {g.dgate.view(gate.sizes()), g.dup.view(up.sizes()), at::Tensor()};
    if (ctx->needs_input_grad(2)) {
      result[2] = as(at::mm(dy.t(), g.product.to(w.scalar_type())), "weight_dtype");
    }
    if (ctx->saved_data.count("bias_dtype") != 0) {
      result.push_back(ctx->needs_input_grad(3) ? as(dy.sum(0), "bias_dtype") : at::Tensor());
    }
    result.resize(result.size() + 2);  // gelu_tanh, fused
    return result;
  }
};

}  // namespace

at::Tensor GatedDown(const at::Tensor& gate, const at::Tensor& up, const at::Tensor& weight,
                     const at::Tensor& bias, bool gelu_tanh, bool fused) {
  TORCH_CHECK(gate.sizes() == up.sizes() && gate.dim() >= 1, "GatedDown: gate ", gate.sizes(),
              " and up ", up.sizes(), " differ");
  TORCH_CHECK(weight.dim() == 2 && weight.size(1) == gate.size(-1), "GatedDown: weight ",
              weight.sizes(), " does not map the intermediate size ", gate.size(-1));
  TORCH_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0)),
              "GatedDown: bias ", bias.defined() ? bias.sizes() : at::IntArrayRef(),
              " does not have ", weight.size(0), " values");
  std::vector<at::Tensor> biases;
  if (bias.defined()) biases.push_back(bias);
  return GatedDownFunction::apply(gate, up, weight, at::TensorList(biases), gelu_tanh, fused);
}

}  // namespace cpptrain
