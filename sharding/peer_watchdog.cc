#include "sharding/peer_watchdog.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <utility>
#include <vector>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/logging.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "sharding/internal/peer_silence.h"

namespace cpptrain {

using sharding_internal::DescribePause;
using sharding_internal::DescribeSilence;
using sharding_internal::kFinishedMark;
using sharding_internal::PeerSilence;
using sharding_internal::SilenceContext;
using sharding_internal::SilenceVerdict;
using sharding_internal::WatchdogClock;

// What the two threads and Stop share; the threads hold it too, so a thread left blocked in a
// store request after Stop gave up on it still has it.
struct PeerWatchdog::Shared {
  explicit Shared(const PeerWatchdogOptions& options)
      : silence(options.rank, options.world_size, options.timeout, WatchdogClock::now()) {}

  std::mutex mu;
  std::condition_variable cv;
  PeerSilence silence;     // guarded by mu
  std::string last_error;  // of the last round; empty when it succeeded; guarded by mu
  bool stopping = false;     // guarded by mu
  bool store_closed = false;  // guarded by mu
  bool beats_done = false;   // guarded by mu
  bool abandoned = false;    // Stop stopped waiting for the beats thread; guarded by mu
  bool draining = false;        // Stop awaits the others' finished marks; guarded by mu
  bool peers_finished = false;  // every other rank finished or stopped beating; guarded by mu
  std::vector<int> unfinished;  // the ranks awaited at the last drain round; guarded by mu
};

namespace {

// Beside ConnectStore's "cpptrain/connect/rank<r>", outside the "cpptrain/" prefix of the
// store ConnectStore returns.
std::string HeartbeatKey(int rank) {
  return absl::StrCat("cpptrain_peer_watchdog/heartbeat/", rank);
}

// How often the beats thread reads the others' counters while Stop drains: every 10 ms, or
// every world_size ms in large worlds, so the store's host answers at most about 1,000 such
// reads a second beside the others' own requests.
std::chrono::milliseconds DrainPoll(const PeerWatchdogOptions& options) {
  return std::chrono::milliseconds(std::max(10, options.world_size));
}

// How long a peer's counter may stand still before the drain takes its process for gone.
std::chrono::milliseconds GoneAfter(const PeerWatchdogOptions& options) {
  return std::max(std::chrono::milliseconds(3000), 3 * options.interval);
}

// How long Stop waits for a store request in flight before leaving its thread behind.
std::chrono::milliseconds StopWait(const PeerWatchdogOptions& options) {
  return std::max(std::chrono::milliseconds(2000), 2 * options.interval);
}

// True when a TCP connection to host:port is refused now (nothing listens: the store's
// process exited), as opposed to accepted (a stopped process's listening socket still
// accepts) or unanswered (the host is down or cut off).
bool PortRefusesConnections(const std::string& host, int port, std::chrono::milliseconds wait) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return false;
  bool refused = false;
  const int fd = socket(found->ai_family, found->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                        found->ai_protocol);
  if (fd >= 0) {
    if (connect(fd, found->ai_addr, found->ai_addrlen) != 0) {
      if (errno == ECONNREFUSED) {
        refused = true;
      } else if (errno == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        int error = 0;
        socklen_t size = sizeof(error);
        if (poll(&p, 1, static_cast<int>(wait.count())) == 1 &&
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size) == 0) {
          refused = error == ECONNREFUSED;
        }
      }
    }
    close(fd);
  }
  freeaddrinfo(found);
  return refused;
}

c10::intrusive_ptr<c10d::Store> ConnectClient(const PeerWatchdogOptions& options) {
  c10d::TCPStoreOptions tcp;
  tcp.port = static_cast<uint16_t>(options.port);
  tcp.isServer = false;
  tcp.waitWorkers = false;
  tcp.timeout = options.timeout;
  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::TCPStore>(options.host, tcp);
  if (options.key_prefix.empty()) return store;
  return c10::make_intrusive<c10d::PrefixStore>(options.key_prefix, std::move(store));
}

