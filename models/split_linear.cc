#include "models/split_linear.h"

#include <atomic>
#include <numeric>
#include <utility>

#include <torch/csrc/autograd/custom_function.h>

#include "base/torch_compat.h"

namespace cpptrain {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Block i of `tensors` (weights or biases): rows [sum(sizes[:i]), + sizes[i]) of the one stacked
// tensor, or tensors[i] whole when each block has its own.
at::Tensor Block(const variable_list& tensors, const std::vector<int64_t>& sizes, size_t i) {
  if (tensors.size() == sizes.size()) return tensors[i];
  const int64_t offset = std::accumulate(sizes.begin(), sizes.begin() + i, int64_t{0});
  return tensors[0].narrow(0, offset, sizes[i]);
}

std::atomic<int64_t> stacked_input_gradients{0};

// Whether `t` is laid out as the columns [first, first + t.size(-1)) of a contiguous
// [..., pitch] tensor would be.
bool ColumnsOfPitch(const at::Tensor& t, int64_t pitch) {
  int64_t expected = 1;
  for (int64_t d = t.dim() - 1; d >= 0; --d) {
    if (t.size(d) > 1 && t.stride(d) != expected) return false;
    expected *= d == t.dim() - 1 ? pitch : t.size(d);
  }
  return true;
}

// The blocks' output gradients as one [rows, sum(sizes)] matrix when they lie side by side in
// one buffer of `dtype` (block i + 1's columns right after block i's, every row at the pitch of
// the whole: the fused SwiGLU backward writes dgate and dup so, QkvNormRope's dq, dk and dv),
// else undefined.
at::Tensor SideBySide(const variable_list& grads, const std::vector<int64_t>& sizes,
                      at::ScalarType dtype) {
  const int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  const at::Tensor& first = grads[0];
  if (sizes.size() < 2 || !first.defined() || first.dim() < 1 || first.numel() == 0) return {};
  for (size_t i = 0; i < grads.size(); ++i) {
    const at::Tensor& g = grads[i];
    if (!g.defined() || g.scalar_type() != dtype || !g.is_alias_of(first) ||
        g.dim() != first.dim() || g.size(-1) != sizes[i] ||
        g.sizes().slice(0, g.dim() - 1) != first.sizes().slice(0, first.dim() - 1) ||
        !ColumnsOfPitch(g, total) ||
        (i > 0 && g.storage_offset() != grads[i - 1].storage_offset() + sizes[i - 1])) {
      return {};
    }
  }
  return first.as_strided({first.numel() / sizes[0], total}, {total, 1}, first.storage_offset());
}

// The blocks' weights as one [sum(sizes), in] matrix: the stacked weight itself, or per-block
// weights that are consecutive rows of one buffer (as the local and DDP engines' bf16 working
// copies of DecoderLM's q/k/v and gate/up are); else undefined.
at::Tensor StackedWeight(const variable_list& w) {
  if (w.size() == 1) return w[0];
  int64_t rows = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    if (!w[i].is_contiguous() || !w[i].is_alias_of(w[0]) || w[i].size(1) != w[0].size(1) ||
        (i > 0 && w[i].storage_offset() != w[i - 1].storage_offset() + w[i - 1].numel())) {
      return {};
    }
    rows += w[i].size(0);
  }
  return w[0].as_strided({rows, w[0].size(1)}, {w[0].size(1), 1}, w[0].storage_offset());
}

// x's gradient as one matmul of the side-by-side output gradients with the stacked weight, or
// undefined where either is not laid out so (then each block adds its own matmul).
at::Tensor StackedInputGradient(const at::Tensor& x, const variable_list& w,
                                const std::vector<int64_t>& sizes, const variable_list& grads) {
  const at::Tensor dy = SideBySide(grads, sizes, x.scalar_type());
  const at::Tensor weight = dy.defined() ? StackedWeight(w) : at::Tensor();
  if (!weight.defined() || weight.scalar_type() != dy.scalar_type()) return {};
  stacked_input_gradients.fetch_add(1, std::memory_order_relaxed);
  return at::mm(dy, weight);
}

// Fills block i's rows of dw and db (those defined) from its output's gradient dy_i: dw_i =
// dy_i^T x, db_i = the sum of dy_i's rows; a block whose output got no gradient gets zeros.
// Returns x's gradient when need_x (else undefined): sum_i dy_i w_i, one matmul where the
// gradients lie side by side (StackedInputGradient), else accumulated block by block (addmm).
at::Tensor BlockGradients(const at::Tensor& x, const variable_list& w,
                          const std::vector<int64_t>& sizes, const variable_list& grads,
                          bool need_x, const variable_list& dw, const variable_list& db) {
  const at::Tensor x2 = x.reshape({-1, x.size(-1)});
  at::Tensor dx = need_x ? StackedInputGradient(x, w, sizes, grads) : at::Tensor();
  const bool stacked = dx.defined();
  for (size_t i = 0; i < sizes.size(); ++i) {
    auto rows_of = [&](const variable_list& t) {  // block i's rows of dw or db, if asked for
      return t[t.size() == sizes.size() ? i : 0].defined() ? Block(t, sizes, i) : at::Tensor();
    };
    at::Tensor dw_i = rows_of(dw), db_i = rows_of(db);
    if (!grads[i].defined()) {
      if (dw_i.defined()) dw_i.zero_();
      if (db_i.defined()) db_i.zero_();
      continue;
    }
    const at::Tensor dy = grads[i].reshape({-1, sizes[i]}).to(x.scalar_type());
    if (need_x && !stacked) {
      const at::Tensor w_i = Block(w, sizes, i);
      dx = dx.defined() ? dx.addmm_(dy, w_i) : at::mm(dy, w_i);
    }
    if (dw_i.defined()) at::mm_out(dw_i, dy.t(), x2);
    if (db_i.defined()) at::sum_out(db_i, dy, {0});
  }
  if (need_x && !dx.defined()) dx = at::zeros_like(x2);
  return dx.defined() ? dx.view(x.sizes()) : dx;
}

