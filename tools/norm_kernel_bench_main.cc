// //tools:norm_kernel_bench: the RMSNorm and QK-norm + rotary kernels of kernels/launchers.h
// against their eager LibTorch references (kernels/fused_ops.h) on one GPU, in bf16:
//
//   build/tools/norm_kernel_bench --iters=50        (CMake build on a GPU host)
//
// Cases: RMSNorm forward and backward at rows 8192 x cols 1024, 2048, 3072 (Llama-3.2-1B is
// 2048), QK-norm + rotary backward and forward at Qwen3's shape (batch 4, seq 2048, 16 query
// heads and 8 key/value heads of 128). For each: the median of --iters launches timed with
// CUDA events (after --warmup), rotating --sets input sets so that they do not stay in the L2;
// the eager reference's autograd backward (or forward) timed alike; GB/s = the bytes each input
// is read and each output written once, over the median; and the error of every output against
// the reference evaluated in float64 on the same inputs: max |a - b| / max |b| and
// ||a - b|| / ||b||, after the outputs were poisoned with NaN (an unwritten element shows).
// Exits 1 when an error exceeds 1e-2 (bf16). Prints a table and one JSON line per case; in a
// build without the CUDA kernels or on a machine without a GPU it prints SKIPPED and exits 0.
#include <torch/autograd.h>
#include <torch/cuda.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "kernels/fused_ops.h"
#include "kernels/launchers.h"

#if CPPTRAIN_HAS_CUDA_KERNELS
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime_api.h>
#endif

ABSL_FLAG(int, iters, 50, "timed launches per case and side");
ABSL_FLAG(int, warmup, 5, "untimed launches before timing");
ABSL_FLAG(int, sets, 4, "input sets rotated between launches (each case's data is 16-48 MB)");

