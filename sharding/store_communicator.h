// The Communicator for CPU tensors in builds without Gloo: every collective moves its bytes
// through the c10d::Store the ranks rendezvoused on (a TCPStore in real runs), one key per
// contribution. It is slow (every byte crosses the store's server, each collective costs a few
// round trips) but real, across threads or processes, and meant for test-sized tensors (KBs to
// a few MB): it lets the multi-process DDP and FSDP tests run on the CPU of a GPU host, whose
// pip LibTorch ships no Gloo.
//
// CreateCommunicatorForDevice (sharding/rendezvous.h) picks it for CPU tensors when the build
// has no Gloo, or in any build when the environment says CPPTRAIN_CPU_COMM=store
// (CPPTRAIN_CPU_COMM=gloo insists on Gloo; unset picks Gloo where it exists).
//
// A value longer than Create's max_value_bytes (default 4 MiB) is stored in pieces of at most
// that size: LibTorch 2.x's TCPStore server (libuv) closes the connection of a client that sends
// a value over 8 MiB, which a 16 MiB embedding all-gather did on the GPU host.
//
// Rank 0 of the communicator ends each collective last, once every peer has made its last store
// request for it, so the process hosting the TCPStore (rank 0 under ConnectStore) may exit
// right after its last collective. A group that does not contain that process (a mesh's other
// groups) must finish before it exits: end with a collective over all ranks.
//
// Every collective runs to completion inside the call and returns a finished Work: Wait() and
// Synchronize() return at once with the collective's status (a timeout or a lost store comes
// back there; bad arguments come back from the call, before any communication). Reductions run
// in rank order on every rank, so all ranks get bitwise equal results; bfloat16 and float16
// are reduced in float32, other floating types in their own precision, integers exactly; avg
// divides the sum by size() (floating-point dtypes only). Reductions take Float, Double,
// BFloat16, Half, Int and Long; data movement takes any dtype. Tensors may be non-contiguous
// (they are copied), except where communicator.h asks for contiguous ones.
//
//   CT_ASSIGN_OR_RETURN(std::unique_ptr<StoreCommunicator> comm,
//                       StoreCommunicator::Create(store, rank, world, std::chrono::seconds(60)));
//   CT_ASSIGN_OR_RETURN(auto work, comm->AllReduce(grad, ReduceOp::kAvg));
//   CT_RETURN_IF_ERROR(work->Wait());   // returns at once: grad already holds the mean
#ifndef CPPTRAIN_SHARDING_STORE_COMMUNICATOR_H_
#define CPPTRAIN_SHARDING_STORE_COMMUNICATOR_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "sharding/communicator.h"

namespace cpptrain {

namespace store_internal {
class Round;
}  // namespace store_internal

class StoreCommunicator : public Communicator {
 public:
  // Joins the group of `size` ranks meeting in `store` (give each group its own store, e.g. a
  // c10d::PrefixStore; communicators created one after another on one store each get their own
  // keys, provided every rank creates them in the same order). Blocks until every rank of the
  // group has called Create, at most `timeout`, which also bounds each later collective.
  static absl::StatusOr<std::unique_ptr<StoreCommunicator>> Create(
      c10::intrusive_ptr<c10d::Store> store, int rank, int size, std::chrono::milliseconds timeout,
      int64_t max_value_bytes = kDefaultMaxValueBytes);

  static constexpr int64_t kDefaultMaxValueBytes = int64_t{4} << 20;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "store"; }
  std::optional<c10::Device> device() const override { return c10::Device(c10::kCPU); }

  // Each returns a finished Work (see above). After a failed communication (timeout, lost
  // store, ranks calling different collectives) the communicator refuses further collectives:
  // the ranks no longer agree on which collective comes next.
  absl::StatusOr<std::unique_ptr<Work>> AllReduce(at::Tensor& tensor, ReduceOp op) override;
  absl::StatusOr<std::unique_ptr<Work>> AllGather(const at::Tensor& input,
                                                  at::Tensor& output) override;
  absl::StatusOr<std::unique_ptr<Work>> ReduceScatter(const at::Tensor& input, at::Tensor& output,
                                                      ReduceOp op) override;
  absl::StatusOr<std::unique_ptr<Work>> Broadcast(at::Tensor& tensor, int root) override;
  absl::StatusOr<std::unique_ptr<Work>> Scatter(const at::Tensor& input, at::Tensor& output,
                                                int root) override;
  // One exchange for all the tensors, whatever their dtypes.
  absl::StatusOr<std::unique_ptr<Work>> AllReduceCoalesced(std::vector<at::Tensor>& tensors,
                                                           ReduceOp op) override;
  absl::StatusOr<std::unique_ptr<Work>> AllGatherCoalesced(
      const std::vector<at::Tensor>& inputs, std::vector<at::Tensor>& outputs) override;
  absl::StatusOr<std::unique_ptr<Work>> ReduceScatterCoalesced(
      const std::vector<at::Tensor>& inputs, std::vector<at::Tensor>& outputs,
      ReduceOp op) override;
  absl::Status Barrier() override;

 private:
  StoreCommunicator(c10::intrusive_ptr<c10d::Store> store, std::string key_prefix, int rank,
                    int size, std::chrono::milliseconds timeout, int64_t max_value_bytes);

  // Runs `body` as the next collective, named `op` in errors: gives it the next sequence
  // number, and marks the communicator failed when `body` fails.
  absl::Status Run(const char* op, const std::function<absl::Status(store_internal::Round&)>& body);

  absl::Status Join();

  c10::intrusive_ptr<c10d::Store> store_;
  std::string key_prefix_;  // "store_comm/<generation>/"
  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  int64_t max_value_bytes_;  // longer values go in pieces

  std::mutex mu_;  // Serializes collectives: their numbers must follow the issue order.
  int64_t next_sequence_ = 0;
  absl::Status failure_;  // The first failed communication; OK until then.
};

}  // namespace cpptrain

#endif  // CPPTRAIN_SHARDING_STORE_COMMUNICATOR_H_