// One round: beat, then read the watched peers' counters (sharding_internal::WatchedPeers; the
// others stay 0 and are not judged). Throws what c10d throws.
void BeatAndRead(c10::intrusive_ptr<c10d::Store>& store, const PeerWatchdogOptions& options,
                 std::vector<int64_t>& counters) {
  if (!store) store = ConnectClient(options);
  store->add(HeartbeatKey(options.rank), 1);
  for (int r : sharding_internal::WatchedPeers(options.rank, options.world_size)) {
    counters[r] = store->add(HeartbeatKey(r), 0);
  }
}

// The drain's view of the other ranks: which have yet to mark themselves finished and still
// beat. A peer whose counter has not moved for GoneAfter since the drain began (or since it
// last moved) no longer beats: its process is gone, and holds no connection, or is stopped,
// and is not waited for either.
class DrainRounds {
 public:
  explicit DrainRounds(const PeerWatchdogOptions& options)
      : options_(options),
        gone_after_(GoneAfter(options)),
        last_(options.world_size, -1),
        moved_(options.world_size) {}

  // Reads every other rank's counter; returns the ranks still to wait for. Throws what c10d
  // throws.
  std::vector<int> Awaited(c10d::Store& store) {
    const WatchdogClock::time_point now = WatchdogClock::now();
    std::vector<int> awaited;
    for (int r = 0; r < options_.world_size; ++r) {
      if (r == options_.rank) continue;
      const int64_t counter = store.add(HeartbeatKey(r), 0);
      if (counter >= kFinishedMark) continue;
      if (counter != last_[r]) {
        last_[r] = counter;
        moved_[r] = now;
      }
      if (now - moved_[r] < gone_after_) awaited.push_back(r);
    }
    return awaited;
  }

 private:
  const PeerWatchdogOptions& options_;
  const std::chrono::milliseconds gone_after_;
  std::vector<int64_t> last_;
  std::vector<WatchdogClock::time_point> moved_;
};

[[noreturn]] void LogAndExit(const std::string& message) {
  LOG(ERROR) << message;
  google::FlushLogFiles(google::GLOG_INFO);
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(kPeerSilentExitCode);
}

// The watchdogs of this process, stopped (marked finished) at exit: a program that ends with
// exit() while something still holds its store would otherwise leave them running into the
// static destructors. Never destroyed, so it outlives every watchdog.
struct LiveWatchdogs {
  std::mutex mu;
  std::set<PeerWatchdog*> live;  // guarded by mu
};

LiveWatchdogs& Live() {
  static auto* live = new LiveWatchdogs;
  return *live;
}

// Those that drain last: in a process holding several ranks (tests), the host's drain waits
// for the others' finished marks.
void StopAllAtExit() {
  LiveWatchdogs& live = Live();
  std::lock_guard<std::mutex> lock(live.mu);
  for (bool draining : {false, true}) {
    for (PeerWatchdog* watchdog : live.live) {
      if (watchdog->DrainsPeersAtStop() == draining) watchdog->Stop();
    }
  }
}

void Register(PeerWatchdog* watchdog) {
  static std::once_flag once;
  // Registered after LibTorch's and glog's statics exist, so it runs before they go.
  std::call_once(once, [] { std::atexit(&StopAllAtExit); });
  LiveWatchdogs& live = Live();
  std::lock_guard<std::mutex> lock(live.mu);
  live.live.insert(watchdog);
}

void Unregister(PeerWatchdog* watchdog) {
  LiveWatchdogs& live = Live();
  std::lock_guard<std::mutex> lock(live.mu);
  live.live.erase(watchdog);
}

