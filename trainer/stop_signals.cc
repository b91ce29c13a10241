#include "trainer/stop_signals.h"

#include <atomic>

namespace cpptrain {
namespace {

std::atomic<int> requested{0};
std::atomic<int> depth{0};
static_assert(std::atomic<int>::is_always_lock_free, "the handler needs a lock-free atomic");

// Async-signal-safe: an atomic store, or (the second time) the default action re-raised.
void OnStopSignal(int signal) {
  int expected = 0;
  if (requested.compare_exchange_strong(expected, signal)) return;
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
