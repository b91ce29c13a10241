// A test model whose two units share one weight: `a.w` and `b.w` are the same tensor, registered
// under both names (weights tied across units), or, untied, two equal copies. Its forward runs each unit through its hook, so
// sharding engines see the tie as real models present it.
//
//   auto model = std::make_shared<testing::TiedBlocks>(/*seed=*/1);
//   torch::Tensor loss = model->LossSum(model->Forward(batch), batch);   // batch: [B, 4] floats
#ifndef CPPTRAIN_MODULE_TESTING_TIED_BLOCKS_H_
#define CPPTRAIN_MODULE_TESTING_TIED_BLOCKS_H_

#include <ATen/CPUGeneratorImpl.h>
#include <torch/types.h>

#include <memory>
#include <string>
#include <vector>

#include "module/trainable_model.h"

namespace cpptrain {
namespace testing {

// tanh(x W^T + b), with W given (shared) and b its own.
class TiedBlock : public Unit {
 public:
  explicit TiedBlock(const torch::Tensor& shared) : Unit("Block") {
    w_ = register_parameter("w", shared);
    b_ = register_parameter("b", torch::full({shared.size(0)}, 0.1));
  }
  torch::Tensor Forward(torch::Tensor x) {
    return Hooked(std::move(x),
                  [this](const torch::Tensor& h) { return torch::tanh(h.matmul(w_.t()) + b_); });
  }

 private:
  torch::Tensor w_, b_;
};

class TiedBlocks : public TrainableModel {
 public:
  static constexpr int64_t kWidth = 4;

  // `tied` false gives b its own copy of the weight (equal at the start): the same model
  // without the tie, for tests of something else.
  explicit TiedBlocks(uint64_t seed, bool tied = true) : TrainableModel("TiedBlocks") {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
    const torch::Tensor shared = at::randn({kWidth, kWidth}, generator) * 0.5;
    a_ = register_module("a", std::make_shared<TiedBlock>(shared));
    b_ = register_module("b", std::make_shared<TiedBlock>(tied ? shared : shared.detach().clone()));
  }
  torch::Tensor Forward(const Batch& batch) override {
    return Hooked(batch.inputs,
                  [this](const torch::Tensor& x) { return b_->Forward(a_->Forward(x)); });
  }
  // Sum of squares of the outputs of every sample whose label is not kIgnoreIndex.
  torch::Tensor LossSum(const torch::Tensor& logits, const Batch& batch) const override {
    const torch::Tensor keep = batch.labels.ne(kIgnoreIndex).to(logits.dtype()).unsqueeze(1);
    return (logits.square() * keep).sum().to(torch::kFloat);
  }
  int64_t CountLossTargets(const Batch& batch) const override {
    return batch.labels.ne(kIgnoreIndex).sum().item<int64_t>();
  }
  std::vector<std::string> LayerUnitClasses() const override { return {"Block"}; }

  // `rows` samples of width kWidth drawn from `seed`, labels 0.
  static Batch Inputs(int64_t rows, uint64_t seed) {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
    Batch batch;
    batch.inputs = at::randn({rows, kWidth}, generator);
    batch.labels = torch::zeros({rows}, torch::kLong);
    return batch;
  }

 private:
  std::shared_ptr<TiedBlock> a_, b_;
};

}  // namespace testing
}  // namespace cpptrain

#endif  // CPPTRAIN_MODULE_TESTING_TIED_BLOCKS_H_