absl::Status CheckOptions(const PeerWatchdogOptions& options) {
  if (options.world_size < 2 || options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PeerWatchdog: need 0 <= rank < world_size and world_size >= 2 (one rank has no peers "
        "to watch), got rank ",
        options.rank, ", world_size ", options.world_size));
  }
  if (options.port < 1 || options.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PeerWatchdog: port ", options.port, " is outside 1..65535; pass the store's port"));
  }
  if (options.timeout.count() <= 0 || options.interval.count() <= 0 ||
      options.interval >= options.timeout) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PeerWatchdog: need 0 < interval < timeout, got interval ", options.interval.count(),
        " ms, timeout ", options.timeout.count(), " ms"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::chrono::milliseconds> PeerTimeoutFromEnvironment(
    const std::function<const char*(const char*)>& getenv) {
  const char* value = getenv(kPeerTimeoutVariable);
  if (value == nullptr || *value == '\0') return kDefaultPeerTimeout;
  double seconds = 0;
  if (!absl::SimpleAtod(value, &seconds) || !std::isfinite(seconds) ||
      (seconds != 0 && (seconds < 1 || seconds > 86400))) {
    return absl::InvalidArgumentError(absl::StrCat(
        kPeerTimeoutVariable, "=\"", value,
        "\" is not 0 or a number of seconds from 1 to 86400; set it to how long a rank may "
        "stay silent before the job ends (",
        kDefaultPeerTimeout.count() / 1000,
        " when unset), or to 0 to turn the peer watchdog off"));
  }
  return std::chrono::milliseconds(std::llround(seconds * 1000));
}

absl::StatusOr<std::chrono::milliseconds> PeerTimeoutFromEnvironment() {
  return PeerTimeoutFromEnvironment(&std::getenv);
}

std::chrono::milliseconds HeartbeatInterval(std::chrono::milliseconds timeout) {
  return std::clamp(timeout / 10, std::chrono::milliseconds(1), std::chrono::milliseconds(1000));
}

absl::StatusOr<std::unique_ptr<PeerWatchdog>> PeerWatchdog::Start(PeerWatchdogOptions options) {
  if (options.interval.count() == 0) options.interval = HeartbeatInterval(options.timeout);
  if (!options.on_silence) options.on_silence = &LogAndExit;
  CT_RETURN_IF_ERROR(CheckOptions(options));
  auto shared = std::make_shared<Shared>(options);
  std::unique_ptr<PeerWatchdog> watchdog(new PeerWatchdog(std::move(options), shared));
  Register(watchdog.get());
  return watchdog;
}

// The beats thread: a round every interval until Stop, then the finished mark. Its store
// requests may block for as long as the store's host is stopped (LibTorch 1.13's client has
// no timeout on add); the judge thread does not wait for it.
void PeerWatchdog::RunBeats(PeerWatchdogOptions options, std::shared_ptr<Shared> shared) {
  c10::intrusive_ptr<c10d::Store> store;
  std::vector<int64_t> counters(options.world_size, 0);
  DrainRounds drain(options);
  std::unique_lock<std::mutex> lock(shared->mu);
  while (!shared->stopping) {
    const bool draining = shared->draining;
    lock.unlock();
    std::vector<int> unfinished;
    const absl::Status status = CatchTorch([&] {
      BeatAndRead(store, options, counters);
      if (draining) unfinished = drain.Awaited(*store);
    });
    const bool closed =
        !status.ok() && PortRefusesConnections(options.host, options.port, options.interval);
    if (!status.ok()) store.reset();  // a failed request leaves c10d's stream out of step
    lock.lock();
    if (shared->abandoned) return;
    if (status.ok()) {
      shared->silence.RecordRound(WatchdogClock::now(), counters);
      shared->last_error.clear();
      if (draining) {
        shared->peers_finished = unfinished.empty();
        shared->unfinished = std::move(unfinished);
        if (shared->peers_finished) shared->cv.notify_all();
      }
    } else {
      shared->last_error = std::string(status.message());
    }
    if (closed) {
      shared->store_closed = true;
      break;
    }
    shared->cv.wait_for(lock, shared->draining ? DrainPoll(options) : options.interval,
                        [&] { return shared->stopping || shared->draining != draining; });
  }
  if (!shared->store_closed) {
    lock.unlock();
    const absl::Status marked = CatchTorch([&] {
      if (!store) store = ConnectClient(options);
      store->add(HeartbeatKey(options.rank), kFinishedMark);
    });
    store.reset();  // closed at once: the store's host may leave kDrainGrace after the mark
    lock.lock();
    if (shared->abandoned) return;
    if (!marked.ok()) {
      VLOG(1) << "peer watchdog: cannot mark rank " << options.rank
              << " finished: " << marked.message();
    } else {
      VLOG(1) << "peer watchdog: marked rank " << options.rank << " finished";
    }
  }
  shared->beats_done = true;
  shared->cv.notify_all();
}

