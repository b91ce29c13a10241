// Status helpers shared by every room: the two macros Abseil 20220623 lacks, and a check
// that turns a false condition into an InvalidArgument error carrying both sides.
//
//   absl::StatusOr<int> Parse(...);
//   absl::Status Use() {
//     CT_ASSIGN_OR_RETURN(int n, Parse(...));
//     CT_RETURN_IF_ERROR(Validate(n));
//     return absl::OkStatus();
//   }
#ifndef CPPTRAIN_BASE_STATUS_H_
#define CPPTRAIN_BASE_STATUS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define CT_STATUS_CONCAT_INNER_(a, b) a##b
#define CT_STATUS_CONCAT_(a, b) CT_STATUS_CONCAT_INNER_(a, b)

// Returns the status of `expr` from the enclosing function when it is not OK.
#define CT_RETURN_IF_ERROR(expr)                   \
  do {                                             \
    ::absl::Status ct_status_ = (expr);            \
    if (!ct_status_.ok()) return ct_status_;       \
  } while (false)

// Evaluates `rexpr` (a StatusOr); returns its status when not OK, otherwise moves the value
// into `lhs` (which may be a declaration).
#define CT_ASSIGN_OR_RETURN(lhs, rexpr) \
  CT_ASSIGN_OR_RETURN_IMPL_(CT_STATUS_CONCAT_(ct_statusor_, __LINE__), lhs, rexpr)

#define CT_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                              \
  if (!statusor.ok()) return statusor.status();         \
  lhs = std::move(statusor).value()

#endif  // CPPTRAIN_BASE_STATUS_H_
