// Activation checkpointing (reentrant, like torch.utils.checkpoint with use_reentrant=True):
// the forward keeps only the input, and backward runs the body again with gradients on.
//
//   torch::Tensor out = RecomputeInBackward(
//       [this, rope](const torch::Tensor& x) { return Body(x, rope); }, hidden);
//
// Contract:
//   - `body` is copied and kept until backward runs: capture by value what it uses.
//   - `body` must compute the same function both times: no dropout or other RNG (the RNG
//     state is not restored), and its parameters must hold the same values in backward
//     (an engine that frees gathered parameters after forward gathers them again first).
//   - The autocast state of the input's device type at forward is restored for the
//     recomputation, so backward may be called outside the autocast scope (or inside it:
//     both runs bypass autocast's weight-cast cache, whose no-grad entries would cut the
//     weights out of the recomputed graph).
//   - Gradients of the parameters `body` uses accumulate into their .grad during the
//     backward of the returned tensor; the input gets its gradient as usual.
//   - Without grad mode, this is just body(input).
#ifndef CPPTRAIN_MODELS_RECOMPUTE_H_
#define CPPTRAIN_MODELS_RECOMPUTE_H_

#include <functional>

#include <torch/types.h>

namespace cpptrain {

torch::Tensor RecomputeInBackward(std::function<torch::Tensor(const torch::Tensor&)> body,
                                  const torch::Tensor& input);

}  // namespace cpptrain

#endif  // CPPTRAIN_MODELS_RECOMPUTE_H_
