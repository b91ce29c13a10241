#include "kernels/fused_ops.h"

#include <limits>
#include <vector>

#include "base/torch_compat.h"
#include "kernels/launchers.h"

#if CPPTRAIN_HAS_CUDA_KERNELS
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/autograd.h>
#endif

namespace cpptrain {
namespace kernels {

at::Tensor RmsNormReference(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const at::Tensor x32 = x.to(at::kFloat);
  const at::Tensor normed = x32 * at::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * normed.to(x.scalar_type());
}

at::Tensor SwiGluReference(const at::Tensor& gate, const at::Tensor& up) {
  return at::silu(gate) * up;
}

at::Tensor GeGluReference(const at::Tensor& gate, const at::Tensor& up) {
  return at::gelu(gate, "tanh") * up;
}

at::Tensor Gated(const at::Tensor& gate, const at::Tensor& up, bool gelu_tanh, bool fused) {
  return gelu_tanh ? GeGlu(gate, up, fused) : SwiGlu(gate, up, fused);
}

GatedGradients GatedBackwardRecomputingReference(const at::Tensor& gate, const at::Tensor& up,
                                                 const at::Tensor& dout, bool gelu_tanh) {
  // The backward autograd runs for act(gate) * up: mul's gradients, then the activation's.
  const at::Tensor act = gelu_tanh ? at::gelu(gate, "tanh") : at::silu(gate);
  const at::Tensor dact = dout * up;
  return {gelu_tanh ? at::gelu_backward(dact, gate, "tanh") : at::silu_backward(dact, gate),
          dout * act, act * up};
}

at::Tensor SoftcapSoftmaxReference(const at::Tensor& scores, double scale, double softcap,
                                   int64_t window) {
  at::Tensor z = scores * scale;
  if (softcap > 0) z = at::tanh(z / softcap) * softcap;
  TORCH_CHECK(scores.dim() >= 2 && scores.size(-1) == scores.size(-2),
              "SoftcapSoftmax takes square [..., T, T] scores (causal self-attention, query t "
              "in row t), got ", scores.sizes());
  const at::Tensor allowed = SlidingWindowMask(scores.size(-1), window, scores.device());
  z = z.masked_fill(allowed.logical_not(), -std::numeric_limits<double>::infinity());
  return at::softmax(z, -1, at::kFloat).to(scores.scalar_type());
}

at::Tensor ApplyRotaryReference(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  const at::Tensor rotated = at::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1);
  return x * cos.to(x.scalar_type()) + rotated * sin.to(x.scalar_type());
}

at::Tensor QkNormRopeReference(const at::Tensor& x, const at::Tensor& weight, double eps,
                               const at::Tensor& cos, const at::Tensor& sin,
                               at::ScalarType out_dtype) {
  const at::Tensor normed = weight.defined() ? RmsNormReference(x, weight, eps) : x;
  return ApplyRotaryReference(normed.transpose(1, 2), cos, sin).to(out_dtype);
}

#if CPPTRAIN_HAS_CUDA_KERNELS

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool Supported(at::ScalarType type) { return type == at::kFloat || type == at::kBFloat16; }

ElementType TypeOf(at::ScalarType type) {
  return type == at::kFloat ? ElementType::kFloat32 : ElementType::kBfloat16;
}

void* Stream() { return at::cuda::getCurrentCUDAStream().stream(); }

void Check(const char* error, const char* kernel) {
  TORCH_CHECK(error == nullptr, kernel, " failed: ", error);
}

// Scratch for a norm backward's partial weight gradients, from the caching allocator on the
// current stream (freed back to it when the launcher's work there is done).
at::Tensor NormWorkspace(int64_t rows, int64_t cols, const at::Tensor& like) {
  return at::empty({NormBackwardWorkspaceFloats(rows, cols)}, like.options().dtype(at::kFloat));
}

class RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            double eps, int64_t out_dtype) {
    const c10::cuda::CUDAGuard guard(x.device());
    const int64_t cols = x.size(-1);
    const at::Tensor x2 = x.contiguous().view({-1, cols});
    const at::Tensor w = weight.contiguous();
    at::Tensor y = at::empty(x2.sizes(), x.options().dtype(at::ScalarType(out_dtype)));
    at::Tensor rstd = at::empty({x2.size(0)}, x.options().dtype(at::kFloat));
    Check(LaunchRmsNormForward(x2.size(0), cols, x2.data_ptr(), TypeOf(x.scalar_type()),
                               w.data_ptr(), TypeOf(w.scalar_type()), eps, y.data_ptr(),
                               TypeOf(y.scalar_type()), rstd.data_ptr<float>(), Stream()),
          "RMSNorm forward");
    ctx->save_for_backward({x2, w, rstd});
    ctx->saved_data["shape"] = x.sizes().vec();
    return y.view(x.sizes());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return RmsNormBackward(ctx, grads[0], at::Tensor());
  }

  // dx and dweight from dy, and dresidual (x's shape and dtype, or undefined) added into dx.
  static variable_list RmsNormBackward(AutogradContext* ctx, const at::Tensor& dy_in,
                                       const at::Tensor& dresidual) {
    const std::vector<at::Tensor> saved = ctx->get_saved_variables();
    const at::Tensor &x2 = saved[0], &w = saved[1], &rstd = saved[2];
    const c10::cuda::CUDAGuard guard(x2.device());
    const at::Tensor dy = dy_in.contiguous();
    const at::Tensor dr = dresidual.defined() ? dresidual.contiguous() : at::Tensor();
    at::Tensor dx = at::empty_like(x2);
    at::Tensor dw = at::empty({x2.size(1)}, x2.options().dtype(at::kFloat));
    at::Tensor workspace = NormWorkspace(x2.size(0), x2.size(1), x2);
    Check(LaunchRmsNormBackward(x2.size(0), x2.size(1), dy.data_ptr(), TypeOf(dy.scalar_type()),
                                x2.data_ptr(), TypeOf(x2.scalar_type()), w.data_ptr(),
                                TypeOf(w.scalar_type()), rstd.data_ptr<float>(),
                                dr.defined() ? dr.data_ptr() : nullptr, dx.data_ptr(),
                                dw.data_ptr<float>(), workspace.data_ptr<float>(),
                                workspace.numel(), Stream()),
          "RMSNorm backward");
    return {dx.view(ctx->saved_data["shape"].toIntVector()), dw.to(w.scalar_type()), at::Tensor(),
            at::Tensor()};
  }
};

