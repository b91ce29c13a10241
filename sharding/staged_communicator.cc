#include "sharding/staged_communicator.h"

#include <ATen/ATen.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "base/torch_status.h"

namespace cpptrain {
namespace {

class CpuDeviceStaging : public DeviceStaging {
 public:
  c10::Device device() const override { return c10::Device(c10::kCPU); }

  absl::StatusOr<std::vector<at::Tensor>> ToHost(const std::vector<at::Tensor>& tensors,
                                                 const std::vector<bool>& copy) override {
    return CatchTorch([&] {
      std::vector<at::Tensor> host;
      for (size_t i = 0; i < tensors.size(); ++i) {
        host.push_back(copy[i] ? tensors[i].clone(at::MemoryFormat::Contiguous)
                               : at::empty_like(tensors[i], at::MemoryFormat::Contiguous));
      }
      return host;
    });
  }

  absl::StatusOr<std::function<absl::Status()>> FromHost(
      const std::vector<at::Tensor>& host, const std::vector<at::Tensor>& device) override {
    CT_RETURN_IF_ERROR(CatchTorch([&] {
      for (size_t i = 0; i < host.size(); ++i) {
        at::Tensor out = device[i];
        out.copy_(host[i]);
      }
    }));
    return std::function<absl::Status()>([] { return absl::OkStatus(); });
  }

  bool Capturing() const override { return false; }
};

// The CPU collective over one call's host copies; Wait copies the results back.
class StagedWork : public Work {
 public:
  StagedWork(std::unique_ptr<Work> host_work, std::shared_ptr<DeviceStaging> staging,
             std::vector<at::Tensor> host_outputs, std::vector<at::Tensor> device_outputs)
      : host_work_(std::move(host_work)),
        staging_(std::move(staging)),
        host_outputs_(std::move(host_outputs)),
        device_outputs_(std::move(device_outputs)) {}

  // Unwaited work is waited for, so the results land before the tensors can be reused.
  ~StagedWork() override {
    if (!waited_) Wait().IgnoreError();
  }

  absl::Status Wait() override {
    if (!waited_) {
      waited_ = true;
      status_ = CopyBack();
    }
    return status_;
  }

  absl::Status Synchronize() override {
    CT_RETURN_IF_ERROR(Wait());
    return copied_back_ ? copied_back_() : absl::OkStatus();
  }

 private:
  absl::Status CopyBack() {
    CT_RETURN_IF_ERROR(host_work_->Synchronize());
    CT_ASSIGN_OR_RETURN(copied_back_, staging_->FromHost(host_outputs_, device_outputs_));
    host_outputs_.clear();
    device_outputs_.clear();
    return absl::OkStatus();
  }

  std::unique_ptr<Work> host_work_;
  std::shared_ptr<DeviceStaging> staging_;
  std::vector<at::Tensor> host_outputs_;
  std::vector<at::Tensor> device_outputs_;
  std::function<absl::Status()> copied_back_;
  bool waited_ = false;
  absl::Status status_;
};

// The defined tensors of `tensors`, with where each came from.
struct Defined {
  std::vector<at::Tensor> tensors;
  std::vector<size_t> index;
};

Defined DefinedOf(const std::vector<at::Tensor>& tensors) {
  Defined out;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i].defined()) continue;
    out.tensors.push_back(tensors[i]);
    out.index.push_back(i);
  }
  return out;
}

}  // namespace

std::unique_ptr<DeviceStaging> CpuStaging() { return std::make_unique<CpuDeviceStaging>(); }

struct StagedCommunicator::Staged {
  // Host copies in the order given; an undefined tensor stays undefined.
  std::vector<at::Tensor> inputs;
  std::vector<at::Tensor> outputs;
};

absl::StatusOr<std::unique_ptr<StagedCommunicator>> StagedCommunicator::Create(
    std::unique_ptr<Communicator> host, std::unique_ptr<DeviceStaging> staging) {
  if (host == nullptr || staging == nullptr) {
    return absl::InvalidArgumentError(
        "StagedCommunicator::Create: the host communicator and the staging must both be given");
  }
  if (host->device().has_value() && host->device()->type() != c10::kCPU) {
    return absl::InvalidArgumentError(absl::StrCat(
        "StagedCommunicator::Create: the host communicator moves ", host->device()->str(),
        " tensors; it must move CPU tensors (Gloo or the store)"));
  }
  return std::unique_ptr<StagedCommunicator>(
      new StagedCommunicator(std::move(host), std::move(staging)));
}

