#include "sharding/internal/communicator_checks.h"

#include <ATen/ATen.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"

namespace cpptrain {
namespace sharding_internal {
namespace {

constexpr char kReducibleDtypes[] = "Float, Double, BFloat16, Half, Int, Long";

bool IsReducibleDtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
    case at::kDouble:
    case at::kBFloat16:
    case at::kHalf:
    case at::kInt:
    case at::kLong:
      return true;
    default:
      return false;
  }
}

std::string SizesString(const at::Tensor& t) {
  return absl::StrCat("[", absl::StrJoin(t.sizes(), ", "), "]");
}

}  // namespace

absl::Status CheckCreateArguments(absl::string_view communicator,
                                  const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                  std::chrono::milliseconds timeout) {
  if (!store) {
    return absl::InvalidArgumentError(absl::StrCat(communicator, "::Create: store is null"));
  }
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat(
        communicator, "::Create: need 0 <= rank < size, got rank ", rank, ", size ", size));
  }
  if (timeout.count() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        communicator, "::Create: timeout must be positive, got ", timeout.count(), " ms"));
  }
  return absl::OkStatus();
}

absl::Status CollectiveChecks::Invalid(absl::string_view what) const {
  return absl::InvalidArgumentError(
      absl::StrCat(communicator_, " ", op_, " (rank ", rank_, " of ", size_, "): ", what));
}

absl::Status CollectiveChecks::Tensor(const at::Tensor& t, absl::string_view name) const {
  CT_RETURN_IF_ERROR(DefinedCpuStrided(t, name));
  if (rules_.reducible_dtype_everywhere && !IsReducibleDtype(t.scalar_type())) {
    return Invalid(absl::StrCat(name, " has dtype ", c10::toString(t.scalar_type()),
                                "; supported: ", kReducibleDtypes));
  }
  return Contiguous(t, name);
}

absl::Status CollectiveChecks::Reducible(const at::Tensor& t, absl::string_view name,
                                         ReduceOp op) const {
  CT_RETURN_IF_ERROR(DefinedCpuStrided(t, name));
  if (!IsReducibleDtype(t.scalar_type())) {
    return Invalid(absl::StrCat(name, " has dtype ", c10::toString(t.scalar_type()),
                                "; reductions take ", kReducibleDtypes));
  }
  if (op == ReduceOp::kAvg && !at::isFloatingType(t.scalar_type())) {
    return Invalid(absl::StrCat("ReduceOp avg needs a floating-point tensor; ", name, " has dtype ",
                                c10::toString(t.scalar_type()),
                                "; use sum and divide, or convert to float"));
  }
  return Contiguous(t, name);
}

absl::Status CollectiveChecks::Root(int root) const {
  if (root >= 0 && root < size_) return absl::OkStatus();
  return Invalid(absl::StrCat("root ", root, " is outside [0, ", size_, ")"));
}

absl::Status CollectiveChecks::Pairs(const std::vector<at::Tensor>& inputs,
                                     const std::vector<at::Tensor>& outputs,
                                     LargerSide larger) const {
  if (inputs.size() != outputs.size()) {
    return Invalid(absl::StrCat("got ", inputs.size(), " inputs but ", outputs.size(),
                                " outputs; pass one output per input"));
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::string in = absl::StrCat("input[", i, "]");
    const std::string out = absl::StrCat("output[", i, "]");
    CT_RETURN_IF_ERROR(Tensor(inputs[i], in));
    CT_RETURN_IF_ERROR(Tensor(outputs[i], out));
    if (inputs[i].scalar_type() != outputs[i].scalar_type()) {
      return Invalid(absl::StrCat(in, " has dtype ", c10::toString(inputs[i].scalar_type()),
                                  " but ", out, " has dtype ",
                                  c10::toString(outputs[i].scalar_type()), "; they must match"));
    }
    const bool output_larger = larger == LargerSide::kOutput;
    const at::Tensor& big = output_larger ? outputs[i] : inputs[i];
    const at::Tensor& small = output_larger ? inputs[i] : outputs[i];
    if (big.numel() != size_ * small.numel()) {
      return Invalid(absl::StrCat(output_larger ? out : in, " (sizes ", SizesString(big), ") has ",
                                  big.numel(), " elements; expected ", size_ * small.numel(), " = ",
                                  size_, " ranks x ", small.numel(), " elements of ",
                                  output_larger ? in : out));
    }
  }
  return absl::OkStatus();
}

absl::Status CollectiveChecks::Scatter(const at::Tensor& input, const at::Tensor& output,
                                       int root) const {
  CT_RETURN_IF_ERROR(Tensor(output, "output"));
  CT_RETURN_IF_ERROR(Root(root));
  if (rank_ != root) return absl::OkStatus();
  return Pairs({input}, {output}, LargerSide::kInput);
}

absl::Status CollectiveChecks::DefinedCpuStrided(const at::Tensor& t,
                                                 absl::string_view name) const {
  if (!t.defined()) return Invalid(absl::StrCat(name, " is an undefined tensor"));
  if (t.device().type() != at::kCPU) {
    return Invalid(absl::StrCat(name, " is on device ", t.device().str(), "; ", communicator_,
                                " moves CPU tensors only (use the NCCL communicator for CUDA "
                                "tensors, or copy to the CPU)"));
  }
  if (t.layout() != at::kStrided) {
    return Invalid(absl::StrCat(name, " has a non-strided layout; pass a dense tensor"));
  }
  return absl::OkStatus();
}

absl::Status CollectiveChecks::Contiguous(const at::Tensor& t, absl::string_view name) const {
  if (!rules_.contiguous || t.is_contiguous()) return absl::OkStatus();
  return Invalid(absl::StrCat(name, " (sizes ", SizesString(t),
                              ") is not contiguous; pass tensor.contiguous()"));
}

}  // namespace sharding_internal
}  // namespace cpptrain
