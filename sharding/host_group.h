// The ranks of a job as the host sees them: rank, world size, and the few collectives over
// small CPU tensors that bookkeeping needs (checkpoint checksums and barriers, the Trainer's
// token counts, evaluation sums). Engines are host groups; so is one process on its own, for
// tools and tests that need no engine.
//
//   CT_ASSIGN_OR_RETURN(torch::Tensor sum, group.AllReduceSum(torch::ones({1}, kFloat64)));
//   CT_RETURN_IF_ERROR(group.Barrier());
//   SingleProcessGroup alone;              // rank 0 of 1: collectives return their input
#ifndef CPPTRAIN_SHARDING_HOST_GROUP_H_
#define CPPTRAIN_SHARDING_HOST_GROUP_H_

#include <torch/types.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace cpptrain {

class HostGroup {
 public:
  virtual ~HostGroup() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // Sums `values` (a CPU float64 tensor) over all ranks; identity on one process.
  virtual absl::StatusOr<torch::Tensor> AllReduceSum(const torch::Tensor& values) = 0;

  // Gathers every rank's `values` (CPU tensors of equal shape) along dim 0, in rank order.
  virtual absl::StatusOr<torch::Tensor> AllGather(const torch::Tensor& values) = 0;

  // Returns once every rank has called it (an AllReduceSum of nothing).
  absl::Status Barrier() { return AllReduceSum(torch::zeros({1}, torch::kFloat64)).status(); }
};

// One process: rank 0 of 1.
class SingleProcessGroup : public HostGroup {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  absl::StatusOr<torch::Tensor> AllReduceSum(const torch::Tensor& values) override {
    return values;
  }
  absl::StatusOr<torch::Tensor> AllGather(const torch::Tensor& values) override { return values; }
};

}  // namespace cpptrain

#endif  // CPPTRAIN_SHARDING_HOST_GROUP_H_
