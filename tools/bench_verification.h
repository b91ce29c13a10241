// What tools/bench gives tools/bench_compare.py to check that two sides trained the same thing
// and that the check could fail: a token stream the model can learn within a benchmark's few
// steps (so a side whose optimizer did nothing ends at another loss), and a checksum of the
// trained parameters.
//
//   auto data = std::make_shared<MarkovTokens>(samples, seq_len, vocab);   // or RandomTokens
//   ... train ...
//   CT_ASSIGN_OR_RETURN(double checksum, ParameterSquareSum(model, engine));  // every rank
#ifndef CPPTRAIN_TOOLS_BENCH_VERIFICATION_H_
#define CPPTRAIN_TOOLS_BENCH_VERIFICATION_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "engines/engine.h"
#include "module/trainable_model.h"
#include "trainer/data/dataset.h"

namespace cpptrain {

// Uniform token ids over the whole vocabulary, drawn from the sample's index: nothing to learn
// (the initial model already predicts about uniformly), so the loss barely moves.
class RandomTokens : public Dataset {
 public:
  RandomTokens(int64_t size, int64_t seq_len, int64_t vocab);
  int64_t size() const override { return size_; }
  Example Get(int64_t index) const override;

 private:
  int64_t size_, seq_len_, vocab_;
};

// A first-order Markov chain over the first kStates ids (all of them in a smaller vocabulary):
// each next id is the current one's fixed successor (one random permutation for every sample)
// with probability kFollow, else uniform over the states. Drawn from the sample's index. A
// freshly initialized model first learns which ids occur, then the successors, so the loss
// falls from about ln(vocab) within a few optimizer steps.
class MarkovTokens : public Dataset {
 public:
  static constexpr int64_t kStates = 512;
  static constexpr double kFollow = 0.75;

  MarkovTokens(int64_t size, int64_t seq_len, int64_t vocab);
  int64_t size() const override { return size_; }
  Example Get(int64_t index) const override;
  // The successor of each state (for tests).
  const std::vector<int64_t>& successors() const { return successor_; }

 private:
  int64_t size_, seq_len_;
  std::vector<int64_t> successor_;
};

// Sum over the model's parameters (each tensor once, tied ones too) of the squares of their
// full values, in fp64, with the engine's full-precision masters exposed
// (Engine::ExposeMasterWeights) and sharded parameters gathered whole. Collective: every rank
// calls it and gets the same value. Gathers one parameter at a time, on the CPU.
absl::StatusOr<double> ParameterSquareSum(TrainableModel& model, Engine& engine);

}  // namespace cpptrain

#endif  // CPPTRAIN_TOOLS_BENCH_VERIFICATION_H_
