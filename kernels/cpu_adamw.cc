// Compiled with -ffp-contract=off (BUILD.bazel, CMakeLists.txt): a contraction the compiler
// chose would differ from ATen's roundings. The two fmas ATen does are written out.
#include "kernels/cpu_adamw.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

namespace cpptrain {
namespace kernels {
namespace {

// Elements per task of the intra-op pool: large enough that a task streams ~1.25 MB.
constexpr int64_t kGrain = 1 << 16;

// The step's scalars, each rounded to float once as ATen rounds a double Scalar.
struct Scalars {
  float decay;  // 1 - lr*wd
  bool has_decay;
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float sqrt_bias_correction2;
  float eps;
  float neg_step_size;  // -(lr / bias_correction1)
  bool has_grad_scale;
  float grad_scale;
};

Scalars MakeScalars(const AdamWHyper& h, int64_t step) {
  const double bias_correction1 = 1 - std::pow(h.beta1, static_cast<double>(step));
  const double bias_correction2 = 1 - std::pow(h.beta2, static_cast<double>(step));
  Scalars s;
  s.has_decay = h.weight_decay != 0;
  s.decay = static_cast<float>(1 - h.lr * h.weight_decay);
  s.beta1 = static_cast<float>(h.beta1);
  s.one_minus_beta1 = static_cast<float>(1 - h.beta1);
  s.beta2 = static_cast<float>(h.beta2);
  s.one_minus_beta2 = static_cast<float>(1 - h.beta2);
  s.sqrt_bias_correction2 = static_cast<float>(std::sqrt(bias_correction2));
  s.eps = static_cast<float>(h.eps);
  s.neg_step_size = static_cast<float>(-(h.lr / bias_correction1));
  s.has_grad_scale = h.grad_scale != 1.0;
  s.grad_scale = static_cast<float>(h.grad_scale);
  return s;
}

inline float Widen(float g) { return g; }
inline float Widen(uint16_t bf16_bits) {
  const uint32_t bits = static_cast<uint32_t>(bf16_bits) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// Round to nearest even, as c10::BFloat16 does; NaN stays a NaN.
inline uint16_t RoundToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  return std::isnan(f) ? uint16_t{0x7FC0} : static_cast<uint16_t>(rounded);
}

// The loop body, inlined into each target-specific copy below; `__restrict` lets the compiler
// vectorize without alias checks (the spans do not overlap: the header's contract). One pass
// over memory: the decay is applied to the value loaded, as its own rounding.
template <bool kDecay, bool kScale, bool kRound, typename GradT>
__attribute__((always_inline)) inline void Update(float* __restrict p, const GradT* __restrict g,
                                                  float* __restrict m, float* __restrict v,
                                                  uint16_t* __restrict out, int64_t n,
                                                  const Scalars& s) {
  for (int64_t i = 0; i < n; ++i) {
    const float param = kDecay ? p[i] * s.decay : p[i];
    const float grad = kScale ? Widen(g[i]) * s.grad_scale : Widen(g[i]);
    const float exp_avg = std::fma(grad, s.one_minus_beta1, m[i] * s.beta1);
    const float exp_avg_sq = std::fma(s.one_minus_beta2 * grad, grad, v[i] * s.beta2);
    const float denom = std::sqrt(exp_avg_sq) / s.sqrt_bias_correction2 + s.eps;
    const float updated = param + (s.neg_step_size * exp_avg) / denom;
    m[i] = exp_avg;
    v[i] = exp_avg_sq;
    p[i] = updated;
    if (kRound) out[i] = RoundToBf16(updated);
  }
}

// The body specialized for what this step does: decay, then gradient scale, then bf16 copy,
// each chosen once per chunk.
template <bool kDecay, bool kScale, typename GradT>
__attribute__((always_inline)) inline void WithCopy(float* p, const GradT* g, float* m, float* v,
                                                    uint16_t* out, int64_t n, const Scalars& s) {
  out != nullptr ? Update<kDecay, kScale, true>(p, g, m, v, out, n, s)
                 : Update<kDecay, kScale, false>(p, g, m, v, out, n, s);
}

template <bool kDecay, typename GradT>
__attribute__((always_inline)) inline void WithScale(float* p, const GradT* g, float* m, float* v,
                                                     uint16_t* out, int64_t n, const Scalars& s) {
  s.has_grad_scale ? WithCopy<kDecay, true>(p, g, m, v, out, n, s)
                   : WithCopy<kDecay, false>(p, g, m, v, out, n, s);
}

template <typename GradT>
__attribute__((always_inline)) inline void Select(float* p, const GradT* g, float* m, float* v,
                                                  uint16_t* out, int64_t n, const Scalars& s) {
  s.has_decay ? WithScale<true>(p, g, m, v, out, n, s) : WithScale<false>(p, g, m, v, out, n, s);
}

template <typename GradT>
__attribute__((target("avx2,fma"))) void UpdateAvx2(float* p, const GradT* g, float* m, float* v,
                                                    uint16_t* out, int64_t n, const Scalars& s) {
  Select(p, g, m, v, out, n, s);
}

template <typename GradT>
void UpdatePortable(float* p, const GradT* g, float* m, float* v, uint16_t* out, int64_t n,
                    const Scalars& s) {
  Select(p, g, m, v, out, n, s);
}

bool HasAvx2Fma() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}

template <typename Spans>
void Run(const Spans& spans, const AdamWHyper& hyper, int64_t step) {
  const Scalars s = MakeScalars(hyper, step);
  const bool avx2 = HasAvx2Fma();
  at::parallel_for(0, spans.n, kGrain, [&](int64_t begin, int64_t end) {
    const int64_t len = end - begin;
    uint16_t* out = spans.param_bf16 != nullptr ? spans.param_bf16 + begin : nullptr;
    if (avx2) {
      UpdateAvx2(spans.param + begin, spans.grad + begin, spans.exp_avg + begin,
                 spans.exp_avg_sq + begin, out, len, s);
    } else {
      UpdatePortable(spans.param + begin, spans.grad + begin, spans.exp_avg + begin,
                     spans.exp_avg_sq + begin, out, len, s);
    }
  });
}

}  // namespace

void CpuAdamWStep(const AdamWSpans& spans, const AdamWHyper& hyper, int64_t step) {
  Run(spans, hyper, step);
}

void CpuAdamWStep(const AdamWSpansBf16Grad& spans, const AdamWHyper& hyper, int64_t step) {
  Run(spans, hyper, step);
}

bool CpuAdamWVectorized() { return HasAvx2Fma(); }

double CpuSumOfSquares(const float* x, int64_t n) {
  const int64_t chunks = (n + kGrain - 1) / kGrain;
  std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const int64_t lo = c * kGrain, hi = std::min(n, lo + kGrain);
      double sum = 0;
      for (int64_t i = lo; i < hi; ++i) sum += static_cast<double>(x[i]) * x[i];
      partial[c] = sum;
    }
  });
  double total = 0;
  for (double p : partial) total += p;  // in chunk order: the same on any thread count
  return total;
}

int CpuAdamWThreads(int64_t n) {
  std::atomic<uint64_t> seen{0};  // bit t: intra-op thread t ran a chunk
  at::parallel_for(0, n, kGrain, [&](int64_t, int64_t) {
    seen.fetch_or(uint64_t{1} << (at::get_thread_num() % 64));
  });
  return __builtin_popcountll(seen.load());
}

}  // namespace kernels
}  // namespace cpptrain
