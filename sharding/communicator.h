// One interface for moving tensors between ranks: NCCL for CUDA tensors, Gloo (LibTorch's
// c10d) for CPU tensors. Every collective is asynchronous and returns a Work handle.
//
// Stream contract (CUDA): a collective first makes the communicator's internal stream for its
// kind wait on an event recorded on the caller's current stream (so its inputs are ready),
// then runs there; Work::Wait() makes the caller's current stream wait on an event recorded
// after the collective. Neither blocks the host. Work::Synchronize() blocks the host.
// CPU (Gloo): Wait() and Synchronize() both block until the collective is done.
// Tensors passed to a collective must stay alive and untouched until Wait() returns; the Work
// keeps their storage alive until then.
//
//   CT_ASSIGN_OR_RETURN(auto work, comm->AllReduce(grad, ReduceOp::kSum));
//   ... more compute on the current stream ...
//   CT_RETURN_IF_ERROR(work->Wait());        // later kernels see the reduced gradient
//
//   // ZeRO/FSDP: output holds size() * input.numel() elements, rank r's part at r * n.
//   CT_ASSIGN_OR_RETURN(auto ag, comm->AllGather(shard, full));
#ifndef CPPTRAIN_SHARDING_COMMUNICATOR_H_
#define CPPTRAIN_SHARDING_COMMUNICATOR_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace cpptrain {

enum class ReduceOp { kSum, kAvg, kMax };

const char* ReduceOpName(ReduceOp op);

class Work {
 public:
  virtual ~Work() = default;
  // CUDA: the caller's current stream waits for the collective (no host sync). CPU: blocks.
  // An error names the collective and the rank (a timeout, a dead peer).
  virtual absl::Status Wait() = 0;
  // Blocks the host until the collective is done.
  virtual absl::Status Synchronize() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "nccl" or "gloo".
  virtual std::string backend() const = 0;
  // The device every tensor passed in must live on (NCCL: its GPU; Gloo: the CPU); unset for
  // communicators that take any.
  virtual std::optional<c10::Device> device() const { return std::nullopt; }

  // In place: every rank ends with the reduction of all ranks' `tensor`.
  virtual absl::StatusOr<std::unique_ptr<Work>> AllReduce(at::Tensor& tensor, ReduceOp op) = 0;

  // `output` (contiguous, same dtype and device) has size() * input.numel() elements; rank r's
  // input lands at [r * n, (r + 1) * n). `input` may be the matching slice of `output`.
  virtual absl::StatusOr<std::unique_ptr<Work>> AllGather(const at::Tensor& input,
                                                          at::Tensor& output) = 0;

  // `input` (contiguous) has size() * output.numel() elements; rank r receives the reduction
  // over ranks of input[r * n, (r + 1) * n).
  virtual absl::StatusOr<std::unique_ptr<Work>> ReduceScatter(const at::Tensor& input,
                                                              at::Tensor& output,
                                                              ReduceOp op) = 0;

  // In place: every rank ends with `root`'s tensor.
  virtual absl::StatusOr<std::unique_ptr<Work>> Broadcast(at::Tensor& tensor, int root) = 0;

  // `root`'s `input` (contiguous, size() * output.numel() elements) is cut into size() equal
  // parts and rank r receives part r in `output`; only those parts cross the links. `input` is
  // read on `root` only (other ranks may pass an undefined tensor).
  virtual absl::StatusOr<std::unique_ptr<Work>> Scatter(const at::Tensor& input,
                                                        at::Tensor& output, int root) = 0;

  // Grouped forms: the collectives are issued together as one (one NCCL group launch) and
  // complete together.
  virtual absl::StatusOr<std::unique_ptr<Work>> AllReduceCoalesced(
      std::vector<at::Tensor>& tensors, ReduceOp op) = 0;
  virtual absl::StatusOr<std::unique_ptr<Work>> AllGatherCoalesced(
      const std::vector<at::Tensor>& inputs, std::vector<at::Tensor>& outputs) = 0;
  virtual absl::StatusOr<std::unique_ptr<Work>> ReduceScatterCoalesced(
      const std::vector<at::Tensor>& inputs, std::vector<at::Tensor>& outputs, ReduceOp op) = 0;

  // Blocks until every rank has reached it.
  virtual absl::Status Barrier() = 0;

  // CUDA: holds everything queued so far on the caller's current stream to the collectives'
  // timeout, as each collective is held (a replayed CUDA graph's collectives were queued
  // during its capture, so nothing else watches them): when that work outlives the timeout,
  // the communicator fails as on a collective's. `what` names the work in that error. Others:
  // nothing to do.
  virtual absl::Status WatchQueuedWork(const std::string& what) {
    (void)what;
    return absl::OkStatus();
  }
};

}  // namespace cpptrain

#endif  // CPPTRAIN_SHARDING_COMMUNICATOR_H_
