// Helpers for multi-rank collective tests: tensors filled from a formula, the reduction that
// formula gives over any number of ranks, and Expectations, which records wrong values and
// failed statuses instead of returning at the first one, so that a rank keeps issuing the
// collectives its peers wait for.
//
//   Expectations expect(rank);
//   at::Tensor t = Fill(7, at::kFloat, [&](int64_t i) { return rank + 1 + i % 3; });
//   expect.Done(comm.AllReduce(t, ReduceOp::kSum), "AllReduce");
//   expect.Equal(t, Fill(7, at::kFloat, [&](int64_t i) {
//                  return Reduced(ReduceOp::kSum, world, i, 3); }), "AllReduce");
//   return expect.status();  // OK, or one line per failure naming the rank
#ifndef CPPTRAIN_SHARDING_TESTING_EXPECTATIONS_H_
#define CPPTRAIN_SHARDING_TESTING_EXPECTATIONS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "sharding/communicator.h"

namespace cpptrain {

// Every dtype the CPU communicators reduce. The values the tests use are small integers and
// halves, exact in all of them, so results are compared exactly.
const std::vector<at::ScalarType>& ReducibleDtypes();

// A 1-D tensor of `n` elements with element i = f(i), in `dtype`.
at::Tensor Fill(int64_t n, at::ScalarType dtype, const std::function<double(int64_t)>& f);

// The ops that apply to `dtype`: sum and max, and avg for floating-point dtypes.
std::vector<ReduceOp> OpsFor(at::ScalarType dtype);

// When rank q holds q + 1 + i % m at position i, the reduction over `world` ranks at i.
double Reduced(ReduceOp op, int world, int64_t i, int m);

// "AllReduce BFloat16 avg n=7".
std::string Label(absl::string_view op, at::ScalarType dtype, ReduceOp reduce, int64_t n);

class Expectations {
 public:
  explicit Expectations(int rank) : rank_(rank) {}

  // `got` has the dtype, the number of elements and the values (in logical order) of `want`.
  void Equal(const at::Tensor& got, const at::Tensor& want, const std::string& what);

  void Ok(const absl::Status& status, const std::string& what);

  // The collective was issued and its Wait() succeeded.
  void Done(absl::StatusOr<std::unique_ptr<Work>> work, const std::string& what);

  // The call was refused with InvalidArgument, its message containing `part`.
  void Refused(const absl::StatusOr<std::unique_ptr<Work>>& work, absl::string_view part,
               const std::string& what);

  // OK, or every failure recorded, one a line.
  absl::Status status() const;

 private:
  int rank_;
  std::vector<std::string> failures_;
};

}  // namespace cpptrain

#endif  // CPPTRAIN_SHARDING_TESTING_EXPECTATIONS_H_