absl::Status StagedCommunicator::CheckTensor(const char* op, const at::Tensor& t,
                                             const std::string& name) const {
  // An undefined tensor goes on to the host communicator, which refuses it where it must.
  if (!t.defined()) return absl::OkStatus();
  const c10::Device device = staging_->device();
  const std::string where = absl::StrCat("StagedCommunicator ", op, " (rank ", rank(), " of ",
                                         size(), "): ", name);
  if (t.device() != device) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, " is on device ", t.device().str(), "; this staged communicator takes ",
        device.is_cpu() ? std::string("CPU") : device.str(), " tensors only"));
  }
  if (!t.is_contiguous()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " is not contiguous (as NCCL, which this stands in for, refuses "
                            "it): pass .contiguous()"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Work>> StagedCommunicator::Run(
    const char* op, const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs,
    bool outputs_in_place, const IssueOnHost& issue) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    CT_RETURN_IF_ERROR(CheckTensor(op, inputs[i], absl::StrCat("inputs[", i, "]")));
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    CT_RETURN_IF_ERROR(CheckTensor(op, outputs[i], absl::StrCat("outputs[", i, "]")));
  }
  if (staging_->Capturing()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "StagedCommunicator ", op, " (rank ", rank(), " of ", size(),
        "): issued while the current stream is being captured into a CUDA graph; the host "
        "takes part in a staged collective, so it cannot be captured (run eagerly)"));
  }
  const Defined in = DefinedOf(inputs);
  const Defined out = DefinedOf(outputs);
  std::vector<at::Tensor> all = in.tensors;
  all.insert(all.end(), out.tensors.begin(), out.tensors.end());
  std::vector<bool> copy(in.tensors.size(), true);
  copy.resize(all.size(), outputs_in_place);
  CT_ASSIGN_OR_RETURN(std::vector<at::Tensor> host, staging_->ToHost(all, copy));
  Staged staged;
  staged.inputs.resize(inputs.size());
  staged.outputs.resize(outputs.size());
  for (size_t i = 0; i < in.index.size(); ++i) staged.inputs[in.index[i]] = host[i];
  std::vector<at::Tensor> host_outputs;
  for (size_t i = 0; i < out.index.size(); ++i) {
    staged.outputs[out.index[i]] = host[in.tensors.size() + i];
    host_outputs.push_back(host[in.tensors.size() + i]);
  }
  CT_ASSIGN_OR_RETURN(std::unique_ptr<Work> host_work, issue(staged));
  return std::unique_ptr<Work>(std::make_unique<StagedWork>(
      std::move(host_work), staging_, std::move(host_outputs), out.tensors));
}

absl::StatusOr<std::unique_ptr<Work>> StagedCommunicator::AllReduce(at::Tensor& tensor,
                                                                    ReduceOp op) {
  return Run("all-reduce", {}, {tensor}, /*outputs_in_place=*/true,
             [&](Staged& s) { return host_->AllReduce(s.outputs[0], op); });
}

absl::StatusOr<std::unique_ptr<Work>> StagedCommunicator::AllGather(const at::Tensor& input,
                                                                    at::Tensor& output) {
  return Run("all-gather", {input}, {output}, /*outputs_in_place=*/false,
             [&](Staged& s) { return host_->AllGather(s.inputs[0], s.outputs[0]); });
}

absl::StatusOr<std::unique_ptr<Work>> StagedCommunicator::ReduceScatter(const at::Tensor& input,
                                                                        at::Tensor& output,
                                                                        ReduceOp op) {
  return Run("reduce-scatter", {input}, {output}, /*outputs_in_place=*/false,
             [&](Staged& s) { return host_->ReduceScatter(s.inputs[0], s.outputs[0], op); });
}

absl::StatusOr<std::unique_ptr<Work>> StagedCommunicator::Broadcast(at::Tensor& tensor,
                                                                    int root) {
  return Run("broadcast", {}, {tensor}, /*outputs_in_place=*/true,
             [&](Staged& s) { return host_->Broadcast(s.outputs[0], root); });
}

absl::StatusOr<std::unique_ptr<Work>> StagedCommunicator::Scatter(const at::Tensor& input,
                                                                  at::Tensor& output, int root) {
  // Only the root's input is read (others may pass an undefined one): stage it there only.
  const at::Tensor read = rank() == root ? input : at::Tensor();
  return Run("scatter", {read}, {output}, /*outputs_in_place=*/false,
             [&](Staged& s) { return host_->Scatter(s.inputs[0], s.outputs[0], root); });
}

absl::StatusOr<std::unique_ptr<Work>> StagedCommunicator::AllReduceCoalesced(
    std::vector<at::Tensor>& tensors, ReduceOp op) {
  return Run("all-reduce", {}, tensors, /*outputs_in_place=*/true,
             [&](Staged& s) { return host_->AllReduceCoalesced(s.outputs, op); });
}

absl::StatusOr<std::unique_ptr<Work>> StagedCommunicator::AllGatherCoalesced(
    const std::vector<at::Tensor>& inputs, std::vector<at::Tensor>& outputs) {
  return Run("all-gather", inputs, outputs, /*outputs_in_place=*/false,
             [&](Staged& s) { return host_->AllGatherCoalesced(s.inputs, s.outputs); });
}

absl::StatusOr<std::unique_ptr<Work>> StagedCommunicator::ReduceScatterCoalesced(
    const std::vector<at::Tensor>& inputs, std::vector<at::Tensor>& outputs, ReduceOp op) {
  return Run("reduce-scatter", inputs, outputs, /*outputs_in_place=*/false,
             [&](Staged& s) { return host_->ReduceScatterCoalesced(s.inputs, s.outputs, op); });
}

}  // namespace cpptrain
