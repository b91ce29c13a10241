#include "kernels/linear_cross_entropy.h"

#include <torch/autograd.h>
#include <torch/version.h>

#include "kernels/fused_ops.h"

#include <algorithm>
#include <vector>

namespace cpptrain {
namespace kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The default chunk: 4096 rows, fewer where a vocabulary over 2^18 would put more than 2^30
// logits in one chunk. On an H100 (2026-12-06), 4096 rows in place of the earlier 2^27 logits
// (883 rows at Qwen3-0.6B) made the whole step 3-6% faster at Qwen3-0.6B and Llama-3.2-1B,
// micro-batch 4: each chunk reads and writes the fp32 head gradient once.
constexpr int64_t kDefaultChunkRows = 4096;
constexpr int64_t kMaxChunkLogits = int64_t{1} << 30;

int64_t ChunkRows(int64_t requested, int64_t rows, int64_t vocab) {
  if (requested > 0) return requested;
  const int64_t budget = kMaxChunkLogits / std::max<int64_t>(vocab, 1);
  return std::max<int64_t>(1, std::min({rows, kDefaultChunkRows, budget}));
}

// dw += dlogits^T h, or dw = dlogits^T h for the first chunk (`first`: dw is uninitialized, and
// the fp32 accumulator is neither zeroed nor read, 2 x 4 bytes per weight element less). With
// 16-bit operands on CUDA (LibTorch 2.8 and later), cuBLAS adds the product into the fp32
// accumulator as it writes it (addmm's out_dtype form), so no 16-bit product of the whole
// weight's size is stored and then added: that add was 1.25 bytes moved per weight element per
// chunk (7.8 ms a step at Llama-3.2-1B's 128256 x 2048 head).
void AddWeightGradient(at::Tensor& dw, const at::Tensor& dlogits, const at::Tensor& h,
                       bool first) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 8)
  if (h.is_cuda() && h.scalar_type() != at::kFloat) {
    at::addmm_out(dw, dw, dlogits.t(), h, at::kFloat, /*beta=*/first ? 0 : 1);
    return;
  }
#endif
  if (!first) {
    dw.add_(at::mm(dlogits.t(), h));
  } else if (h.scalar_type() == at::kFloat) {
    at::mm_out(dw, dlogits.t(), h);
  } else {
    dw.copy_(at::mm(dlogits.t(), h));
  }
}

// dh = dlogits w, unscaled, into fp32 rows (uninitialized before): the loss scale is applied in
// backward before the one rounding to the input's dtype. 16-bit operands on CUDA (LibTorch 2.8
// and later) write the fp32 product directly; elsewhere the product in the operands' dtype is
// widened.
void WriteHiddenGradient(at::Tensor& dh_rows, const at::Tensor& dlogits, const at::Tensor& w) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 8)
  if (w.is_cuda() && w.scalar_type() != at::kFloat) {
    at::addmm_out(dh_rows, dh_rows, dlogits, w, at::kFloat, /*beta=*/0);  // dh_rows not read
    return;
  }
#endif
  if (w.scalar_type() == at::kFloat) {
    at::mm_out(dh_rows, dlogits, w);
  } else {
    dh_rows.copy_(at::mm(dlogits, w));
  }
}

// `gradient` (fp32, unscaled) times the upstream `scale`, computed in fp32 and rounded once to
// `dtype`, into a new tensor: the saved gradient stays as it was, so a second backward through
// the same graph (retain_graph) scales it once again, not twice. On CUDA one vectorized kernel
// (mul_out into bf16 ran at about 1.3 TB/s: 1.24 ms a step at Llama-3.2-1B's tied head).
at::Tensor Scaled(const at::Tensor& gradient, const at::Tensor& scale, at::ScalarType dtype) {
  const at::Tensor fp32_scale = scale.to(at::kFloat);
  at::Tensor out = ScaledCopy(gradient, fp32_scale, dtype);
  if (out.defined()) return out;
  out = at::empty(gradient.sizes(), gradient.options().dtype(dtype));
  at::mul_out(out, gradient, fp32_scale);
  return out;
}

struct ChunkResult {
  at::Tensor loss;     // fp32 scalar
  at::Tensor dlogits;  // [n, V] in the compute dtype, undefined without gradients
};

// One chunk: the summed loss and, when wanted, d(loss)/d(logits) = softmax - onehot on the
// counted rows (zero on ignored ones), times the cap's slope 1 - tanh^2(logits / softcap) under
// a cap.
ChunkResult Chunk(const at::Tensor& h, const at::Tensor& w, const at::Tensor& targets,
                  int64_t ignore_index, bool want_grad, double softcap) {
  at::Tensor logits = at::mm(h, w.t());
  // On CUDA one kernel per row does the statistics and the gradient, in place.
  const at::Tensor row_losses =
      CrossEntropyRowsInPlace(logits, targets, ignore_index, want_grad, softcap);
  if (row_losses.defined()) {
    ChunkResult out;
    out.loss = row_losses.sum();
    if (want_grad) out.dlogits = logits;
    return out;
  }
  at::Tensor z = logits.to(at::kFloat);
  at::Tensor slope;  // dz/dlogits under a cap
  if (softcap > 0) {
    const at::Tensor t = at::tanh(z / softcap);
    slope = 1 - t * t;
    z = t * softcap;
  }
  const at::Tensor counted = targets.ne(ignore_index);
  const at::Tensor safe = at::where(counted, targets, at::zeros_like(targets)).unsqueeze(1);
  const at::Tensor lse = at::logsumexp(z, 1);
  const at::Tensor picked = z.gather(1, safe).squeeze(1);
  ChunkResult out;
  out.loss = at::where(counted, lse - picked, at::zeros_like(lse)).sum();
  if (!want_grad) return out;
  if (z.is_same(logits)) z = z.clone();  // fp32 compute: keep the product intact
  z.sub_(lse.unsqueeze(1)).exp_();
  const at::Tensor weight = counted.to(at::kFloat).unsqueeze(1);
  z.scatter_add_(1, safe, -weight);
  z.mul_(weight);
  if (slope.defined()) z.mul_(slope);
  out.dlogits = z.to(h.scalar_type());
  return out;
}

