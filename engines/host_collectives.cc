#include "engines/host_collectives.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <memory>
#include <optional>

#include "base/status.h"

namespace cpptrain {
namespace {

// Values from the host need nothing the step's stream has queued: on a CUDA device their
// copies and collectives run on a pool stream, so the host waits for them alone and not for the
// step queued before them (a token count would otherwise drain the device before every step).
// A high-priority one: the Trainer's CUDA-graph side stream comes from the low-priority pool.
// `host_values` false (values already on a device): stays on the current stream, which made them.
class OffTheStepStream {
 public:
  explicit OffTheStepStream(c10::Device device, bool host_values = true) {
    if (!device.is_cuda() || !host_values) return;
    const c10::impl::VirtualGuardImpl impl(device.type());
    c10::Stream stream = impl.getStreamFromGlobalPool(device, /*isHighPriority=*/true);
    if (stream == impl.getStream(device)) {  // the pool came round to the current stream
      stream = impl.getStreamFromGlobalPool(device, /*isHighPriority=*/true);
    }
    guard_.emplace(stream);
  }

 private:
  std::optional<c10::StreamGuard> guard_;
};

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
  OffTheStepStream off(device, values.is_cpu());
  at::Tensor on_device = values.to(device, /*non_blocking=*/false, /*copy=*/true);
  CT_RETURN_IF_ERROR(AllReduceInPlace(comms, on_device, ReduceOp::kSum));
  return on_device.cpu();
}

absl::StatusOr<at::Tensor> AllGatherOver(const std::vector<Communicator*>& comms,
                                         c10::Device device, const at::Tensor& values) {
  OffTheStepStream off(device, values.is_cpu());
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
  OffTheStepStream off(device);
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