// RMSNorm that also returns x (as a view): {y, x}. Both outputs' gradients reach this one
// backward, which adds x's into the norm's dx inside the kernel, where autograd would otherwise
// add the two gradients of x (the norm's and the residual add's) in a pass of its own.
class RmsNormAndResidualFunction
    : public torch::autograd::Function<RmsNormAndResidualFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x,
                               const at::Tensor& weight, double eps, int64_t out_dtype) {
    ctx->set_materialize_grads(false);  // an output nobody used sends no zero-filled gradient
    return {RmsNormFunction::forward(ctx, x, weight, eps, out_dtype), x};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor& dy = grads[0];
    const at::Tensor& dresidual = grads[1];
    if (!dy.defined()) {  // only x itself was used: its gradient passes through
      return {dresidual, at::Tensor(), at::Tensor(), at::Tensor()};
    }
    const at::ScalarType x_type = ctx->get_saved_variables()[0].scalar_type();
    const bool fusable = dresidual.defined() && dresidual.scalar_type() == x_type;
    variable_list out =
        RmsNormFunction::RmsNormBackward(ctx, dy, fusable ? dresidual : at::Tensor());
    if (dresidual.defined() && !fusable) out[0] = out[0] + dresidual;
    return out;
  }
};

// The gated backward kernel over contiguous g, u and dout of one dtype: dgate and dup side by
// side in one [rows, 2 * cols] buffer, returned as its two [rows, cols] halves, so the gate/up
// projection's backward computes its input's gradient as one matmul (models/split_linear.cc).
// A non-null `product` (it may be dout's data) also gets act(g) * u again.
std::pair<at::Tensor, at::Tensor> GatedBackwardSideBySide(const at::Tensor& g,
                                                          const at::Tensor& u,
                                                          const at::Tensor& dout, void* product,
                                                          bool gelu_tanh) {
  const int64_t cols = g.dim() > 0 ? g.size(-1) : 1;
  const at::Tensor both = at::empty({cols > 0 ? g.numel() / cols : 0, 2 * cols}, g.options());
  at::Tensor dgate = both.narrow(1, 0, cols), dup = both.narrow(1, cols, cols);
  Check(LaunchGatedBackward(g.numel(), cols, 2 * cols, g.data_ptr(), u.data_ptr(),
                            dout.data_ptr(), dgate.data_ptr(), dup.data_ptr(), product,
                            TypeOf(g.scalar_type()), gelu_tanh, Stream()),
        gelu_tanh ? "GeGLU backward" : "SwiGLU backward");
  return {dgate, dup};
}