class LinearCrossEntropyFunction : public torch::autograd::Function<LinearCrossEntropyFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden,
                            const at::Tensor& weight, const at::Tensor& targets,
                            int64_t ignore_index, int64_t compute_dtype, int64_t chunk_rows,
                            double softcap) {
    const auto dtype = static_cast<at::ScalarType>(compute_dtype);
    const at::Tensor h = hidden.to(dtype).contiguous();
    const at::Tensor w = weight.to(dtype).contiguous();
    const int64_t rows = h.size(0);
    const int64_t chunk = ChunkRows(chunk_rows, rows, w.size(0));
    at::Tensor loss = at::zeros({}, hidden.options().dtype(at::kFloat));
    // Both gradients stay fp32 and unscaled until backward knows the scale. The chunks write
    // every row of dh and the first one writes dw whole, so neither is zeroed first (unless
    // there are no rows, and so no chunk).
    const at::TensorOptions fp32 = h.options().dtype(at::kFloat);
    at::Tensor dh = rows == 0 ? at::zeros(h.sizes(), fp32) : at::empty(h.sizes(), fp32);
    at::Tensor dw = rows == 0 ? at::zeros(w.sizes(), fp32) : at::empty(w.sizes(), fp32);
    for (int64_t begin = 0; begin < rows; begin += chunk) {
      const int64_t end = std::min(rows, begin + chunk);
      const at::Tensor hc = h.slice(0, begin, end);
      ChunkResult part = Chunk(hc, w, targets.slice(0, begin, end), ignore_index, true, softcap);
      loss.add_(part.loss);
      at::Tensor dh_rows = dh.slice(0, begin, end);
      WriteHiddenGradient(dh_rows, part.dlogits, w);
      AddWeightGradient(dw, part.dlogits, hc, /*first=*/begin == 0);
    }
    // Saved as variables, not data: autograd lets go of them once the backward that does not
    // retain the graph has run (at Llama-3.2-1B's head 1.1 GB of fp32 that saved_data kept
    // until the graph itself was freed).
    ctx->save_for_backward({dh, dw});
    ctx->saved_data["hidden_dtype"] = static_cast<int64_t>(hidden.scalar_type());
    ctx->saved_data["weight_dtype"] = static_cast<int64_t>(weight.scalar_type());
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor& scale = grads[0];
    const auto dtype = [&](const char* key) {
      return static_cast<at::ScalarType>(ctx->saved_data[key].toInt());
    };
    const variable_list saved = ctx->get_saved_variables();
    return {Scaled(saved[0], scale, dtype("hidden_dtype")),
            Scaled(saved[1], scale, dtype("weight_dtype")),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

at::Tensor LinearCrossEntropySum(const at::Tensor& hidden, const at::Tensor& weight,
                                 const at::Tensor& targets, int64_t ignore_index,
                                 at::ScalarType compute_dtype, int64_t chunk_rows,
                                 double softcap) {
  TORCH_CHECK(hidden.dim() == 2 && weight.dim() == 2 && hidden.size(1) == weight.size(1) &&
                  targets.dim() == 1 && targets.size(0) == hidden.size(0),
              "LinearCrossEntropySum: hidden [N, H], weight [V, H] and targets [N] expected, got ",
              hidden.sizes(), ", ", weight.sizes(), " and ", targets.sizes());
  TORCH_CHECK(chunk_rows >= 0, "LinearCrossEntropySum: chunk_rows ", chunk_rows,
              " is negative: give rows per chunk, or 0 for the default (4096 rows, at most 2^30 "
              "logits)");
  const bool want_grad =
      at::GradMode::is_enabled() && (hidden.requires_grad() || weight.requires_grad());
  if (want_grad) {
    return LinearCrossEntropyFunction::apply(hidden, weight, targets, ignore_index,
                                             static_cast<int64_t>(compute_dtype), chunk_rows,
                                             softcap);
  }
  const at::Tensor h = hidden.to(compute_dtype);
  const at::Tensor w = weight.to(compute_dtype);
  const int64_t chunk = ChunkRows(chunk_rows, h.size(0), w.size(0));
  at::Tensor loss = at::zeros({}, hidden.options().dtype(at::kFloat));
  for (int64_t begin = 0; begin < h.size(0); begin += chunk) {
    const int64_t end = std::min(h.size(0), begin + chunk);
    loss.add_(Chunk(h.slice(0, begin, end), w, targets.slice(0, begin, end), ignore_index, false,
                    softcap)
                  .loss);
  }
  return loss;
}

at::Tensor LinearCrossEntropySumReference(const at::Tensor& hidden, const at::Tensor& weight,
                                          const at::Tensor& targets, int64_t ignore_index,
                                          at::ScalarType compute_dtype, double softcap) {
  const at::Tensor logits = SoftcapReference(
      at::linear(hidden.to(compute_dtype), weight.to(compute_dtype)), softcap);
  return at::cross_entropy_loss(logits.to(at::kFloat), targets, /*weight=*/{}, at::Reduction::Sum,
                                ignore_index);
}

at::Tensor SoftcapReference(const at::Tensor& logits, double softcap) {
  if (softcap <= 0) return logits;
  return at::tanh(logits / softcap) * softcap;
}

}  // namespace kernels
}  // namespace cpptrain
