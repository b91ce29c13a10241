#include "sharding/testing/communicator_host_group.h"

#include <vector>

#include "base/status.h"

namespace cpptrain {

absl::StatusOr<torch::Tensor> CommunicatorHostGroup::AllReduceSum(const torch::Tensor& values) {
  torch::Tensor sum = values.clone();
  CT_ASSIGN_OR_RETURN(std::unique_ptr<Work> work, comm_->AllReduce(sum, ReduceOp::kSum));
  CT_RETURN_IF_ERROR(work->Synchronize());
  return sum;
}

absl::StatusOr<torch::Tensor> CommunicatorHostGroup::AllGather(const torch::Tensor& values) {
  std::vector<int64_t> shape = values.sizes().vec();
  shape[0] *= comm_->size();
  torch::Tensor all = torch::empty(shape, values.options());
  CT_ASSIGN_OR_RETURN(std::unique_ptr<Work> work, comm_->AllGather(values.contiguous(), all));
  CT_RETURN_IF_ERROR(work->Synchronize());
  return all;
}

}  // namespace cpptrain
