// Test-only fault injection by environment variable: a test sets VARIABLE=R, and the code
// under test makes one of its steps fail on rank R as a real fault would (a full disk, a
// failing read, an allocation out of memory). Unset, the check costs one getenv.
//
//   if (FaultInjectedOnRank("CPPTRAIN_TEST_FAIL_WRITE_ON_RANK", rank)) return InjectedError();
#ifndef CPPTRAIN_BASE_FAULT_INJECTION_H_
#define CPPTRAIN_BASE_FAULT_INJECTION_H_

#include <cstdlib>

#include "absl/strings/numbers.h"

namespace cpptrain {

// True when `variable` is set to `rank` (a decimal integer).
inline bool FaultInjectedOnRank(const char* variable, int rank) {
  const char* value = std::getenv(variable);
  int injected = -1;
  return value != nullptr && absl::SimpleAtoi(value, &injected) && injected == rank;
}

}  // namespace cpptrain

#endif  // CPPTRAIN_BASE_FAULT_INJECTION_H_
