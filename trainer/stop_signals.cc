#include "trainer/stop_signals.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace cpptrain {
namespace {

std::atomic<int> requested{0};
std::atomic<int64_t> first_ns{0};
std::atomic<int> depth{0};
// Whole seconds from the first request to the end of the process; 0: no limit.
std::atomic<unsigned> grace_s{0};
// What the SIGALRM handler writes (built before any signal: the handler cannot format).
char grace_message[160];
std::atomic<size_t> grace_message_size{0};
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

// Async-signal-safe: ends the process as `signal` would with no handler installed.
void EndAs(int signal) {
  struct sigaction fallback {};
  fallback.sa_handler = SIG_DFL;
  sigemptyset(&fallback.sa_mask);
  sigaction(signal, &fallback, nullptr);
  sigset_t just_this;
  sigemptyset(&just_this);
  sigaddset(&just_this, signal);
  sigprocmask(SIG_UNBLOCK, &just_this, nullptr);
  raise(signal);
}

// Async-signal-safe: atomic stores and alarm(), or (a second request) the default action.
void OnStopSignal(int signal) {
  int expected = 0;
  if (requested.compare_exchange_strong(expected, signal)) {
    first_ns.store(MonotonicNs());
    if (grace_s.load() > 0) alarm(grace_s.load());
    return;
  }
  if (MonotonicNs() - first_ns.load() < kRepeatWindowNs) return;  // the same one, again
  EndAs(signal);
}

// The grace period ran out: says so, then ends as the first request's signal would.
void OnGraceOver(int) {
  if (write(STDERR_FILENO, grace_message, grace_message_size.load()) < 0) {
    // Nothing else can be said from here.
  }
  EndAs(requested.load() != 0 ? requested.load() : SIGTERM);
}

}  // namespace

absl::StatusOr<absl::Duration> StopGraceFromEnvironment() {
  const char* value = std::getenv("CPPTRAIN_STOP_GRACE_S");
  if (value == nullptr || *value == '\0') return absl::Seconds(60);
  int seconds = 0;
  if (!absl::SimpleAtoi(value, &seconds) || seconds < 0 || seconds > 86400) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CPPTRAIN_STOP_GRACE_S=\"", value,
        "\" is not a whole number of seconds in [0, 86400]: set how long a stopping run may "
        "finish its step and save before it ends itself (0: no limit), or unset it for 60"));
  }
  return absl::Seconds(seconds);
}

StopSignals::StopSignals(absl::Duration grace) {
  if (depth.fetch_add(1) != 0) return;
  requested.store(0);
  const unsigned seconds =
      static_cast<unsigned>(std::max<int64_t>(0, absl::ToInt64Seconds(absl::Ceil(
                                                     grace, absl::Seconds(1)))));
  const std::string message = absl::StrCat(
      "stop signals: still running ", seconds,
      " s after the stop signal (the step or the checkpoint save is stuck); ending the "
      "process (CPPTRAIN_STOP_GRACE_S sets this limit)\n");
  const size_t size = std::min(message.size(), sizeof(grace_message));
  message.copy(grace_message, size);
  grace_message_size.store(size);
  grace_s.store(seconds);
  struct sigaction action {};
  action.sa_handler = OnStopSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // system calls in flight (file writes, sockets) carry on
  sigaction(SIGTERM, &action, &previous_term_);
  sigaction(SIGINT, &action, &previous_int_);
  struct sigaction grace_over {};
  grace_over.sa_handler = OnGraceOver;
  sigemptyset(&grace_over.sa_mask);
  sigaction(SIGALRM, &grace_over, &previous_alarm_);
  installed_ = true;
}

StopSignals::~StopSignals() {
  depth.fetch_sub(1);
  if (!installed_) return;
  alarm(0);
  grace_s.store(0);
  sigaction(SIGTERM, &previous_term_, nullptr);
  sigaction(SIGINT, &previous_int_, nullptr);
  sigaction(SIGALRM, &previous_alarm_, nullptr);
}

int StopSignals::Requested() { return requested.load(); }

void StopSignals::Clear() { requested.store(0); }

}  // namespace cpptrain
