// The optimizer an engine hands the Trainer when the one doing the work steps stand-ins for the
// model's parameters (ZeRO's owned pieces, the fp32 masters of bf16 working copies): its
// parameter groups are built from the inner optimizer's, and the options the Trainer sets on
// them (the learning rate) are copied into the inner optimizer before every step.
//
//   class ZeroOptimizer : public WrappingOptimizer, public CheckpointableOptimizer { ... };
//   SetLearningRate(wrapper, lr);   // reaches inner() at the next step()
#ifndef CPPTRAIN_ENGINES_WRAPPING_OPTIMIZER_H_
#define CPPTRAIN_ENGINES_WRAPPING_OPTIMIZER_H_

#include <torch/optim/optimizer.h>

#include <memory>

namespace cpptrain {

class WrappingOptimizer : public torch::optim::Optimizer {
 public:
  explicit WrappingOptimizer(std::unique_ptr<torch::optim::Optimizer> inner);

  torch::Tensor step(LossClosure closure = nullptr) override;
  torch::optim::Optimizer& inner() { return *inner_; }

 protected:
  // The groups' options (the learning rate the Trainer set) into the inner optimizer's groups.
  void CopyOptionsToInner();

  std::unique_ptr<torch::optim::Optimizer> inner_;
};

}  // namespace cpptrain

#endif  // CPPTRAIN_ENGINES_WRAPPING_OPTIMIZER_H_