// act(gate) * up: silu, or GELU's tanh approximation when gelu_tanh.
class GatedFunction : public torch::autograd::Function<GatedFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up,
                            bool gelu_tanh) {
    const c10::cuda::CUDAGuard guard(gate.device());
    const at::Tensor g = gate.contiguous(), u = up.contiguous();
    at::Tensor out = at::empty_like(g);
    Check(LaunchGatedForward(g.numel(), g.data_ptr(), u.data_ptr(), out.data_ptr(),
                             TypeOf(g.scalar_type()), gelu_tanh, Stream()),
          gelu_tanh ? "GeGLU forward" : "SwiGLU forward");
    ctx->save_for_backward({g, u});
    ctx->saved_data["gelu_tanh"] = gelu_tanh;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const std::vector<at::Tensor> saved = ctx->get_saved_variables();
    const at::Tensor &g = saved[0], &u = saved[1];
    const bool gelu_tanh = ctx->saved_data["gelu_tanh"].toBool();
    const c10::cuda::CUDAGuard guard(g.device());
    const at::Tensor dout = grads[0].to(g.scalar_type()).contiguous();
    const auto [dgate, dup] = GatedBackwardSideBySide(g, u, dout, nullptr, gelu_tanh);
    return {dgate.view(g.sizes()), dup.view(u.sizes()), at::Tensor()};
  }
};

// Whether the gated kernels take these inputs (CUDA, one supported dtype, equal shapes).
bool GatedApplies(const at::Tensor& gate, const at::Tensor& up) {
  return gate.is_cuda() && Supported(gate.scalar_type()) &&
         gate.scalar_type() == up.scalar_type() && gate.sizes() == up.sizes() &&
         gate.device() == up.device();
}

