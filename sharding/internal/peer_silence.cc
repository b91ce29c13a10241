#include "sharding/internal/peer_silence.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace cpptrain {
namespace sharding_internal {
namespace {

constexpr size_t kRanksNamed = 16;

std::string Seconds(WatchdogClock::duration d) {
  return absl::StrFormat("%.1f s", std::chrono::duration<double>(d).count());
}

std::string Speaker(const SilenceContext& context) {
  return absl::StrCat("peer watchdog on rank ", context.rank, " of ", context.world_size, ": ");
}

std::string WhatHappensNext(const SilenceContext& context) {
  return absl::StrCat(
      " Ending this rank with exit code ", context.exit_code,
      " so the launcher stops the job, instead of every rank waiting in its collective until "
      "ddp_timeout (CPPTRAIN_PEER_TIMEOUT_S sets the timeout; 0 turns the watchdog off)");
}

std::string DescribeSilentStore(const SilenceVerdict& verdict, const SilenceContext& context) {
  const bool agent = context.store_host != "rank 0";
  return absl::StrCat(
      Speaker(context), "the store at ", context.store_address, ", hosted by ",
      context.store_host, ", has not answered for ", Seconds(verdict.store_silent_for),
      " (timeout ", Seconds(context.timeout),
      context.last_store_error.empty() ? "" : absl::StrCat("; last error: ",
                                                           context.last_store_error),
      "): ", agent ? "the agent" : context.store_host,
      " is probably stopped (SIGSTOP, a debugger), hung, dead on another host, or cut off by "
      "the network.",
      WhatHappensNext(context));
}

std::string DescribeSilentRanks(const SilenceVerdict& verdict, const SilenceContext& context) {
  std::vector<int> ranks;
  WatchdogClock::duration longest{};
  for (const SilentRank& silent : verdict.silent_ranks) {
    if (ranks.size() < kRanksNamed) ranks.push_back(silent.rank);
    longest = std::max(longest, silent.silent_for);
  }
  const size_t count = verdict.silent_ranks.size();
  const bool one = count == 1;
  const std::string more =
      count > kRanksNamed ? absl::StrCat(" and ", count - kRanksNamed, " more") : "";
  return absl::StrCat(
      Speaker(context), one ? "rank " : "ranks ", absl::StrJoin(ranks, ", "), more,
      one ? " has" : " have", " sent no heartbeat for ", Seconds(longest), " (timeout ",
      Seconds(context.timeout), "): ", one ? "it is" : "they are",
      " probably stopped (SIGSTOP, a debugger), hung with all ", one ? "its" : "their",
      " threads, dead on a host whose launcher cannot see ", one ? "it" : "them",
      ", or cut off from the store at ", context.store_address, " by the network.",
      WhatHappensNext(context));
}

}  // namespace

std::vector<int> WatchedPeers(int rank, int world_size) {
  std::vector<int> watched;
  for (int step = 1; step <= kWatchedPeers && step < world_size; ++step) {
    watched.push_back((rank + step) % world_size);
  }
  return watched;
}

PeerSilence::PeerSilence(int rank, int world_size, WatchdogClock::duration timeout,
                         WatchdogClock::time_point start)
    : rank_(rank),
      timeout_(timeout),
      peers_(static_cast<size_t>(world_size)),
      last_round_(start),
      last_check_(start) {
  for (Peer& peer : peers_) peer.finished = true;
  for (int r : WatchedPeers(rank, world_size)) peers_[static_cast<size_t>(r)].finished = false;
  RestartClocks(start);
}

void PeerSilence::RestartClocks(WatchdogClock::time_point now) {
  last_round_ = now;
  for (Peer& peer : peers_) peer.changed = now;
}

void PeerSilence::RecordRound(WatchdogClock::time_point now,
                              absl::Span<const int64_t> counters) {
  last_round_ = now;
  const size_t n = std::min(counters.size(), peers_.size());
  for (size_t r = 0; r < n; ++r) {
    Peer& peer = peers_[r];
    if (counters[r] >= kFinishedMark) peer.finished = true;
    if (counters[r] != peer.counter) {
      peer.counter = counters[r];
      peer.changed = now;
    }
  }
}

SilenceVerdict PeerSilence::Check(WatchdogClock::time_point now) {
  SilenceVerdict verdict;
  if (now - last_check_ > timeout_ / 2) {
    verdict.paused_for = now - last_check_;
    RestartClocks(now);
  }
  last_check_ = now;
  if (now - last_round_ >= timeout_) {
    verdict.store_silent = true;
    verdict.store_silent_for = now - last_round_;
    return verdict;
  }
  for (int r = 0; r < static_cast<int>(peers_.size()); ++r) {
    const Peer& peer = peers_[r];
    if (r == rank_ || peer.finished) continue;
    const WatchdogClock::duration silent_for = last_round_ - peer.changed;
    if (silent_for >= timeout_) verdict.silent_ranks.push_back({r, silent_for});
  }
  return verdict;
}

std::string DescribeSilence(const SilenceVerdict& verdict, const SilenceContext& context) {
  return verdict.store_silent ? DescribeSilentStore(verdict, context)
                              : DescribeSilentRanks(verdict, context);
}

std::string DescribePause(const SilenceVerdict& verdict, const SilenceContext& context) {
  return absl::StrCat(Speaker(context), "this process did not run for ",
                      Seconds(verdict.paused_for),
                      " (stopped, suspended with the job, or starved of CPU); the peers' "
                      "clocks start again now rather than counting that time as their silence");
}

}  // namespace sharding_internal
}  // namespace cpptrain
