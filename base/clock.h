// Seconds on a monotonic clock, for measuring durations (runtimes, rates, ETAs).
//
//   const double start = MonotonicSeconds();
//   ...
//   const double runtime = MonotonicSeconds() - start;
#ifndef CPPTRAIN_BASE_CLOCK_H_
#define CPPTRAIN_BASE_CLOCK_H_

#include <chrono>

namespace cpptrain {

inline double MonotonicSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace cpptrain

#endif  // CPPTRAIN_BASE_CLOCK_H_
