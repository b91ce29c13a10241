#include "engines/host_collectives.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <memory>

#include "base/status.h"

namespace cpptrain {
namespace {

absl::Status AllReduceInPlace(const std::vector<Communicator*>& comms, at::Tensor& t,
                              ReduceOp op) {
  for (Communicator* comm : comms) {
    if (comm == nullptr) continue;
    CT_ASSIGN_OR_RETURN(std::unique_ptr<Work> work, comm->AllReduce(t, op));
    CT_RETURN_IF_ERROR(work->Synchronize());
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<at::Tensor> AllReduceSumOver(const std::vector<Communicator*>& comms,
                                            c10::Device device, const at::Tensor& values) {
  at::Tensor on_device = values.to(device, /*non_blocking=*/false, /*copy=*/true);
  CT_RETURN_IF_ERROR(AllReduceInPlace(comms, on_device, ReduceOp::kSum));
  return on_device.cpu();
}

absl::StatusOr<at::Tensor> AllGatherOver(const std::vector<Communicator*>& comms,
                                         c10::Device device, const at::Tensor& values) {
  at::Tensor gathered = values.contiguous().to(device);
  for (Communicator* comm : comms) {
    if (comm == nullptr) continue;
    std::vector<int64_t> shape = gathered.sizes().vec();
    if (shape.empty()) shape.push_back(1);
    shape[0] *= comm->size();
    at::Tensor output = at::empty(shape, gathered.options());
    CT_ASSIGN_OR_RETURN(std::unique_ptr<Work> work, comm->AllGather(gathered, output));
    CT_RETURN_IF_ERROR(work->Synchronize());
    gathered = output;
  }
  return gathered.cpu();
}

absl::StatusOr<bool> AllRanksFiniteOver(const std::vector<Communicator*>& comms,
                                        c10::Device device, bool local_finite) {
  at::Tensor flag =
      at::full({1}, local_finite ? 0.0 : 1.0, at::TensorOptions().dtype(at::kFloat).device(device));
  CT_RETURN_IF_ERROR(AllReduceInPlace(comms, flag, ReduceOp::kMax));
  return flag.cpu().item<float>() == 0.0f;
}

absl::Status BroadcastFromRank0(Communicator& comm, const std::vector<at::Tensor>& tensors) {
  at::NoGradGuard no_grad;
  for (const at::Tensor& t : tensors) {
    at::Tensor data = t.detach();
    CT_ASSIGN_OR_RETURN(std::unique_ptr<Work> work, comm.Broadcast(data, 0));
    CT_RETURN_IF_ERROR(work->Wait());
  }
  return absl::OkStatus();
}

}  // namespace cpptrain
