// Argument checks the CPU communicators (Gloo, store) share: Create's
// arguments, and each collective's tensors, checked before any communication so
// that an error means no peer waits for this call. Every error is
// InvalidArgument and names the communicator class; a collective's error also
// names the collective, the rank and the world:
//
//   CT_RETURN_IF_ERROR(
//       sharding_internal::CheckCreateArguments("StoreCommunicator", store,
//       rank, size, timeout));
//
//   const sharding_internal::CollectiveChecks checks("StoreCommunicator",
//   kTensorRules,
//                                                    "all-reduce", rank_,
//                                                    size_);
//   CT_RETURN_IF_ERROR(checks.Reducible(tensor, "tensor", op));
//   // "StoreCommunicator all-reduce (rank 0 of 2): ReduceOp avg needs a
//   floating-point ..."
//
// Private to //sharding.
#ifndef CPPTRAIN_SHARDING_INTERNAL_COMMUNICATOR_CHECKS_H_
#define CPPTRAIN_SHARDING_INTERNAL_COMMUNICATOR_CHECKS_H_

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "sharding/communicator.h"

namespace cpptrain {
namespace sharding_internal {

// A non-null store, 0 <= rank < size, a positive timeout. `communicator` names
// the class in the error ("GlooCommunicator::Create: store is null").
absl::Status CheckCreateArguments(absl::string_view communicator,
                                  const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                  std::chrono::milliseconds timeout);

// What a communicator asks of every tensor beyond being a defined, strided CPU
// tensor.
struct TensorRules {
  // Every tensor has a reducible dtype (Gloo), not only the reduced ones
  // (store).
  bool reducible_dtype_everywhere = false;
  // Every tensor is contiguous (Gloo hands its storage over as is); the store
  // copies.
  bool contiguous = false;
};

// Which side of a gathering or scattering pair holds size() times the other's
// elements.
enum class LargerSide { kOutput, kInput };

// The checks of one collective call. `communicator` and `op` must outlive it
// (literals).
class CollectiveChecks {
 public:
  CollectiveChecks(const char* communicator, TensorRules rules, const char* op, int rank, int size)
      : communicator_(communicator), rules_(rules), op_(op), rank_(rank), size_(size) {}

  const char* op() const { return op_; }

  // "<communicator> <op> (rank r of n): <what>".
  absl::Status Invalid(absl::string_view what) const;

  // `name` (as errors call it) is defined, on the CPU, strided, and follows the
  // rules.
  absl::Status Tensor(const at::Tensor& t, absl::string_view name) const;

  // Tensor(), with a dtype the communicators reduce (Float, Double, BFloat16,
  // Half, Int, Long) and a floating-point one for avg.
  absl::Status Reducible(const at::Tensor& t, absl::string_view name, ReduceOp op) const;

  // 0 <= root < size.
  absl::Status Root(int root) const;

  // As many outputs as inputs, each pair of tensors of one dtype, the larger
  // side with size() times the elements of the other.
  absl::Status Pairs(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs,
                     LargerSide larger) const;

  // Scatter's arguments: `output` on every rank, and on `root` an input of
  // size() outputs.
  absl::Status Scatter(const at::Tensor& input, const at::Tensor& output, int root) const;

 private:
  absl::Status DefinedCpuStrided(const at::Tensor& t, absl::string_view name) const;
  absl::Status Contiguous(const at::Tensor& t, absl::string_view name) const;

  const char* communicator_;
  TensorRules rules_;
  const char* op_;
  int rank_;
  int size_;
};

}  // namespace sharding_internal
}  // namespace cpptrain

#endif  // CPPTRAIN_SHARDING_INTERNAL_COMMUNICATOR_CHECKS_H_