namespace {

#if CPPTRAIN_HAS_CUDA_KERNELS

using cpptrain::kernels::ElementType;

constexpr double kEps = 1e-6;
constexpr double kTolerance = 1e-2;

struct Result {
  std::string name;
  double kernel_ms = 0, eager_ms = 0, bytes = 0;
  double max_error = 0, norm_error = 0;  // the worst over the case's outputs
};

// max |a - b| / max |b| and ||a - b|| / ||b|| in float64; NaN anywhere makes both NaN.
std::pair<double, double> Errors(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor a64 = a.detach().to(at::kDouble), b64 = b.detach().to(at::kDouble);
  const at::Tensor diff = a64 - b64;
  if (at::isnan(a64).any().item<bool>()) return {NAN, NAN};
  return {(diff.abs().max() / b64.abs().max()).item<double>(),
          (diff.norm() / b64.norm()).item<double>()};
}

void Worst(Result& r, const at::Tensor& a, const at::Tensor& b) {
  const auto [max_error, norm_error] = Errors(a, b);
  r.max_error = std::isnan(max_error) ? NAN : std::max(r.max_error, max_error);
  r.norm_error = std::isnan(norm_error) ? NAN : std::max(r.norm_error, norm_error);
}

void Report(const Result& r) {
  std::printf("| %s | %.1f | %.0f | %.1f | %.0f | %.2fx | %.2e | %.2e |\n", r.name.c_str(),
              r.kernel_ms * 1e3, r.bytes / r.kernel_ms / 1e6, r.eager_ms * 1e3,
              r.bytes / r.eager_ms / 1e6, r.eager_ms / r.kernel_ms, r.max_error, r.norm_error);
}

void ReportJson(const Result& r) {
  std::printf(
      "{\"bench\": \"norm_kernel\", \"case\": \"%s\", \"kernel_ms\": %.5f, \"kernel_gb_per_s\": "
      "%.1f, \"eager_ms\": %.5f, \"eager_gb_per_s\": %.1f, \"bytes\": %.0f, \"max_error\": %.3e, "
      "\"norm_error\": %.3e}\n",
      r.name.c_str(), r.kernel_ms, r.bytes / r.kernel_ms / 1e6, r.eager_ms,
      r.bytes / r.eager_ms / 1e6, r.bytes, r.max_error, r.norm_error);
}

void* Stream() { return at::cuda::getCurrentCUDAStream().stream(); }

void Check(const char* error, const char* what) {
  TORCH_CHECK(error == nullptr, what, " failed: ", error);
}

void CheckCuda(cudaError_t code, const char* what) {
  TORCH_CHECK(code == cudaSuccess, what, ": ", cudaGetErrorString(code));
}

// The median milliseconds of f(i) for i in [0, iters), each between two events on the current
// stream, after `warmup` untimed calls; f(i) launches on that stream.
double MedianMs(const std::function<void(int)>& f) {
  for (int i = 0; i < absl::GetFlag(FLAGS_warmup); ++i) f(i);
  cudaEvent_t start, stop;
  CheckCuda(cudaEventCreate(&start), "cudaEventCreate");
  CheckCuda(cudaEventCreate(&stop), "cudaEventCreate");
  auto stream = static_cast<cudaStream_t>(Stream());
  std::vector<float> ms;
  for (int i = 0; i < absl::GetFlag(FLAGS_iters); ++i) {
    CheckCuda(cudaEventRecord(start, stream), "cudaEventRecord");
    f(i);
    CheckCuda(cudaEventRecord(stop, stream), "cudaEventRecord");
    CheckCuda(cudaEventSynchronize(stop), "cudaEventSynchronize");
    ms.push_back(0);
    CheckCuda(cudaEventElapsedTime(&ms.back(), start, stop), "cudaEventElapsedTime");
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

at::TensorOptions Cuda() { return at::TensorOptions().device(at::kCUDA); }

struct NormSet {
  at::Tensor x, w, dy, rstd;
};

NormSet MakeNormSet(int64_t rows, int64_t cols) {
  NormSet s{torch::randn({rows, cols}, Cuda()).to(at::kBFloat16),
            (torch::rand({cols}, Cuda()) + 0.5).to(at::kBFloat16),
            torch::randn({rows, cols}, Cuda()).to(at::kBFloat16),
            at::empty({rows}, Cuda().dtype(at::kFloat))};
  at::Tensor y = at::empty_like(s.x);
  Check(cpptrain::kernels::LaunchRmsNormForward(rows, cols, s.x.data_ptr(), ElementType::kBfloat16,
                                                s.w.data_ptr(), ElementType::kBfloat16, kEps,
                                                y.data_ptr(), ElementType::kBfloat16,
                                                s.rstd.data_ptr<float>(), Stream()),
        "RMSNorm forward");
  return s;
}

std::vector<NormSet> MakeNormSets(int64_t rows, int64_t cols) {
  std::vector<NormSet> sets;
  for (int i = 0; i < std::max(1, absl::GetFlag(FLAGS_sets)); ++i) {
    sets.push_back(MakeNormSet(rows, cols));
  }
  return sets;
}

// The eager backward of `forward` on each set's leaves, timed as autograd::grad of a kept graph.
double EagerBackwardMs(const std::vector<at::Tensor>& outputs,
                       const std::vector<std::vector<at::Tensor>>& leaves,
                       const std::vector<at::Tensor>& grads) {
  return MedianMs([&](int i) {
    const size_t k = i % outputs.size();
    torch::autograd::grad({outputs[k]}, leaves[k], {grads[k]}, /*retain_graph=*/true);
  });
}

Result RmsNormForward(int64_t rows, int64_t cols) {
  const std::vector<NormSet> sets = MakeNormSets(rows, cols);
  at::Tensor y = at::empty_like(sets[0].x), rstd = at::empty_like(sets[0].rstd);
  auto kernel = [&](int i) {
    const NormSet& s = sets[i % sets.size()];
    Check(cpptrain::kernels::LaunchRmsNormForward(
              rows, cols, s.x.data_ptr(), ElementType::kBfloat16, s.w.data_ptr(),
              ElementType::kBfloat16, kEps, y.data_ptr(), ElementType::kBfloat16,
              rstd.data_ptr<float>(), Stream()),
          "RMSNorm forward");
  };
  Result r{"rmsnorm_fwd " + std::to_string(rows) + "x" + std::to_string(cols)};
  y.fill_(NAN);
  kernel(0);
  Worst(r, y,
        cpptrain::kernels::RmsNormReference(sets[0].x.to(at::kDouble), sets[0].w.to(at::kDouble),
                                            kEps));
  r.kernel_ms = MedianMs(kernel);
  r.eager_ms = MedianMs([&](int i) {
    const NormSet& s = sets[i % sets.size()];
    cpptrain::kernels::RmsNormReference(s.x, s.w, kEps);
  });
  r.bytes = 2.0 * 2 * rows * cols + 2.0 * cols + 4.0 * rows;  // x, y; weight; rstd
  return r;
}

Result RmsNormBackward(int64_t rows, int64_t cols) {
  const std::vector<NormSet> sets = MakeNormSets(rows, cols);
  at::Tensor dx = at::empty_like(sets[0].x), dw = at::empty({cols}, Cuda().dtype(at::kFloat));
  at::Tensor workspace = at::empty({cpptrain::kernels::NormBackwardWorkspaceFloats(rows, cols)},
                                   Cuda().dtype(at::kFloat));
  auto kernel = [&](int i) {
    const NormSet& s = sets[i % sets.size()];
    Check(cpptrain::kernels::LaunchRmsNormBackward(
              rows, cols, s.dy.data_ptr(), ElementType::kBfloat16, s.x.data_ptr(),
              ElementType::kBfloat16, s.w.data_ptr(), ElementType::kBfloat16,
              s.rstd.data_ptr<float>(), /*dresidual=*/nullptr, dx.data_ptr(), dw.data_ptr<float>(),
              workspace.data_ptr<float>(), workspace.numel(), Stream()),
          "RMSNorm backward");
  };
  Result r{"rmsnorm_bwd " + std::to_string(rows) + "x" + std::to_string(cols)};
  dx.fill_(NAN);
  dw.fill_(NAN);
  kernel(0);
  const at::Tensor x64 = sets[0].x.to(at::kDouble).requires_grad_();
  const at::Tensor w64 = sets[0].w.to(at::kDouble).requires_grad_();
  const auto ref = torch::autograd::grad({cpptrain::kernels::RmsNormReference(x64, w64, kEps)},
                                         {x64, w64}, {sets[0].dy.to(at::kDouble)});
  Worst(r, dx, ref[0]);
  Worst(r, dw, ref[1]);
  r.kernel_ms = MedianMs(kernel);
  std::vector<at::Tensor> outputs, grads;
  std::vector<std::vector<at::Tensor>> leaves;
  for (const NormSet& s : sets) {
    leaves.push_back({s.x.detach().requires_grad_(), s.w.detach().requires_grad_()});
    outputs.push_back(
        cpptrain::kernels::RmsNormReference(leaves.back()[0], leaves.back()[1], kEps));
    grads.push_back(s.dy);
  }
  r.eager_ms = EagerBackwardMs(outputs, leaves, grads);
  // dy, x, dx; weight; rstd; dweight
  r.bytes = 3.0 * 2 * rows * cols + 2.0 * cols + 4.0 * rows + 4.0 * cols;
  return r;
}

struct QkSet {
  at::Tensor x, w, dout, rstd;
};

struct RotaryTables {
  at::Tensor cos, sin;  // [seq, dim] fp32, Qwen3's theta of 1e6
};

RotaryTables MakeTables(int64_t seq, int64_t dim) {
  const at::Tensor inv_freq =
      1.0 /
      torch::pow(1e6, torch::arange(0, dim, 2, Cuda()).to(at::kFloat) / static_cast<double>(dim));
  const at::Tensor freqs = torch::outer(torch::arange(seq, Cuda()).to(at::kFloat), inv_freq);
  const at::Tensor emb = torch::cat({freqs, freqs}, -1);
  return {emb.cos().contiguous(), emb.sin().contiguous()};
}

// The kernel's forward of s.x into out ([B, H, T, D] over [B, T, H, D] memory) and rstd.
void LaunchQkForward(int64_t batch, int64_t seq, int64_t heads, int64_t dim, const QkSet& s,
                     const RotaryTables& tables, at::Tensor& out, at::Tensor& rstd) {
  Check(cpptrain::kernels::LaunchQkNormRopeForward(
            batch, seq, heads, dim, s.x.data_ptr(), ElementType::kBfloat16, s.w.data_ptr(),
            ElementType::kBfloat16, kEps, tables.cos.data_ptr<float>(),
            tables.sin.data_ptr<float>(), out.data_ptr(), ElementType::kBfloat16,
            rstd.data_ptr<float>(), Stream()),
        "QK-norm + rotary forward");
}

// --sets input sets, each with the rstd its forward wrote (for the backward).
std::vector<QkSet> MakeQkSets(int64_t batch, int64_t seq, int64_t heads, int64_t dim,
                              const RotaryTables& tables) {
  std::vector<QkSet> sets;
  for (int i = 0; i < std::max(1, absl::GetFlag(FLAGS_sets)); ++i) {
    QkSet s{torch::randn({batch, seq, heads, dim}, Cuda()).to(at::kBFloat16),
            (torch::rand({dim}, Cuda()) + 0.5).to(at::kBFloat16),
            // [B, H, T, D] in [B, T, H, D] memory, the order the kernel reads and writes.
            torch::randn({batch, seq, heads, dim}, Cuda()).to(at::kBFloat16).transpose(1, 2),
            at::empty({batch * seq * heads}, Cuda().dtype(at::kFloat))};
    at::Tensor out = at::empty_like(s.dout);
    LaunchQkForward(batch, seq, heads, dim, s, tables, out, s.rstd);
    sets.push_back(s);
  }
  return sets;
}

std::string QkShape(int64_t batch, int64_t seq, int64_t heads, int64_t dim) {
  return std::to_string(batch) + "x" + std::to_string(seq) + "x" + std::to_string(heads) + "x" +
         std::to_string(dim);
}

Result QkNormRopeForward(int64_t batch, int64_t seq, int64_t heads, int64_t dim) {
  const RotaryTables tables = MakeTables(seq, dim);
  const at::Tensor &cos = tables.cos, &sin = tables.sin;
  const std::vector<QkSet> sets = MakeQkSets(batch, seq, heads, dim, tables);
  at::Tensor out = at::empty_like(sets[0].dout), rstd = at::empty_like(sets[0].rstd);
  auto kernel = [&](int i) {
    LaunchQkForward(batch, seq, heads, dim, sets[i % sets.size()], tables, out, rstd);
  };
  Result r{"qknorm_rope_fwd " + QkShape(batch, seq, heads, dim)};
  out.fill_(NAN);
  kernel(0);
  Worst(r, out,
        cpptrain::kernels::QkNormRopeReference(sets[0].x.to(at::kDouble),
                                               sets[0].w.to(at::kDouble), kEps,
                                               cos.to(at::kDouble), sin.to(at::kDouble),
                                               at::kDouble));
  r.kernel_ms = MedianMs(kernel);
  r.eager_ms = MedianMs([&](int i) {
    const QkSet& s = sets[i % sets.size()];
    cpptrain::kernels::QkNormRopeReference(s.x, s.w, kEps, cos, sin, at::kBFloat16);
  });
  const int64_t rows = batch * seq * heads;
  // x, out; cos and sin; rstd; weight
  r.bytes = 2.0 * 2 * rows * dim + 2.0 * 4 * seq * dim + 4.0 * rows + 2.0 * dim;
  return r;
}

Result QkNormRopeBackward(int64_t batch, int64_t seq, int64_t heads, int64_t dim) {
  const RotaryTables tables = MakeTables(seq, dim);
  const at::Tensor &cos = tables.cos, &sin = tables.sin;
  const int64_t rows = batch * seq * heads;
  const std::vector<QkSet> sets = MakeQkSets(batch, seq, heads, dim, tables);
  at::Tensor dx = at::empty_like(sets[0].x), dw = at::empty({dim}, Cuda().dtype(at::kFloat));
  at::Tensor workspace = at::empty({cpptrain::kernels::NormBackwardWorkspaceFloats(rows, dim)},
                                   Cuda().dtype(at::kFloat));
  auto kernel = [&](int i) {
    const QkSet& s = sets[i % sets.size()];
    Check(cpptrain::kernels::LaunchQkNormRopeBackward(
              batch, seq, heads, dim, s.dout.data_ptr(), ElementType::kBfloat16, s.x.data_ptr(),
              ElementType::kBfloat16, s.w.data_ptr(), ElementType::kBfloat16, cos.data_ptr<float>(),
              sin.data_ptr<float>(), s.rstd.data_ptr<float>(), dx.data_ptr(), heads * dim,
              dw.data_ptr<float>(), workspace.data_ptr<float>(), workspace.numel(), Stream()),
          "QK-norm + rotary backward");
  };
  Result r{"qknorm_rope_bwd " + QkShape(batch, seq, heads, dim)};
  dx.fill_(NAN);
  dw.fill_(NAN);
  kernel(0);
  const at::Tensor x64 = sets[0].x.to(at::kDouble).requires_grad_();
  const at::Tensor w64 = sets[0].w.to(at::kDouble).requires_grad_();
  const at::Tensor out64 = cpptrain::kernels::QkNormRopeReference(
      x64, w64, kEps, cos.to(at::kDouble), sin.to(at::kDouble), at::kDouble);
  const auto ref = torch::autograd::grad({out64}, {x64, w64}, {sets[0].dout.to(at::kDouble)});
  Worst(r, dx, ref[0]);
  Worst(r, dw, ref[1]);
  r.kernel_ms = MedianMs(kernel);
  std::vector<at::Tensor> outputs, grads;
  std::vector<std::vector<at::Tensor>> leaves;
  for (const QkSet& s : sets) {
    leaves.push_back({s.x.detach().requires_grad_(), s.w.detach().requires_grad_()});
    outputs.push_back(cpptrain::kernels::QkNormRopeReference(leaves.back()[0], leaves.back()[1],
                                                             kEps, cos, sin, at::kBFloat16));
    grads.push_back(s.dout);
  }
  r.eager_ms = EagerBackwardMs(outputs, leaves, grads);
  // dout, x, dx; cos and sin; rstd; weight and dweight
  r.bytes = 3.0 * 2 * rows * dim + 2.0 * 4 * seq * dim + 4.0 * rows + 6.0 * dim;
  return r;
}

int Run() {
  torch::manual_seed(0);
  const cudaDeviceProp* device = at::cuda::getCurrentDeviceProperties();
  std::printf("norm_kernel_bench on %s (%d multiprocessors, %d MB L2), %d launches per median\n",
              device->name, device->multiProcessorCount, device->l2CacheSize >> 20,
              absl::GetFlag(FLAGS_iters));
  std::vector<Result> results;
  for (const int64_t cols : {int64_t{2048}, int64_t{1024}, int64_t{3072}}) {
    results.push_back(RmsNormBackward(8192, cols));
    results.push_back(RmsNormForward(8192, cols));
  }
  results.push_back(QkNormRopeBackward(4, 2048, 16, 128));  // Qwen3's queries
  results.push_back(QkNormRopeBackward(4, 2048, 8, 128));   // and keys
  results.push_back(QkNormRopeForward(4, 2048, 16, 128));
  results.push_back(QkNormRopeForward(4, 2048, 8, 128));
  int failed = 0;
  for (const Result& r : results) {
    ReportJson(r);
    if (!(r.max_error <= kTolerance && r.norm_error <= kTolerance)) ++failed;
  }
  std::printf(
      "\n| case (bf16) | kernel us | kernel GB/s | eager us | eager GB/s | speedup | max error "
      "| norm error |\n|---|---|---|---|---|---|---|---|\n");
  for (const Result& r : results) Report(r);
  std::printf("norm_kernel_bench: %zu cases, %d over the %.0e error bound\n", results.size(),
              failed, kTolerance);
  return failed == 0 ? 0 : 1;
}

#else

int Run() { return 0; }

#endif

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (!cpptrain::kernels::CudaKernelsBuilt() || !torch::cuda::is_available()) {
    std::printf("SKIPPED norm_kernel_bench: %s\n",
                cpptrain::kernels::CudaKernelsBuilt()
                    ? "no GPU on this machine"
                    : "this build has no CUDA kernels (CMake with nvcc on a CUDA LibTorch)");
    return 0;
  }
  return Run();
}
