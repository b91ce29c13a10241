// NCCL for CUDA tensors, behind the Communicator interface (sharding/communicator.h).
// Compiled only in CUDA builds with NCCL (CMake defines CPPTRAIN_HAS_NCCL).
//
// One NCCL communicator, and one high-priority CUDA stream, per collective kind (all-reduce and
// broadcast; all-gather; reduce-scatter), so an all-gather and a reduce-scatter run at the
// same time. The first is set up from a unique id rank 0 publishes through the store; the
// other two are split from it (ncclCommSplit, one color), without a bootstrap of their own. Ordering is by CUDA events only: a collective's stream waits on an event
// recorded on the caller's current stream; Work::Wait() makes the caller's current stream
// wait on the collective's completion event. The NCCL communicators are non-blocking, so no
// host call waits on a peer: setup, and a collective's first connection to its peers, are
// polled against the timeout. A watchdog thread aborts every NCCL communicator
// (ncclCommAbort) when a collective outlives the timeout or NCCL reports an asynchronous
// error, and the pending Works then fail naming the collective and the rank. A collective
// issued while the caller's stream is being captured into a CUDA graph is only recorded, so
// the watchdog leaves it alone; WatchQueuedWork watches the replays instead.
//
//   CT_ASSIGN_OR_RETURN(auto comm, NcclCommunicator::Create(store, rank, world, device, 600s));
//   CT_ASSIGN_OR_RETURN(auto work, comm->ReduceScatter(flat_grads, shard, ReduceOp::kAvg));
//   CT_RETURN_IF_ERROR(work->Wait());
#ifndef CPPTRAIN_SHARDING_NCCL_COMMUNICATOR_H_
#define CPPTRAIN_SHARDING_NCCL_COMMUNICATOR_H_

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "sharding/communicator.h"

namespace cpptrain {

class NcclCommunicator : public Communicator {
 public:
  enum Kind { kReduce = 0, kGather = 1, kScatter = 2, kNumKinds = 3 };

  // Collective over `size` ranks on CUDA device `device`: rank 0 publishes the NCCL unique ids
  // through `store` (use a PrefixStore per group).
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(
      c10::intrusive_ptr<c10d::Store> store, int rank, int size, int device,
      std::chrono::milliseconds timeout);
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }
  std::optional<c10::Device> device() const override {
    return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(device_));
  }

  absl::StatusOr<std::unique_ptr<Work>> AllReduce(at::Tensor& tensor, ReduceOp op) override;
  absl::StatusOr<std::unique_ptr<Work>> AllGather(const at::Tensor& input,
                                                  at::Tensor& output) override;
  absl::StatusOr<std::unique_ptr<Work>> ReduceScatter(const at::Tensor& input, at::Tensor& output,
                                                      ReduceOp op) override;
  absl::StatusOr<std::unique_ptr<Work>> Broadcast(at::Tensor& tensor, int root) override;
  // Point-to-point inside one NCCL group: the root sends each rank its part (and copies its
  // own on its stream).
  absl::StatusOr<std::unique_ptr<Work>> Scatter(const at::Tensor& input, at::Tensor& output,
                                                int root) override;
  absl::StatusOr<std::unique_ptr<Work>> AllReduceCoalesced(std::vector<at::Tensor>& tensors,
                                                           ReduceOp op) override;
  absl::StatusOr<std::unique_ptr<Work>> AllGatherCoalesced(
      const std::vector<at::Tensor>& inputs, std::vector<at::Tensor>& outputs) override;
  absl::StatusOr<std::unique_ptr<Work>> ReduceScatterCoalesced(
      const std::vector<at::Tensor>& inputs, std::vector<at::Tensor>& outputs,
      ReduceOp op) override;
  absl::Status Barrier() override;
  absl::Status WatchQueuedWork(const std::string& what) override;

  // Why the communicator was aborted; OK while healthy.
  absl::Status health() const;

  struct State;  // NCCL handles, streams and the watchdog's list (nccl_communicator.cc)

 private:
  NcclCommunicator(int rank, int size, int device, std::chrono::milliseconds timeout);
  // Sets up the communicator of `kind` from a unique id exchanged through `store`.
  absl::Status InitFromUniqueId(c10d::Store& store, Kind kind);
  // Sets up the communicator of `kind` as a split of `parent`'s (same ranks).
  absl::Status SplitFrom(Kind parent, Kind kind);

  int rank_;
  int size_;
  int device_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<State> state_;
  std::thread watchdog_;
};

}  // namespace cpptrain

#endif  // CPPTRAIN_SHARDING_NCCL_COMMUNICATOR_H_
