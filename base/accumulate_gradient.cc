#include "base/accumulate_gradient.h"

#include <ATen/ATen.h>

namespace cpptrain {

void AccumulateGradient(at::Tensor& held, const at::Tensor& grad, at::ScalarType dtype,
                        bool keep_bf16) {
  if (!held.defined()) {
    const bool as_made = grad.scalar_type() == dtype ||
                         (keep_bf16 && grad.scalar_type() == at::kBFloat16 && dtype == at::kFloat);
    held = as_made ? grad : grad.to(dtype);
    return;
  }
  if (held.scalar_type() != dtype) held = held.to(dtype);
  held.add_(grad);
}

}  // namespace cpptrain