class SoftcapSoftmaxFunction : public torch::autograd::Function<SoftcapSoftmaxFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& scores, double scale,
                            double softcap, int64_t window) {
    const c10::cuda::CUDAGuard guard(scores.device());
    at::Tensor probs = at::empty_like(scores);
    const int64_t keys = scores.size(-1);
    Check(LaunchSoftcapSoftmaxForward(scores.numel() / keys, keys, scores.size(-2),
                                      scores.data_ptr(), probs.data_ptr(),
                                      TypeOf(scores.scalar_type()), static_cast<float>(scale),
                                      static_cast<float>(softcap), window, Stream()),
          "soft-capped softmax forward");
    ctx->save_for_backward({scores, probs});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["softcap"] = softcap;
    ctx->saved_data["window"] = window;
    return probs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const std::vector<at::Tensor> saved = ctx->get_saved_variables();
    const at::Tensor &scores = saved[0], &probs = saved[1];
    const c10::cuda::CUDAGuard guard(scores.device());
    const at::Tensor dprobs = grads[0].to(scores.scalar_type()).contiguous();
    at::Tensor dscores = at::empty_like(scores);
    const int64_t keys = scores.size(-1);
    Check(LaunchSoftcapSoftmaxBackward(
              scores.numel() / keys, keys, scores.size(-2), scores.data_ptr(), probs.data_ptr(),
              dprobs.data_ptr(), dscores.data_ptr(), TypeOf(scores.scalar_type()),
              static_cast<float>(ctx->saved_data["scale"].toDouble()),
              static_cast<float>(ctx->saved_data["softcap"].toDouble()),
              ctx->saved_data["window"].toInt(), Stream()),
          "soft-capped softmax backward");
    return {dscores, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

class ResidualAddFunction : public torch::autograd::Function<ResidualAddFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& delta) {
    const c10::cuda::CUDAGuard guard(x.device());
    const at::Tensor xc = x.contiguous(), dc = delta.contiguous();
    at::Tensor out = at::empty_like(xc);
    Check(LaunchResidualAdd(xc.numel(), xc.data_ptr(), TypeOf(xc.scalar_type()), dc.data_ptr(),
                            TypeOf(dc.scalar_type()), out.data_ptr(), Stream()),
          "residual add");
    ctx->saved_data["delta_dtype"] = static_cast<int64_t>(delta.scalar_type());
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["delta_dtype"].toInt());
    return {grads[0], grads[0].to(dtype)};
  }
};

// What the QK-norm + rotary backward reads: x [B, T, H, D] contiguous, the norm's weight (empty:
// rotary only), the fp32 tables and the forward's rstd. Saved as five tensors in this order.
struct QkNormRopeSaved {
  at::Tensor x, weight, cos, sin, rstd;

  static QkNormRopeSaved From(const std::vector<at::Tensor>& saved, size_t first) {
    return {saved[first], saved[first + 1], saved[first + 2], saved[first + 3], saved[first + 4]};
  }
  std::vector<at::Tensor> List() const { return {x, weight, cos, sin, rstd}; }
};

// The kernel's output, a [B, H, T, D] tensor over the memory of [B, T, H, D] in out_dtype: SDPA's
// kernels write their output and the gradients of q and k in q's layout, so the output's
// transpose back to [B, T, H * D] for o_proj is a view, and neither the gradient arriving there
// nor the one arriving here is copied into another layout.
at::Tensor QkNormRopeForward(const at::Tensor& x, const at::Tensor& weight, double eps,
                             const at::Tensor& cos, const at::Tensor& sin, int64_t out_dtype,
                             QkNormRopeSaved& saved) {
  const at::Tensor xc = x.contiguous();
  const at::Tensor w = weight.numel() > 0 ? weight.contiguous() : at::Tensor();
  const at::Tensor c = cos.to(at::kFloat).contiguous(), s = sin.to(at::kFloat).contiguous();
  const int64_t b = x.size(0), t = x.size(1), h = x.size(2), d = x.size(3);
  at::Tensor out = at::empty_strided({b, h, t, d}, {t * h * d, d, h * d, 1},
                                     x.options().dtype(at::ScalarType(out_dtype)));
  at::Tensor rstd = at::empty({w.defined() ? b * t * h : 1}, x.options().dtype(at::kFloat));
  Check(LaunchQkNormRopeForward(b, t, h, d, xc.data_ptr(), TypeOf(x.scalar_type()),
                                w.defined() ? w.data_ptr() : nullptr,
                                w.defined() ? TypeOf(w.scalar_type()) : ElementType::kFloat32,
                                eps, c.data_ptr<float>(), s.data_ptr<float>(), out.data_ptr(),
                                TypeOf(out.scalar_type()), rstd.data_ptr<float>(), Stream()),
        "QK-norm + rotary forward");
  saved = {xc, w.defined() ? w : weight, c, s, rstd};
  return out;
}

