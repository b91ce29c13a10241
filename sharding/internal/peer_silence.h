// The peer watchdog's decisions (sharding/peer_watchdog.h), free of threads, sockets and
// clocks so tests drive them with made-up times: which peers' heartbeat counters stopped
// changing, whether the store stopped answering, and the line that says so.
//
//   PeerSilence silence(/*rank=*/0, /*world_size=*/3, std::chrono::seconds(15), start);
//   silence.RecordRound(now, {0, 7, 9});  // every rank's counter, read from the store
//   const SilenceVerdict verdict = silence.Check(now);
//   if (verdict.Fired()) LOG(ERROR) << DescribeSilence(verdict, context);
//
// Private to //sharding.
#ifndef CPPTRAIN_SHARDING_INTERNAL_PEER_SILENCE_H_
#define CPPTRAIN_SHARDING_INTERNAL_PEER_SILENCE_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"

namespace cpptrain {
namespace sharding_internal {

using WatchdogClock = std::chrono::steady_clock;

// A counter at or above this says the rank ended normally: its watchdog adds it on the way
// out (2^40 beats would take 35,000 years at one a second).
inline constexpr int64_t kFinishedMark = int64_t{1} << 40;

struct SilentRank {
  int rank = 0;
  WatchdogClock::duration silent_for{};
};

struct SilenceVerdict {
  // Peers whose counter did not change for the timeout, as far as the last round saw, and
  // that did not finish; by rank. Empty when the store is silent (its data is stale then).
  std::vector<SilentRank> silent_ranks;
  // No round completed for the timeout: the store (or its host) does not answer.
  bool store_silent = false;
  WatchdogClock::duration store_silent_for{};
  // Non-zero when this process itself did not run for that long (stopped, suspended with
  // the whole job, starved): every clock restarted at this check instead of blaming peers.
  WatchdogClock::duration paused_for{};

  bool Fired() const { return store_silent || !silent_ranks.empty(); }
};

// The ranks `rank` watches: the next kWatchedPeers after it around the ring (all others when
// the world is smaller). Every rank is watched by as many, and the store answers 1 +
// kWatchedPeers requests a rank a round: O(world) a round, not O(world^2).
inline constexpr int kWatchedPeers = 2;
std::vector<int> WatchedPeers(int rank, int world_size);

class PeerSilence {
 public:
  // Every clock starts at `start`; a watched peer (WatchedPeers) that never beats is silent
  // from then. The others are never judged.
  PeerSilence(int rank, int world_size, WatchdogClock::duration timeout,
              WatchdogClock::time_point start);

  // One round of reads that ended at `now`: counters[r] is rank r's heartbeat counter (this
  // rank's own is ignored). Needs counters.size() == world_size.
  void RecordRound(WatchdogClock::time_point now, absl::Span<const int64_t> counters);

  // The verdict at `now`. The store is judged on the time since the last round; peers on
  // what that round saw (a slow store delays a peer's verdict, it never fakes one). A gap of
  // more than half the timeout since the previous Check means this process did not run.
  SilenceVerdict Check(WatchdogClock::time_point now);

 private:
  struct Peer {
    int64_t counter = 0;
    WatchdogClock::time_point changed;
    bool finished = false;  // also for the ranks this one does not watch
  };
  void RestartClocks(WatchdogClock::time_point now);

  const int rank_;
  const WatchdogClock::duration timeout_;
  std::vector<Peer> peers_;  // by rank
  WatchdogClock::time_point last_round_;
  WatchdogClock::time_point last_check_;
};

// What the line about a verdict needs besides the verdict.
struct SilenceContext {
  int rank = 0;
  int world_size = 1;
  WatchdogClock::duration timeout{};
  std::string store_address;  // "host:port"
  std::string store_host;     // "rank 0" or "torchrun's agent"
  std::string last_store_error;  // empty when the last request did not fail
  int exit_code = 0;
};

// The one line a watchdog logs before it ends its process: who is silent, for how long, the
// likely causes, and what happens next. Call only for a verdict that Fired().
std::string DescribeSilence(const SilenceVerdict& verdict, const SilenceContext& context);

// The warning for a verdict with paused_for set.
std::string DescribePause(const SilenceVerdict& verdict, const SilenceContext& context);

}  // namespace sharding_internal
}  // namespace cpptrain

#endif  // CPPTRAIN_SHARDING_INTERNAL_PEER_SILENCE_H_
