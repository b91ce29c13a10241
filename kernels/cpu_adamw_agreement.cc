#include "kernels/cpu_adamw_agreement.h"

#include <torch/types.h>
#include <torch/version.h>

#include <cmath>

namespace cpptrain {
namespace kernels {

bool AgreesWithLibTorchAdamW(const at::Tensor& libtorch, const at::Tensor& kernel,
                             const at::Tensor& before) {
#if TORCH_VERSION_MAJOR >= 2
  const at::Tensor scale =
      at::maximum(at::maximum(libtorch.abs(), before.abs()), (libtorch - before).abs());
  const at::Tensor ulp = at::nextafter(scale, at::full_like(scale, INFINITY)) - scale;
  return (libtorch - kernel).abs().le(4 * ulp).all().item<bool>();
#else
  (void)before;
  return torch::equal(libtorch, kernel);
#endif
}

}  // namespace kernels
}  // namespace cpptrain
