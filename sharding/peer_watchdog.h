// A liveness watchdog for the ranks of a job: each rank's background thread adds one to a
// heartbeat counter in the c10d store every interval and reads those of the next two ranks
// around the ring (sharding/internal/peer_silence.h's WatchedPeers; every rank is watched by
// its two predecessors, all of them in a world of three). When a watched peer's counter has
// not changed for the timeout (the peer is stopped, hung with all its
// threads, or dead on a host no local launcher watches), or the store has not answered for
// that long (rank 0, which hosts it, is stopped or its host is gone), the watchdog logs one
// line naming the silent ranks, how long and the likely causes, and ends its own process with
// exit code kPeerSilentExitCode. The launcher (tools/launch, torchrun) then stops the others
// and reports the code. Without it the peers of such a rank wait inside a collective until
// ddp_timeout (1800 s by default): Gloo and NCCL just wait, and the launcher sees no exit.
//
// Why a library ends the process here: the ranks that notice are blocked inside a collective
// on their main thread, and there is no portable way to unblock one (Gloo has no abort, nor
// has a wait on the c10d store; NCCL's abort covers NCCL's collectives only). exit() would run
// static destructors under that blocked thread; std::_Exit after flushing the log ends the
// process at once, and a launcher already turns one rank's exit into stopping the job. Tests
// pass on_silence to observe instead.
//
// A rank that ends normally marks itself finished (its watchdog adds kFinishedMark to its
// counter when stopped: by Stop, the destructor, or at exit), so ranks that finish at
// different times do not count each other's silence. A store whose port refuses connections
// was closed by its host's process (rank 0 exited), which a launcher sees: the watchdog
// then stops watching, quietly.
//
// sharding/rendezvous.h's ConnectStore starts one for every job of more than one rank, with
// the timeout CPPTRAIN_PEER_TIMEOUT_S gives (default 15 s; 0 turns it off):
//
//   CT_ASSIGN_OR_RETURN(std::chrono::milliseconds timeout, PeerTimeoutFromEnvironment());
//   PeerWatchdogOptions options;
//   options.rank = env.rank;
//   options.world_size = env.world_size;
//   options.host = env.master_addr;
//   options.port = env.master_port;
//   options.timeout = timeout;
//   CT_ASSIGN_OR_RETURN(std::unique_ptr<PeerWatchdog> watchdog, PeerWatchdog::Start(options));
//   ...
//   watchdog->Stop();  // or its destructor: marks this rank finished, joins the threads
//
// Cost: one store request per rank and interval to beat and two to read, over a TCPStore
// connection of the watchdog's own (c10d's client is not safe to share between threads in
// LibTorch 1.13, and the shared one may be busy in a long wait): 3 * world_size small
// requests per interval at the store's host. A silent rank is named by the two ranks watching
// it; their exit makes the launcher stop the rest.
#ifndef CPPTRAIN_SHARDING_PEER_WATCHDOG_H_
#define CPPTRAIN_SHARDING_PEER_WATCHDOG_H_

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace cpptrain {

inline constexpr char kPeerTimeoutVariable[] = "CPPTRAIN_PEER_TIMEOUT_S";
// With tools/launch's 10 s grace period before SIGKILL: a stopped rank's job ends about
// 15 + 1 + 10 s after the stop, under 30 s.
inline constexpr std::chrono::milliseconds kDefaultPeerTimeout{15000};
// EX_TEMPFAIL (sysexits.h): the job may succeed when started again.
inline constexpr int kPeerSilentExitCode = 75;

// CPPTRAIN_PEER_TIMEOUT_S as a duration: unset or empty gives kDefaultPeerTimeout, "0" zero
// (no watchdog), a number of seconds from 1 to 86400 (fractions allowed) that. Anything else
// is InvalidArgument naming the variable, its value and what to set instead.
absl::StatusOr<std::chrono::milliseconds> PeerTimeoutFromEnvironment();
absl::StatusOr<std::chrono::milliseconds> PeerTimeoutFromEnvironment(
    const std::function<const char*(const char*)>& getenv);

// How often a watchdog with `timeout` beats and reads: a tenth of it, at most 1 s.
std::chrono::milliseconds HeartbeatInterval(std::chrono::milliseconds timeout);

struct PeerWatchdogOptions {
  int rank = 0;
  int world_size = 1;
  // The TCPStore the ranks met at.
  std::string host;
  int port = 0;
  // The prefix of the ranks' keys in that store (torchrun's agent store: "/worker/attempt_N");
  // empty for none.
  std::string key_prefix;
  // Who hosts the store, for the message: "rank 0" or "torchrun's agent".
  std::string store_host = "rank 0";
  std::chrono::milliseconds timeout = kDefaultPeerTimeout;
  // Zero: HeartbeatInterval(timeout).
  std::chrono::milliseconds interval{0};
  // Called once, on the watchdog's thread, with the line naming the silent ranks (or store).
  // Empty: log it as an error, flush the log, std::_Exit(kPeerSilentExitCode).
  std::function<void(const std::string& message)> on_silence;
  // For the rank whose process hosts the store: Stop first waits, still watching, until every
  // other rank has marked itself finished or its counter has stood still for 3 s (three
  // intervals, if longer: a process gone), at most drain_limit (zero: timeout), then
  // kDrainGrace more, so the server outlives the others' clients. LibTorch 1.13's TCPStore
  // client keeps a thread that ends its process (std::terminate) when the server's socket
  // closes under it; ConnectStore sets this on rank 0 in builds against LibTorch 1.x.
  bool drain_peers_at_stop = false;
  std::chrono::milliseconds drain_limit{0};
};

// How long the store's host waits after the last finished mark: the time a rank takes from
// its mark to closing the watchdog's own connection.
inline constexpr std::chrono::milliseconds kDrainGrace{200};

class PeerWatchdog {
 public:
  // Starts the watchdog's two threads: one talks to the store (its requests may block while
  // the store's host is stopped), the other judges the silence from what the first recorded,
  // so a blocked request never hides it. InvalidArgument for a rank outside the world, a world
  // of one, a port outside 1..65535 or a timeout that is not positive.
  static absl::StatusOr<std::unique_ptr<PeerWatchdog>> Start(PeerWatchdogOptions options);

  // Stop().
  ~PeerWatchdog();
  PeerWatchdog(const PeerWatchdog&) = delete;
  PeerWatchdog& operator=(const PeerWatchdog&) = delete;

  // With drain_peers_at_stop, first waits for the other ranks' finished marks (above). Then
  // marks this rank finished in the store and joins the threads. Waits at most 2 s (or two
  // intervals, if longer) for a store request in flight; a thread still blocked after that
  // (the store's host is stopped) is left to end with the process. Idempotent; a no-op in a
  // forked child.
  void Stop();

  // options.drain_peers_at_stop: the exit handler stops such watchdogs after the others.
  bool DrainsPeersAtStop() const { return options_.drain_peers_at_stop; }

 private:
  struct Shared;
  PeerWatchdog(PeerWatchdogOptions options, std::shared_ptr<Shared> shared);
  // The two threads' bodies; each holds `shared` so a thread left behind by Stop still has it.
  static void RunBeats(PeerWatchdogOptions options, std::shared_ptr<Shared> shared);
  static void RunJudge(PeerWatchdogOptions options, std::shared_ptr<Shared> shared);
  // Stop's wait for the other ranks' finished marks (drain_peers_at_stop).
  void AwaitPeersFinished();

  const PeerWatchdogOptions options_;
  const std::shared_ptr<Shared> shared_;
  const int owner_pid_;
  std::mutex stop_mu_;
  bool stopped_ = false;  // guarded by stop_mu_
  std::thread beats_;
  std::thread judge_;
};

}  // namespace cpptrain

#endif  // CPPTRAIN_SHARDING_PEER_WATCHDOG_H_