// Inputs: x, the weights (one stacked, or one per block), and as many biases or none (an empty
// list: LibTorch 1.13's Function refuses undefined tensor inputs, so "no bias" is no entry).
class SplitLinearFunction : public torch::autograd::Function<SplitLinearFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, at::TensorList weights,
                               at::TensorList biases, std::vector<int64_t> sizes) {
    const bool has_bias = !biases.empty();
    variable_list saved = {AutocastComputeCopy(x)};
    variable_list bias_copies;
    for (size_t i = 0; i < weights.size(); ++i) {
      saved.push_back(AutocastComputeCopy(weights[i]));
      if (has_bias) bias_copies.push_back(AutocastComputeCopy(biases[i]));
    }
    const variable_list w(saved.begin() + 1, saved.end());
    variable_list out;
    for (size_t i = 0; i < sizes.size(); ++i) {
      out.push_back(at::linear(saved[0], Block(w, sizes, i),
                               has_bias ? Block(bias_copies, sizes, i) : at::Tensor()));
    }
    ctx->save_for_backward(saved);
    ctx->saved_data["sizes"] = std::move(sizes);
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["weight_dtype"] = static_cast<int64_t>(weights[0].scalar_type());
    if (has_bias) ctx->saved_data["bias_dtype"] = static_cast<int64_t>(biases[0].scalar_type());
    ctx->saved_data["has_bias"] = has_bias;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const variable_list w(saved.begin() + 1, saved.end());
    const size_t n = w.size();
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    // The gradients of the weights and biases, in the inputs' order (undefined: not asked).
    variable_list dw(n), db(n);
    for (size_t j = 0; j < n; ++j) {
      if (ctx->needs_input_grad(1 + j)) dw[j] = at::empty(w[j].sizes(), w[j].options());
      if (has_bias && ctx->needs_input_grad(1 + n + j)) {
        db[j] = at::empty({w[j].size(0)}, w[j].options());
      }
    }
    const at::Tensor dx = BlockGradients(saved[0], w, ctx->saved_data["sizes"].toIntVector(),
                                         grads, ctx->needs_input_grad(0), dw, db);
    auto in = [&](const at::Tensor& g, const char* dtype_key) {
      return g.defined() ? g.to(static_cast<at::ScalarType>(ctx->saved_data[dtype_key].toInt()))
                         : g;
    };
    variable_list result = {in(dx, "x_dtype")};
    for (const at::Tensor& g : dw) result.push_back(in(g, "weight_dtype"));
    if (has_bias) {
      for (const at::Tensor& g : db) result.push_back(in(g, "bias_dtype"));
    }
    result.resize(result.size() + 1);  // sizes
    return result;
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
  std::vector<at::Tensor> biases;
  if (bias.defined()) biases.push_back(bias);
  return SplitLinearFunction::apply(x, at::TensorList(weight), at::TensorList(biases),
                                    std::move(sizes));
}

std::vector<at::Tensor> SplitLinear(const at::Tensor& x, const std::vector<at::Tensor>& weights,
                                    const std::vector<at::Tensor>& biases) {
  TORCH_CHECK(!weights.empty(), "SplitLinear: no weights");
  TORCH_CHECK(biases.empty() || biases.size() == weights.size(), "SplitLinear: ", biases.size(),
              " biases for ", weights.size(), " weights (give one per weight, or none)");
  std::vector<int64_t> sizes;
  for (size_t i = 0; i < weights.size(); ++i) {
    TORCH_CHECK(weights[i].dim() == 2 && weights[i].size(1) == x.size(-1), "SplitLinear: weight ",
                i, " ", weights[i].sizes(), " does not map x's last dimension ", x.size(-1));
    TORCH_CHECK(biases.empty() || (biases[i].defined() && biases[i].size(0) == weights[i].size(0)),
                "SplitLinear: bias ", i, " does not match weight ", i, " ", weights[i].sizes());
    sizes.push_back(weights[i].size(0));
  }
  return SplitLinearFunction::apply(x, at::TensorList(weights), at::TensorList(biases),
                                    std::move(sizes));
}

int64_t SplitLinearStackedInputGradients() {
  return stacked_input_gradients.load(std::memory_order_relaxed);
}

}  // namespace cpptrain