// x's gradient, [B, T, H, D] in x's dtype, written at dx with consecutive tokens' rows
// dx_pitch values apart (H * D: contiguous; more: a block of columns of a wider buffer), from
// the output's gradient; returns the weight's gradient in its dtype (undefined without one).
at::Tensor QkNormRopeBackwardInto(const QkNormRopeSaved& saved, const at::Tensor& grad, void* dx,
                                  int64_t dx_pitch) {
  const at::Tensor& x = saved.x;
  const at::Tensor w = saved.weight.numel() > 0 ? saved.weight : at::Tensor();
  // In out's row order, [B, T, H, D] (a view where the gradient came back in q's layout).
  const at::Tensor dout = grad.transpose(1, 2).contiguous();
  at::Tensor dw = at::empty({x.size(3)}, x.options().dtype(at::kFloat));
  const int64_t rows = x.size(0) * x.size(1) * x.size(2);
  at::Tensor workspace = NormWorkspace(w.defined() ? rows : 0, x.size(3), x);
  Check(LaunchQkNormRopeBackward(x.size(0), x.size(1), x.size(2), x.size(3), dout.data_ptr(),
                                 TypeOf(dout.scalar_type()), x.data_ptr(),
                                 TypeOf(x.scalar_type()), w.defined() ? w.data_ptr() : nullptr,
                                 w.defined() ? TypeOf(w.scalar_type()) : ElementType::kFloat32,
                                 saved.cos.data_ptr<float>(), saved.sin.data_ptr<float>(),
                                 saved.rstd.data_ptr<float>(), dx, dx_pitch,
                                 dw.data_ptr<float>(), workspace.data_ptr<float>(),
                                 workspace.numel(), Stream()),
        "QK-norm + rotary backward");
  return w.defined() ? dw.to(w.scalar_type()) : at::Tensor();
}

