// The Communicator for CPU tensors, on LibTorch's c10d Gloo process group. Debian's LibTorch
// 1.13 Gloo lacks what the interface needs in places, so this class fills the gaps:
//   - no flat all-gather (_allgather_base): the list form gathers into views of the output;
//   - no reduce-scatter: an all-to-all of bytes, then each rank reduces its chunk locally;
//   - no bfloat16 anywhere: data movement runs on byte views, reductions run in float32
//     (float16 too, for the same accuracy);
//   - no ReduceOp.AVG: a sum, then a division (floating-point dtypes only).
// Dtypes: float32, float64, bfloat16, float16, int32, int64; tensors must be contiguous CPU
// tensors.
//
//   CT_ASSIGN_OR_RETURN(std::unique_ptr<GlooCommunicator> comm,
//                       GlooCommunicator::Create(store, rank, world, std::chrono::seconds(60)));
//   CT_ASSIGN_OR_RETURN(auto work, comm->AllReduce(grad, ReduceOp::kAvg));
//   CT_RETURN_IF_ERROR(work->Wait());   // blocks until grad holds the mean over ranks
#ifndef CPPTRAIN_SHARDING_GLOO_COMMUNICATOR_H_
#define CPPTRAIN_SHARDING_GLOO_COMMUNICATOR_H_

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "absl/status/statusor.h"
#include "sharding/communicator.h"

namespace c10d {
class ProcessGroupGloo;
}  // namespace c10d

namespace cpptrain {

// Which network device Gloo binds, decided from the environment:
// GLOO_SOCKET_IFNAME (comma-separated interfaces) if set; else 127.0.0.1 when MASTER_ADDR is
// unset or a loopback address; else the address this machine's hostname resolves to.
struct GlooDeviceChoice {
  enum class Kind { kInterfaces, kLoopback, kHostname };
  Kind kind;
  std::vector<std::string> interfaces;  // kInterfaces only.
  std::string Describe() const;
};
GlooDeviceChoice ChooseGlooDevice(const std::function<const char*(const char*)>& getenv);

class GlooCommunicator : public Communicator {
 public:
  // Joins the group of `size` ranks whose rendezvous keys live in `store` (give each group its
  // own store, e.g. a c10d::PrefixStore). Blocks until every rank of the group has connected
  // (a barrier closes it), at most `timeout`; `timeout` also bounds every later collective.
  // Sets SIGPIPE to SIG_IGN when it has the default action, so that a peer dying mid-write is
  // an error status on this rank rather than a signal that kills it.
  static absl::StatusOr<std::unique_ptr<GlooCommunicator>> Create(
      c10::intrusive_ptr<c10d::Store> store, int rank, int size, std::chrono::milliseconds timeout);

  // Blocks until Gloo's worker threads have drained this rank's queued collectives.
  ~GlooCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "gloo"; }
  std::optional<c10::Device> device() const override { return c10::Device(c10::kCPU); }

  // Each collective validates its tensors before any communication (an error then means no
  // rank needs to match the call), queues the work on Gloo's worker threads and returns at
  // once. Post-processing (copy-back, division, local reduction) runs on the worker thread
  // when the transfer ends; Work::Wait() and Work::Synchronize() block until it has.
  absl::StatusOr<std::unique_ptr<Work>> AllReduce(at::Tensor& tensor, ReduceOp op) override;
  absl::StatusOr<std::unique_ptr<Work>> AllGather(const at::Tensor& input,
                                                  at::Tensor& output) override;
  absl::StatusOr<std::unique_ptr<Work>> ReduceScatter(const at::Tensor& input, at::Tensor& output,
                                                      ReduceOp op) override;
  absl::StatusOr<std::unique_ptr<Work>> Broadcast(at::Tensor& tensor, int root) override;
  absl::StatusOr<std::unique_ptr<Work>> Scatter(const at::Tensor& input, at::Tensor& output,
                                                int root) override;
  // One Gloo collective per distinct reduction dtype (AllReduceCoalesced) or in all
  // (AllGatherCoalesced, ReduceScatterCoalesced: tensors of any dtypes travel as bytes).
  absl::StatusOr<std::unique_ptr<Work>> AllReduceCoalesced(std::vector<at::Tensor>& tensors,
                                                           ReduceOp op) override;
  absl::StatusOr<std::unique_ptr<Work>> AllGatherCoalesced(
      const std::vector<at::Tensor>& inputs, std::vector<at::Tensor>& outputs) override;
  absl::StatusOr<std::unique_ptr<Work>> ReduceScatterCoalesced(
      const std::vector<at::Tensor>& inputs, std::vector<at::Tensor>& outputs,
      ReduceOp op) override;
  // Waits for this rank's earlier collectives too.
  absl::Status Barrier() override;

 private:
  GlooCommunicator(c10::intrusive_ptr<c10d::ProcessGroupGloo> pg, int rank, int size);

  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
  int rank_;
  int size_;
};

}  // namespace cpptrain

#endif  // CPPTRAIN_SHARDING_GLOO_COMMUNICATOR_H_
