// A communicator for device tensors that moves them through host memory and a CPU
// communicator (Gloo or the store): what stands in for NCCL where NCCL cannot run, such as
// several processes sharing one GPU (NCCL refuses that: "Duplicate GPU detected"). It lets
// the multi-process tests run the engines' CUDA paths on a machine with one GPU. It is slow
// (every collective crosses PCIe twice and the host waits for it), meant for tests.
//
// It keeps NCCL's contract (sharding/communicator.h) on the device side: a collective copies
// its inputs to host memory once the caller's current stream has produced them (the host
// waits for that copy), then issues the CPU collective; Wait() waits for the CPU collective,
// copies the results back on the staging stream and makes the caller's current stream wait
// for that copy, without blocking the host on it. Synchronize() also blocks the host until
// the results are in place. It refuses what NCCL refuses (tensors on another device,
// non-contiguous tensors) and cannot be captured into a CUDA graph (the host takes part).
// Argument checks of sizes, dtypes and roots are the CPU communicator's, run on the host
// copies before any communication, so its errors name that communicator.
//
//   CT_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> gloo,
//                       GlooCommunicator::Create(store, rank, size, timeout));
//   CT_ASSIGN_OR_RETURN(auto comm, StagedCommunicator::Create(std::move(gloo),
//                                                             CudaStaging(/*device=*/0, {})));
//   CT_ASSIGN_OR_RETURN(auto work, comm->AllReduce(cuda_grad, ReduceOp::kSum));
//   CT_RETURN_IF_ERROR(work->Wait());   // the current stream sees the reduced gradient
//
// CpuStaging() stages CPU tensors (copies in host memory): the same code path without a GPU,
// which the CPU tests run through the communicator conformance suite.
#ifndef CPPTRAIN_SHARDING_STAGED_COMMUNICATOR_H_
#define CPPTRAIN_SHARDING_STAGED_COMMUNICATOR_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "sharding/communicator.h"

namespace cpptrain {

// How tensors of one device reach host memory and come back.
class DeviceStaging {
 public:
  virtual ~DeviceStaging() = default;
  // The device whose tensors this stages.
  virtual c10::Device device() const = 0;
  // Contiguous host tensors shaped as `tensors` (each on device()); tensor i holds its values
  // when copy[i], else is uninitialized. Returns once the copies are complete; they include
  // everything the caller's current stream queued before the call.
  virtual absl::StatusOr<std::vector<at::Tensor>> ToHost(const std::vector<at::Tensor>& tensors,
                                                         const std::vector<bool>& copy) = 0;
  // Copies host[i] into device[i] and makes the caller's current stream wait for the copies
  // (the host does not wait). Returns a function that blocks the host until they are done.
  virtual absl::StatusOr<std::function<absl::Status()>> FromHost(
      const std::vector<at::Tensor>& host, const std::vector<at::Tensor>& device) = 0;
  // Whether the caller's current stream is being captured into a CUDA graph.
  virtual bool Capturing() const = 0;
};

// Stages CPU tensors: host copies made and copied back by the CPU.
std::unique_ptr<DeviceStaging> CpuStaging();

class StagedCommunicator : public Communicator {
 public:
  // `host` moves CPU tensors (its rank and size are this communicator's).
  static absl::StatusOr<std::unique_ptr<StagedCommunicator>> Create(
      std::unique_ptr<Communicator> host, std::unique_ptr<DeviceStaging> staging);

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  // "staged-" and the host communicator's backend ("staged-gloo").
  std::string backend() const override { return "staged-" + host_->backend(); }
  std::optional<c10::Device> device() const override { return staging_->device(); }

  absl::StatusOr<std::unique_ptr<Work>> AllReduce(at::Tensor& tensor, ReduceOp op) override;
  absl::StatusOr<std::unique_ptr<Work>> AllGather(const at::Tensor& input,
                                                  at::Tensor& output) override;
  absl::StatusOr<std::unique_ptr<Work>> ReduceScatter(const at::Tensor& input, at::Tensor& output,
                                                      ReduceOp op) override;
  absl::StatusOr<std::unique_ptr<Work>> Broadcast(at::Tensor& tensor, int root) override;
  absl::StatusOr<std::unique_ptr<Work>> Scatter(const at::Tensor& input, at::Tensor& output,
                                                int root) override;
  absl::StatusOr<std::unique_ptr<Work>> AllReduceCoalesced(std::vector<at::Tensor>& tensors,
                                                           ReduceOp op) override;
  absl::StatusOr<std::unique_ptr<Work>> AllGatherCoalesced(
      const std::vector<at::Tensor>& inputs, std::vector<at::Tensor>& outputs) override;
  absl::StatusOr<std::unique_ptr<Work>> ReduceScatterCoalesced(
      const std::vector<at::Tensor>& inputs, std::vector<at::Tensor>& outputs,
      ReduceOp op) override;
  absl::Status Barrier() override { return host_->Barrier(); }

 private:
  // One staged call: the host copies of its tensors, the CPU collective issued over them.
  struct Staged;
  using IssueOnHost = std::function<absl::StatusOr<std::unique_ptr<Work>>(Staged&)>;

  StagedCommunicator(std::unique_ptr<Communicator> host, std::unique_ptr<DeviceStaging> staging)
      : host_(std::move(host)), staging_(std::move(staging)) {}

  // Checks that every defined tensor is on the staged device and contiguous (`names` as the
  // errors call them), stages `inputs` (copied) and `outputs` (copied back at Wait; copied in
  // too when `outputs_in_place`), issues `issue` over the host copies.
  absl::StatusOr<std::unique_ptr<Work>> Run(const char* op,
                                            const std::vector<at::Tensor>& inputs,
                                            const std::vector<at::Tensor>& outputs,
                                            bool outputs_in_place, const IssueOnHost& issue);
  absl::Status CheckTensor(const char* op, const at::Tensor& t, const std::string& name) const;

  std::unique_ptr<Communicator> host_;
  // Shared with the Works, which copy results back through it.
  std::shared_ptr<DeviceStaging> staging_;
};

}  // namespace cpptrain

#endif  // CPPTRAIN_SHARDING_STAGED_COMMUNICATOR_H_
