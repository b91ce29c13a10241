#include "kernels/cuda_adamw.h"

#include <ATen/ATen.h>

#include "kernels/fused_ops.h"
#include "kernels/launchers.h"

#if CPPTRAIN_HAS_CUDA_KERNELS
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace cpptrain {
namespace kernels {

bool CudaAdamWBuilt() { return CudaKernelsBuilt(); }

#if CPPTRAIN_HAS_CUDA_KERNELS

namespace {

void CheckLists(const CudaAdamWLists& lists) {
  const size_t n = lists.params.size();
  TORCH_CHECK(lists.grads.size() == n && lists.exp_avgs.size() == n &&
                  lists.exp_avg_sqs.size() == n && lists.steps.size() == n &&
                  (lists.bf16_copies.empty() || lists.bf16_copies.size() == n),
              "CudaAdamWStep: the lists must have one entry per parameter (", n, " params, ",
              lists.grads.size(), " grads, ", lists.exp_avgs.size(), " exp_avgs, ",
              lists.exp_avg_sqs.size(), " exp_avg_sqs, ", lists.steps.size(), " steps, ",
              lists.bf16_copies.size(), " bf16_copies)");
  const c10::Device device = lists.params[0].device();
  TORCH_CHECK(device.is_cuda(), "CudaAdamWStep: params[0] is on ", device.str(),
              ", not on a CUDA device");
  for (size_t i = 0; i < n; ++i) {
    const int64_t numel = lists.params[i].numel();
    for (const auto* list : {&lists.params, &lists.exp_avgs, &lists.exp_avg_sqs}) {
      const at::Tensor& t = (*list)[i];
      TORCH_CHECK(t.device() == device && t.scalar_type() == at::kFloat && t.is_contiguous() &&
                      t.numel() == numel,
                  "CudaAdamWStep: parameter ", i, "'s params, exp_avgs and exp_avg_sqs entries "
                  "must be contiguous fp32 tensors of ", numel, " values on ", device.str());
    }
    const at::Tensor& g = lists.grads[i];
    TORCH_CHECK(g.device() == device && g.numel() == numel &&
                    (g.scalar_type() == at::kFloat || g.scalar_type() == at::kBFloat16),
                "CudaAdamWStep: grads[", i, "] must be fp32 or bf16 with ", numel, " values on ",
                device.str(), ", not ", g.scalar_type(), " with ", g.numel(), " on ",
                g.device().str());
    const at::Tensor& step = lists.steps[i];
    TORCH_CHECK(step.device() == device && step.scalar_type() == at::kFloat && step.numel() == 1,
                "CudaAdamWStep: steps[", i, "] must be one fp32 value on ", device.str());
    if (!lists.bf16_copies.empty() && lists.bf16_copies[i].defined()) {
      const at::Tensor& c = lists.bf16_copies[i];
      TORCH_CHECK(c.device() == device && c.scalar_type() == at::kBFloat16 &&
                      c.is_contiguous() && c.numel() == numel,
                  "CudaAdamWStep: bf16_copies[", i, "] must be a contiguous bf16 tensor of ",
                  numel, " values on ", device.str());
    }
  }
}

// A one-value fp32 tensor on `device` from an optional scalar tensor (undefined stays so).
at::Tensor DeviceScalar(const at::Tensor& value, const c10::Device& device, const char* name) {
  if (!value.defined()) return value;
  TORCH_CHECK(value.numel() == 1, "CudaAdamWStep: ", name, " must hold one value, not ",
              value.numel());
  return value.reshape({}).to(device, at::kFloat);
}

}  // namespace

void CudaAdamWStep(const CudaAdamWLists& lists, const CudaAdamWOptions& options) {
  if (lists.params.empty()) return;
  CheckLists(lists);
  const c10::Device device = lists.params[0].device();
  c10::cuda::CUDAGuard guard(device);
  at::_foreach_add_(lists.steps, 1);
  const at::Tensor lr = DeviceScalar(options.device_lr, device, "device_lr");
  const at::Tensor coefficient = DeviceScalar(options.grad_coefficient, device, "grad_coefficient");
  AdamWScalars scalars{static_cast<float>(options.lr),
                       lr.defined() ? lr.data_ptr<float>() : nullptr,
                       options.beta1,
                       options.beta2,
                       static_cast<float>(options.eps),
                       static_cast<float>(options.weight_decay),
                       coefficient.defined() ? coefficient.data_ptr<float>() : nullptr};
  std::vector<at::Tensor> grads(lists.grads.size());  // contiguous, kept alive to the launch
  std::vector<AdamWTensor> by_type[2];
  for (size_t i = 0; i < lists.params.size(); ++i) {
    grads[i] = lists.grads[i].contiguous();
    const at::Tensor copy = lists.bf16_copies.empty() ? at::Tensor() : lists.bf16_copies[i];
    const bool bf16 = grads[i].scalar_type() == at::kBFloat16;
    by_type[bf16].push_back({lists.params[i].data_ptr<float>(), grads[i].data_ptr(),
                             lists.exp_avgs[i].data_ptr<float>(),
                             lists.exp_avg_sqs[i].data_ptr<float>(),
                             lists.steps[i].data_ptr<float>(),
                             copy.defined() ? copy.data_ptr() : nullptr, lists.params[i].numel()});
  }
  void* stream = at::cuda::getCurrentCUDAStream().stream();
  for (int bf16 = 0; bf16 < 2; ++bf16) {
    if (by_type[bf16].empty()) continue;
    const char* error =
        LaunchAdamW(by_type[bf16].data(), static_cast<int64_t>(by_type[bf16].size()),
                    bf16 ? ElementType::kBfloat16 : ElementType::kFloat32, scalars, stream);
    TORCH_CHECK(error == nullptr, "CudaAdamWStep: the AdamW kernel failed: ", error);
  }
}

#else  // no CUDA kernels in this build

void CudaAdamWStep(const CudaAdamWLists&, const CudaAdamWOptions&) {
  TORCH_CHECK(false, "CudaAdamWStep: this build has no CUDA kernels (build with CMake and nvcc "
              "on a CUDA LibTorch)");
}

#endif

}  // namespace kernels
}  // namespace cpptrain
