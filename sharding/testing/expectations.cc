#include "sharding/testing/expectations.h"

#include <sstream>
#include <utility>

#include <ATen/ATen.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace cpptrain {

const std::vector<at::ScalarType>& ReducibleDtypes() {
  static const auto* const kDtypes = new std::vector<at::ScalarType>{
      at::kFloat, at::kDouble, at::kBFloat16, at::kHalf, at::kLong, at::kInt};
  return *kDtypes;
}

at::Tensor Fill(int64_t n, at::ScalarType dtype, const std::function<double(int64_t)>& f) {
  std::vector<double> values(n);
  for (int64_t i = 0; i < n; ++i) values[i] = f(i);
  return at::tensor(values, at::kDouble).to(dtype);
}

std::vector<ReduceOp> OpsFor(at::ScalarType dtype) {
  if (at::isFloatingType(dtype)) return {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax};
  return {ReduceOp::kSum, ReduceOp::kMax};
}

double Reduced(ReduceOp op, int world, int64_t i, int m) {
  const double base = static_cast<double>(i % m);
  switch (op) {
    case ReduceOp::kSum:
      return world * (world + 1) / 2.0 + world * base;
    case ReduceOp::kAvg:
      return (world + 1) / 2.0 + base;
    case ReduceOp::kMax:
      return world + base;
  }
  return -1;
}

std::string Label(absl::string_view op, at::ScalarType dtype, ReduceOp reduce, int64_t n) {
  return absl::StrCat(op, " ", c10::toString(dtype), " ", ReduceOpName(reduce), " n=", n);
}

void Expectations::Equal(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  if (got.scalar_type() == want.scalar_type() && got.numel() == want.numel() &&
      at::equal(got.reshape({-1}), want.reshape({-1}))) {
    return;
  }
  std::ostringstream out;
  out << what << " on rank " << rank_ << ": got " << got.reshape({-1}).to(at::kDouble) << " want "
      << want.reshape({-1}).to(at::kDouble);
  failures_.push_back(out.str());
}

void Expectations::Ok(const absl::Status& status, const std::string& what) {
  if (!status.ok()) failures_.push_back(absl::StrCat(what, ": ", status.ToString()));
}

void Expectations::Done(absl::StatusOr<std::unique_ptr<Work>> work, const std::string& what) {
  if (!work.ok()) return Ok(work.status(), what);
  Ok((*work)->Wait(), what);
}

void Expectations::Refused(const absl::StatusOr<std::unique_ptr<Work>>& work,
                           absl::string_view part, const std::string& what) {
  const absl::Status& status = work.status();
  if (status.code() == absl::StatusCode::kInvalidArgument &&
      absl::StrContains(status.message(), part)) {
    return;
  }
  failures_.push_back(absl::StrCat(what, " on rank ", rank_, ": want InvalidArgument saying \"",
                                   part, "\", got ", status.ToString()));
}

absl::Status Expectations::status() const {
  if (failures_.empty()) return absl::OkStatus();
  return absl::InternalError(absl::StrJoin(failures_, "\n"));
}

}  // namespace cpptrain
