#include "models/split_linear.h"

#include <numeric>
#include <utility>

#include <torch/csrc/autograd/custom_function.h>

#include "base/torch_compat.h"

namespace cpptrain {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What at::linear would compute in under autocast: the autocast dtype for floating tensors.
at::Tensor ComputeCopy(const at::Tensor& t) {
  if (!t.defined() || !t.is_floating_point()) return t;
  const at::DeviceType device = t.device().type();
  return AutocastEnabled(device) ? t.to(AutocastDtype(device)) : t;
}

class SplitLinearFunction : public torch::autograd::Function<SplitLinearFunction> {
 public:
  // `bias` is an empty placeholder when has_bias is false (LibTorch 1.13's Function refuses
  // undefined tensor inputs).
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                               const at::Tensor& bias, bool has_bias, std::vector<int64_t> sizes) {
    const at::Tensor xc = ComputeCopy(x), wc = ComputeCopy(weight);
    const at::Tensor bc = has_bias ? ComputeCopy(bias) : at::Tensor();
    variable_list out;
    int64_t offset = 0;
    for (const int64_t size : sizes) {
      out.push_back(at::linear(xc, wc.narrow(0, offset, size),
                               bc.defined() ? bc.narrow(0, offset, size) : at::Tensor()));
      offset += size;
    }
    ctx->save_for_backward({xc, wc});
    ctx->saved_data["sizes"] = std::move(sizes);
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["weight_dtype"] = static_cast<int64_t>(weight.scalar_type());
    ctx->saved_data["bias_dtype"] = static_cast<int64_t>(bias.scalar_type());
    ctx->saved_data["has_bias"] = has_bias;
    return out;
  }

  // Block i's gradient dy_i: dx = sum_i dy_i w_i (accumulated by addmm), dw_i = dy_i^T x and
  // db_i = sum of dy_i's rows, written into their rows of dw and db. A block whose output got no
  // gradient contributes zeros.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1];
    const std::vector<int64_t> sizes = ctx->saved_data["sizes"].toIntVector();
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    const bool need_x = ctx->needs_input_grad(0), need_w = ctx->needs_input_grad(1);
    const bool need_b = has_bias && ctx->needs_input_grad(2);
    const at::Tensor x2 = x.reshape({-1, x.size(-1)});
    at::Tensor dx;
    at::Tensor dw = need_w ? at::empty_like(w, at::MemoryFormat::Contiguous) : at::Tensor();
    at::Tensor db = need_b ? at::empty({w.size(0)}, w.options()) : at::Tensor();
    int64_t offset = 0;
    for (size_t i = 0; i < sizes.size(); offset += sizes[i], ++i) {
      at::Tensor dw_i = need_w ? dw.narrow(0, offset, sizes[i]) : at::Tensor();
      at::Tensor db_i = need_b ? db.narrow(0, offset, sizes[i]) : at::Tensor();
      if (!grads[i].defined()) {
        if (need_w) dw_i.zero_();
        if (need_b) db_i.zero_();
        continue;
      }
      const at::Tensor dy = grads[i].reshape({-1, sizes[i]}).to(x.scalar_type());
      const at::Tensor w_i = w.narrow(0, offset, sizes[i]);
      if (need_x) dx = dx.defined() ? dx.addmm_(dy, w_i) : at::mm(dy, w_i);
      if (need_w) at::mm_out(dw_i, dy.t(), x2);
      if (need_b) at::sum_out(db_i, dy, {0});
    }
    if (need_x && !dx.defined()) dx = at::zeros_like(x2);
    auto dtype = [&](const char* key) {
      return static_cast<at::ScalarType>(ctx->saved_data[key].toInt());
    };
    return {need_x ? dx.view(x.sizes()).to(dtype("x_dtype")) : at::Tensor(),
            need_w ? dw.to(dtype("weight_dtype")) : at::Tensor(),
            need_b ? db.to(dtype("bias_dtype")) : at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

std::vector<at::Tensor> SplitLinear(const at::Tensor& x, const at::Tensor& weight,
                                    const at::Tensor& bias, std::vector<int64_t> sizes) {
  const int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  TORCH_CHECK(weight.dim() == 2 && weight.size(0) == total && x.size(-1) == weight.size(1),
              "SplitLinear: weight ", weight.sizes(), " does not stack blocks of ", sizes,
              " rows over x's last dimension ", x.size(-1));
  TORCH_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == total), "SplitLinear: bias ",
              bias.defined() ? bias.sizes() : at::IntArrayRef(), " does not have ", total,
              " values");
  const at::Tensor placeholder = bias.defined() ? bias : at::empty({0}, weight.options());
  return SplitLinearFunction::apply(x, weight, placeholder, bias.defined(), std::move(sizes));
}

}  // namespace cpptrain
