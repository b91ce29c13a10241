// Shared pieces of the engine tests: a plain SGD optimizer factory, and what one SGD step of
// the tied-weights test model (module/testing/tied_blocks.h) must give, computed on one
// unsharded model with plain autograd.
//
//   SgdReference want = TiedBlocksSgdStep({batch0, batch1}, /*lr=*/0.5, /*max_norm=*/0);
//   ... engine->Backward(...); norm = engine->ClipGradNorm(0); engine->OptimizerStep();
//   EXPECT_NEAR(norm->item<double>(), want.norm, 1e-6);
//   EXPECT_TRUE(torch::allclose(model.named_parameters()["a.w"], want.params.at("a.w")));
#ifndef CPPTRAIN_ENGINES_TESTING_ENGINE_TESTING_H_
#define CPPTRAIN_ENGINES_TESTING_ENGINE_TESTING_H_

#include <map>
#include <string>
#include <vector>

#include "engines/engine.h"
#include "module/batch.h"

namespace cpptrain {
namespace testing {

// torch::optim::SGD at `lr` over the parameters it is given; `count`, when set, receives how
// many it was given.
OptimizerFactory SgdFactory(double lr, int* count = nullptr);

struct SgdReference {
  std::map<std::string, at::Tensor> params;  // every name, after the step
  double norm = 0;                           // global gradient norm before clipping
};

// TiedBlocks(seed 1, tied) after one SGD step on the summed loss of `batches` (one per rank),
// clipped to `max_norm` when it is positive, the tied weight stepped once.
SgdReference TiedBlocksSgdStep(const std::vector<Batch>& batches, double lr, double max_norm,
                               bool tied = true);

}  // namespace testing
}  // namespace cpptrain

#endif  // CPPTRAIN_ENGINES_TESTING_ENGINE_TESTING_H_
