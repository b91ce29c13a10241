#include "trainer/stop_signals.h"

#include <time.h>

#include <atomic>
#include <cstdint>

namespace cpptrain {
namespace {

std::atomic<int> requested{0};
std::atomic<int64_t> first_ns{0};
std::atomic<int> depth{0};
static_assert(std::atomic<int>::is_always_lock_free, "the handler needs a lock-free atomic");
static_assert(std::atomic<int64_t>::is_always_lock_free, "the handler needs a lock-free atomic");

// One signal is often delivered twice within milliseconds (a scheduler signals every process,
// `kill -TERM -PGID` the group, and the launcher forwards it as well): only one at least this
// long after the first is the second request that ends the process.
constexpr int64_t kRepeatWindowNs = 1'000'000'000;

int64_t MonotonicNs() {  // clock_gettime is async-signal-safe
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return int64_t{now.tv_sec} * 1'000'000'000 + now.tv_nsec;
}

// Async-signal-safe: atomic stores, or (a second request) the default action re-raised.
void OnStopSignal(int signal) {
  int expected = 0;
  if (requested.compare_exchange_strong(expected, signal)) {
    first_ns.store(MonotonicNs());
    return;
  }
  if (MonotonicNs() - first_ns.load() < kRepeatWindowNs) return;  // the same one, again
  struct sigaction fallback {};
  fallback.sa_handler = SIG_DFL;
  sigemptyset(&fallback.sa_mask);
  sigaction(signal, &fallback, nullptr);
  raise(signal);
}

}  // namespace

StopSignals::StopSignals() {
  if (depth.fetch_add(1) != 0) return;
  requested.store(0);
  struct sigaction action {};
  action.sa_handler = OnStopSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // system calls in flight (file writes, sockets) carry on
  sigaction(SIGTERM, &action, &previous_term_);
  sigaction(SIGINT, &action, &previous_int_);
  installed_ = true;
}

StopSignals::~StopSignals() {
  depth.fetch_sub(1);
  if (!installed_) return;
  sigaction(SIGTERM, &previous_term_, nullptr);
  sigaction(SIGINT, &previous_int_, nullptr);
}

int StopSignals::Requested() { return requested.load(); }

void StopSignals::Clear() { requested.store(0); }

}  // namespace cpptrain