// The judge thread: checks the silence every half interval until Stop, a verdict, or the
// store's port closing.
void PeerWatchdog::RunJudge(PeerWatchdogOptions options, std::shared_ptr<Shared> shared) {
  SilenceContext context;
  context.rank = options.rank;
  context.world_size = options.world_size;
  context.timeout = options.timeout;
  context.store_address = absl::StrCat(options.host, ":", options.port);
  context.store_host = options.store_host;
  context.exit_code = kPeerSilentExitCode;
  std::unique_lock<std::mutex> lock(shared->mu);
  while (true) {
    shared->cv.wait_for(lock, std::max(options.interval / 2, std::chrono::milliseconds(1)),
                        [&] { return shared->stopping || shared->store_closed; });
    if (shared->stopping) return;
    if (shared->store_closed) {
      VLOG(1) << "peer watchdog: the store at " << context.store_address << " refuses "
              << "connections (" << context.store_host << " exited); no longer watching";
      return;
    }
    const SilenceVerdict verdict = shared->silence.Check(WatchdogClock::now());
    context.last_store_error = shared->last_error;
    lock.unlock();
    if (verdict.paused_for.count() > 0) LOG(WARNING) << DescribePause(verdict, context);
    if (verdict.Fired()) {
      options.on_silence(DescribeSilence(verdict, context));
      return;
    }
    lock.lock();
  }
}

PeerWatchdog::PeerWatchdog(PeerWatchdogOptions options, std::shared_ptr<Shared> shared)
    : options_(std::move(options)),
      shared_(std::move(shared)),
      owner_pid_(getpid()),
      beats_(RunBeats, options_, shared_),
      judge_(RunJudge, options_, shared_) {}

PeerWatchdog::~PeerWatchdog() {
  Unregister(this);
  Stop();
}

// Stop's drain: the beats thread reads every other rank's counter each DrainPoll until each
// carries the finished mark or has stood still for GoneAfter. The judge keeps watching
// meanwhile (with a peer timeout under GoneAfter, a silent rank still ends the job).
void PeerWatchdog::AwaitPeersFinished() {
  const std::chrono::milliseconds limit =
      options_.drain_limit.count() > 0 ? options_.drain_limit : options_.timeout;
  std::unique_lock<std::mutex> lock(shared_->mu);
  shared_->draining = true;
  shared_->cv.notify_all();
  const bool finished = shared_->cv.wait_for(
      lock, limit, [&] { return shared_->peers_finished || shared_->store_closed; });
  const bool all = shared_->peers_finished;
  const std::vector<int> unfinished = shared_->unfinished;
  const std::string last_error = shared_->last_error;
  lock.unlock();
  if (all) {
    std::this_thread::sleep_for(kDrainGrace);
  } else if (!finished) {
    LOG(WARNING) << "peer watchdog on rank " << options_.rank << ": ranks ["
                 << absl::StrJoin(unfinished, ", ") << "] have not finished within "
                 << limit.count() << " ms of this rank's end; it stops hosting the store now"
                 << (last_error.empty() ? "" : " (the store's last error: " + last_error + ")");
  }
}

void PeerWatchdog::Stop() {
  if (getpid() != owner_pid_) return;  // a forked child: the threads are its parent's
  std::lock_guard<std::mutex> stop_lock(stop_mu_);
  if (stopped_) return;
  stopped_ = true;
  if (options_.drain_peers_at_stop) AwaitPeersFinished();
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->stopping = true;
  }
  shared_->cv.notify_all();
  judge_.join();
  bool done = false;
  {
    std::unique_lock<std::mutex> lock(shared_->mu);
    done = shared_->cv.wait_for(lock, StopWait(options_), [&] { return shared_->beats_done; });
    shared_->abandoned = !done;
  }
  if (done) {
    beats_.join();
    return;
  }
  VLOG(1) << "peer watchdog: a store request has not returned within "
          << StopWait(options_).count() << " ms; its thread ends with the process";
  beats_.detach();
}

}  // namespace cpptrain
