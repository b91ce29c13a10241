// How a gradient joins the one held for an fp32 (or other) optimizer parameter, as the local
// engine's working copies, ZeRO-2 on one rank and the sharding core on one rank all hold it:
// the first is kept as autograd made it when the optimizer reads its dtype, so one micro-batch
// costs no pass over it; a later one is added in the parameter's dtype.
//
//   at::Tensor held;                                          // none yet
//   AccumulateGradient(held, bf16_grad, at::kFloat, /*keep_bf16=*/true);   // held is bf16_grad
//   AccumulateGradient(held, bf16_grad2, at::kFloat, true);   // held: fp32 sum of both
#ifndef CPPTRAIN_BASE_ACCUMULATE_GRADIENT_H_
#define CPPTRAIN_BASE_ACCUMULATE_GRADIENT_H_

#include <ATen/core/Tensor.h>

namespace cpptrain {

// `held` undefined: becomes `grad` itself when it has `dtype`, or is bf16 with `dtype` fp32 and
// `keep_bf16` (an optimizer that reads bf16 gradients of fp32 parameters); else `grad` cast to
// `dtype`. Defined: widened to `dtype` if it is not, then `grad` is added in place. `grad` must
// be held by nobody else (autograd hands its buffer over) and shaped like `held`.
void AccumulateGradient(at::Tensor& held, const at::Tensor& grad, at::ScalarType dtype,
                        bool keep_bf16);

}  // namespace cpptrain

#endif  // CPPTRAIN_BASE_ACCUMULATE_GRADIENT_H_
