// A HostGroup over one Communicator, for tests of code that takes the host collectives the
// engines provide (AllRanksOk, DivergenceWatch) with ranks as threads.
//
//   CommunicatorHostGroup group(std::move(comm));   // e.g. a GlooCommunicator of one rank
//   absl::Status agreed = AllRanksOk(local, group);
#ifndef CPPTRAIN_SHARDING_TESTING_COMMUNICATOR_HOST_GROUP_H_
#define CPPTRAIN_SHARDING_TESTING_COMMUNICATOR_HOST_GROUP_H_

#include <memory>

#include "absl/status/statusor.h"
#include "sharding/communicator.h"
#include "sharding/host_group.h"

namespace cpptrain {

class CommunicatorHostGroup : public HostGroup {
 public:
  explicit CommunicatorHostGroup(std::unique_ptr<Communicator> comm) : comm_(std::move(comm)) {}
  int rank() const override { return comm_->rank(); }
  int world_size() const override { return comm_->size(); }
  // Each waits for its collective (Work::Synchronize) before it returns.
  absl::StatusOr<torch::Tensor> AllReduceSum(const torch::Tensor& values) override;
  absl::StatusOr<torch::Tensor> AllGather(const torch::Tensor& values) override;

 private:
  std::unique_ptr<Communicator> comm_;
};

}  // namespace cpptrain

#endif  // CPPTRAIN_SHARDING_TESTING_COMMUNICATOR_HOST_GROUP_H_