class QkNormRopeFunction : public torch::autograd::Function<QkNormRopeFunction> {
 public:
  // An empty weight means no norm (rotary only).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            double eps, const at::Tensor& cos, const at::Tensor& sin,
                            int64_t out_dtype) {
    const c10::cuda::CUDAGuard guard(x.device());
    QkNormRopeSaved saved;
    at::Tensor out = QkNormRopeForward(x, weight, eps, cos, sin, out_dtype, saved);
    ctx->save_for_backward(saved.List());
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const QkNormRopeSaved saved = QkNormRopeSaved::From(ctx->get_saved_variables(), 0);
    const c10::cuda::CUDAGuard guard(saved.x.device());
    at::Tensor dx = at::empty(saved.x.sizes(), saved.x.options());
    const at::Tensor dw =
        QkNormRopeBackwardInto(saved, grads[0], dx.data_ptr(), saved.x.size(2) * saved.x.size(3));
    return {dx, dw, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// QK-norm + rotary of q and of k, and v passed through, so that one backward sees the three
// gradients and lays them side by side: columns [0, Hq D), [Hq D, (Hq + Hkv) D) and the rest of
// one [B, T, (Hq + 2 Hkv) D] buffer, as SplitLinear's one-matmul input gradient wants them.
class QkvNormRopeFunction : public torch::autograd::Function<QkvNormRopeFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const at::Tensor& q_weight,
                               const at::Tensor& k_weight, double eps, const at::Tensor& cos,
                               const at::Tensor& sin, int64_t out_dtype) {
    const c10::cuda::CUDAGuard guard(q.device());
    QkNormRopeSaved q_saved, k_saved;
    at::Tensor q_out = QkNormRopeForward(q, q_weight, eps, cos, sin, out_dtype, q_saved);
    at::Tensor k_out = QkNormRopeForward(k, k_weight, eps, cos, sin, out_dtype, k_saved);
    std::vector<at::Tensor> saved = q_saved.List();
    for (const at::Tensor& t : k_saved.List()) saved.push_back(t);
    ctx->save_for_backward(saved);
    return {q_out, k_out, v};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const std::vector<at::Tensor> saved = ctx->get_saved_variables();
    const QkNormRopeSaved q = QkNormRopeSaved::From(saved, 0), k = QkNormRopeSaved::From(saved, 5);
    const c10::cuda::CUDAGuard guard(q.x.device());
    const int64_t b = q.x.size(0), t = q.x.size(1), d = q.x.size(3);
    const int64_t q_cols = q.x.size(2) * d, kv_cols = k.x.size(2) * d;
    const int64_t pitch = q_cols + 2 * kv_cols;
    at::Tensor both = at::empty({b, t, pitch}, q.x.options());
    auto block = [&](int64_t first, int64_t cols) {  // columns [first, first + cols), [B, T, H, D]
      return both.as_strided({b, t, cols / d, d}, {t * pitch, pitch, d, 1}, first);
    };
    const at::Tensor dq = block(0, q_cols), dk = block(q_cols, kv_cols);
    const at::Tensor dv = block(q_cols + kv_cols, kv_cols).transpose(1, 2);  // v's shape
    const at::Tensor dq_weight = QkNormRopeBackwardInto(q, grads[0], dq.data_ptr(), pitch);
    const at::Tensor dk_weight = QkNormRopeBackwardInto(k, grads[1], dk.data_ptr(), pitch);
    dv.copy_(grads[2]);  // defined: autograd hands unused outputs' gradients in as zeros
    return {dq,           dk,           dv,           dq_weight,   dk_weight,
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool CudaKernelsBuilt() { return true; }

bool RmsNormApplies(const at::Tensor& x, const at::Tensor& weight, at::ScalarType out_dtype) {
  return x.is_cuda() && Supported(x.scalar_type()) && Supported(weight.scalar_type()) &&
         Supported(out_dtype) && x.size(-1) <= kMaxNormCols && weight.dim() == 1 &&
         weight.size(0) == x.size(-1) && weight.device() == x.device();
}

at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps,
                   at::ScalarType out_dtype, bool fused) {
  if (!fused || !RmsNormApplies(x, weight, out_dtype)) return RmsNormReference(x, weight, eps);
  return RmsNormFunction::apply(x, weight, eps, static_cast<int64_t>(out_dtype));
}

std::pair<at::Tensor, at::Tensor> RmsNormAndResidual(const at::Tensor& x,
                                                     const at::Tensor& weight, double eps,
                                                     at::ScalarType out_dtype, bool fused) {
  // Without a gradient to x there is nothing to add: the plain norm and x itself.
  if (!fused || !RmsNormApplies(x, weight, out_dtype) || !at::GradMode::is_enabled() ||
      !x.requires_grad()) {
    return {RmsNorm(x, weight, eps, out_dtype, fused), x};
  }
  const variable_list out =
      RmsNormAndResidualFunction::apply(x, weight, eps, static_cast<int64_t>(out_dtype));
  return {out[0], out[1]};
}

at::Tensor SwiGlu(const at::Tensor& gate, const at::Tensor& up, bool fused) {
  if (!fused || !GatedApplies(gate, up)) return SwiGluReference(gate, up);
  return GatedFunction::apply(gate, up, false);
}

at::Tensor GeGlu(const at::Tensor& gate, const at::Tensor& up, bool fused) {
  if (!fused || !GatedApplies(gate, up)) return GeGluReference(gate, up);
  return GatedFunction::apply(gate, up, true);
}

GatedGradients GatedBackwardRecomputing(const at::Tensor& gate, const at::Tensor& up,
                                        const at::Tensor& dout, bool gelu_tanh, bool fused) {
  if (!fused || !GatedApplies(gate, up) || gate.dim() != 2 || dout.sizes() != gate.sizes() ||
      dout.scalar_type() != gate.scalar_type() || dout.device() != gate.device() ||
      !gate.is_contiguous() || !up.is_contiguous() || !dout.is_contiguous()) {
    return GatedBackwardRecomputingReference(gate, up, dout, gelu_tanh);
  }
  const c10::cuda::CUDAGuard guard(gate.device());
  const auto [dgate, dup] = GatedBackwardSideBySide(gate, up, dout, dout.data_ptr(), gelu_tanh);
  return {dgate, dup, dout};
}

at::Tensor SoftcapSoftmax(const at::Tensor& scores, double scale, double softcap, int64_t window,
                          bool fused) {
  // The kernel puts query t at row t of each [T, T] block: other shapes go to the reference,
  // which refuses them.
  if (!fused || !scores.is_cuda() || scores.dim() != 4 || !Supported(scores.scalar_type()) ||
      !scores.is_contiguous() || scores.size(-1) != scores.size(-2)) {
    return SoftcapSoftmaxReference(scores, scale, softcap, window);
  }
  return SoftcapSoftmaxFunction::apply(scores, scale, softcap, window);
}

at::Tensor ResidualAdd(const at::Tensor& x, const at::Tensor& delta, bool fused) {
  if (!fused || !x.is_cuda() || !Supported(x.scalar_type()) || !Supported(delta.scalar_type()) ||
      x.sizes() != delta.sizes() || x.device() != delta.device() ||
      at::result_type(x, delta) != x.scalar_type()) {
    return x + delta;
  }
  return ResidualAddFunction::apply(x, delta);
}

// Whether the QK-norm + rotary kernels take x [B, T, H, D] with this weight and these tables.
bool QkNormRopeApplies(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& cos,
                       at::ScalarType out_dtype) {
  const bool weight_ok =
      !weight.defined() || (Supported(weight.scalar_type()) && weight.dim() == 1 &&
                            weight.size(0) == x.size(-1) && weight.device() == x.device());
  return x.is_cuda() && x.dim() == 4 && Supported(x.scalar_type()) && Supported(out_dtype) &&
         weight_ok && x.size(3) <= kMaxHeadDim && x.size(3) % 2 == 0 &&
         cos.size(0) == x.size(1) && cos.size(1) == x.size(3) && cos.device() == x.device();
}

// Autograd functions take defined tensors: no norm is an empty weight.
at::Tensor WeightOrEmpty(const at::Tensor& weight, const at::Tensor& x) {
  return weight.defined() ? weight : at::empty({0}, x.options().dtype(at::kFloat));
}

at::Tensor QkNormRope(const at::Tensor& x, const at::Tensor& weight, double eps,
                      const at::Tensor& cos, const at::Tensor& sin, at::ScalarType out_dtype,
                      bool fused) {
  if (!fused || !QkNormRopeApplies(x, weight, cos, out_dtype)) {
    return QkNormRopeReference(x, weight, eps, cos, sin, out_dtype);
  }
  return QkNormRopeFunction::apply(x, WeightOrEmpty(weight, x), eps, cos, sin,
                                   static_cast<int64_t>(out_dtype));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> QkvNormRope(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& q_weight,
    const at::Tensor& k_weight, double eps, const at::Tensor& cos, const at::Tensor& sin,
    at::ScalarType out_dtype, bool fused) {
  const bool together =
      fused && QkNormRopeApplies(q, q_weight, cos, out_dtype) &&
      QkNormRopeApplies(k, k_weight, cos, out_dtype) && at::GradMode::is_enabled() &&
      q.requires_grad() && k.requires_grad() && v.requires_grad() && v.dim() == 4 &&
      k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type() &&
      v.device() == q.device() && k.size(0) == q.size(0) && k.size(1) == q.size(1) &&
      k.size(3) == q.size(3) && v.sizes() == at::IntArrayRef({k.size(0), k.size(2), k.size(1),
                                                               k.size(3)});
  if (!together) {
    return {QkNormRope(q, q_weight, eps, cos, sin, out_dtype, fused),
            QkNormRope(k, k_weight, eps, cos, sin, out_dtype, fused), v};
  }
  const variable_list out = QkvNormRopeFunction::apply(
      q, k, v, WeightOrEmpty(q_weight, q), WeightOrEmpty(k_weight, k), eps, cos, sin,
      static_cast<int64_t>(out_dtype));
  return {out[0], out[1], out[2]};
}

at::Tensor CrossEntropyRowsInPlace(at::Tensor& logits, const at::Tensor& targets,
                                   int64_t ignore_index, bool write_grad, double softcap) {
  if (!logits.is_cuda() || logits.dim() != 2 || !logits.is_contiguous() ||
      !Supported(logits.scalar_type()) || targets.device() != logits.device() ||
      targets.scalar_type() != at::kLong || targets.numel() != logits.size(0)) {
    return at::Tensor();
  }
  const c10::cuda::CUDAGuard guard(logits.device());
  const at::Tensor t = targets.contiguous();
  at::Tensor loss = at::empty({logits.size(0)}, logits.options().dtype(at::kFloat));
  Check(LaunchCrossEntropyRows(logits.size(0), logits.size(1), logits.data_ptr(),
                               TypeOf(logits.scalar_type()), t.data_ptr<int64_t>(), ignore_index,
                               static_cast<float>(softcap), loss.data_ptr<float>(), write_grad,
                               Stream()),
        "cross-entropy rows");
  return loss;
}

at::Tensor ScaledCopy(const at::Tensor& x, const at::Tensor& scale, at::ScalarType out_dtype) {
  if (!x.is_cuda() || x.scalar_type() != at::kFloat || !x.is_contiguous() ||
      !Supported(out_dtype) || scale.numel() != 1 || scale.scalar_type() != at::kFloat ||
      scale.device() != x.device()) {
    return at::Tensor();
  }
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = at::empty(x.sizes(), x.options().dtype(out_dtype));
  Check(LaunchScaledCopy(x.numel(), x.data_ptr<float>(), scale.data_ptr<float>(), out.data_ptr(),
                         TypeOf(out_dtype), Stream()),
        "scaled copy");
  return out;
}

#else  // no CUDA kernels in this build

at::Tensor CrossEntropyRowsInPlace(at::Tensor& logits, const at::Tensor& targets,
                                   int64_t ignore_index, bool write_grad, double softcap) {
  return at::Tensor();
}

at::Tensor ScaledCopy(const at::Tensor& x, const at::Tensor& scale, at::ScalarType out_dtype) {
  return at::Tensor();
}

bool CudaKernelsBuilt() { return false; }

at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps,
                   at::ScalarType out_dtype, bool fused) {
  return RmsNormReference(x, weight, eps);
}

std::pair<at::Tensor, at::Tensor> RmsNormAndResidual(const at::Tensor& x,
                                                     const at::Tensor& weight, double eps,
                                                     at::ScalarType out_dtype, bool fused) {
  return {RmsNormReference(x, weight, eps), x};
}

at::Tensor SwiGlu(const at::Tensor& gate, const at::Tensor& up, bool fused) {
  return SwiGluReference(gate, up);
}

at::Tensor GeGlu(const at::Tensor& gate, const at::Tensor& up, bool fused) {
  return GeGluReference(gate, up);
}

GatedGradients GatedBackwardRecomputing(const at::Tensor& gate, const at::Tensor& up,
                                        const at::Tensor& dout, bool gelu_tanh, bool fused) {
  return GatedBackwardRecomputingReference(gate, up, dout, gelu_tanh);
}

at::Tensor SoftcapSoftmax(const at::Tensor& scores, double scale, double softcap, int64_t window,
                          bool fused) {
  return SoftcapSoftmaxReference(scores, scale, softcap, window);
}

at::Tensor ResidualAdd(const at::Tensor& x, const at::Tensor& delta, bool fused) {
  return x + delta;
}

at::Tensor QkNormRope(const at::Tensor& x, const at::Tensor& weight, double eps,
                      const at::Tensor& cos, const at::Tensor& sin, at::ScalarType out_dtype,
                      bool fused) {
  return QkNormRopeReference(x, weight, eps, cos, sin, out_dtype);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> QkvNormRope(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& q_weight,
    const at::Tensor& k_weight, double eps, const at::Tensor& cos, const at::Tensor& sin,
    at::ScalarType out_dtype, bool fused) {
  return {QkNormRopeReference(q, q_weight, eps, cos, sin, out_dtype),
          QkNormRopeReference(k, k_weight, eps, cos, sin, out_dtype), v};
}

#endif

}  // namespace kernels
}  // namespace cpptrain
