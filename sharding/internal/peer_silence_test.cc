#include "sharding/internal/peer_silence.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace cpptrain {
namespace sharding_internal {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int kWorld = 3;
constexpr int kForever = 1 << 20;
const WatchdogClock::time_point kStart{};

WatchdogClock::time_point At(double seconds) {
  return kStart + std::chrono::duration_cast<WatchdogClock::duration>(
                      std::chrono::duration<double>(seconds));
}

double Seconds(WatchdogClock::duration d) { return std::chrono::duration<double>(d).count(); }

// One scenario seen by rank 0 of 3 with a 15 s timeout: every peer adds one to its counter
// each second until it stops (or finishes); rank 0's watchdog reads a round each whole second
// while the store answers and checks every half second while this process runs.
struct Row {
  const char* name;
  int end_s = 60;
  std::map<int, int> beats_until;  // rank -> last second it beats; -1: never; absent: always
  std::map<int, int> finishes_at;  // rank -> second it adds kFinishedMark and stops
  int store_until = kForever;      // last second a round completes
  std::pair<double, double> paused{0, 0};  // [from, to): this process does not run
  bool job_paused = false;  // the peers do not run then either (the whole job was suspended)
  std::optional<double> fires_at;  // the first check whose verdict fired; none: never
  std::vector<int> silent;         // its silent ranks
  bool store_silent = false;
  std::optional<double> pause_seen;  // the paused_for some check reported
};

int64_t Counter(const Row& row, int rank, double now) {
  // Whole seconds the peer ran.
  const double paused = row.job_paused ? std::max(0.0, std::min(now, row.paused.second) -
                                                           row.paused.first)
                                       : 0.0;
  const int t = static_cast<int>(now - paused);
  if (auto finish = row.finishes_at.find(rank); finish != row.finishes_at.end()) {
    return t >= finish->second ? finish->second + kFinishedMark : t;
  }
  auto until = row.beats_until.find(rank);
  if (until == row.beats_until.end()) return t;
  return until->second < 0 ? 0 : std::min(t, until->second);
}

struct Outcome {
  std::optional<double> fired_at;
  SilenceVerdict verdict;
  std::optional<double> pause_seen;
};

Outcome Simulate(const Row& row) {
  PeerSilence silence(/*rank=*/0, kWorld, std::chrono::seconds(15), kStart);
  Outcome outcome;
  for (int tick = 1; tick <= 2 * row.end_s; ++tick) {
    const double t = tick / 2.0;
    if (t >= row.paused.first && t < row.paused.second) continue;
    if (tick % 2 == 0 && tick / 2 <= row.store_until) {
      std::vector<int64_t> counters;
      for (int r = 0; r < kWorld; ++r) counters.push_back(Counter(row, r, t));
      silence.RecordRound(At(t), counters);
    }
    SilenceVerdict verdict = silence.Check(At(t));
    if (verdict.paused_for.count() > 0) outcome.pause_seen = Seconds(verdict.paused_for);
    if (verdict.Fired()) {
      outcome.fired_at = t;
      outcome.verdict = std::move(verdict);
      break;
    }
  }
  return outcome;
}

const Row kRows[] = {
    {.name = "every peer beats"},
    {.name = "a peer stops: silent once the rounds saw no change for 15 s",
     .beats_until = {{2, 10}},
     .fires_at = 25,
     .silent = {2}},
    {.name = "two peers stop: each is named when its own 15 s are up",
     .beats_until = {{1, 10}, {2, 12}},
     .fires_at = 25,
     .silent = {1}},
    {.name = "a peer that never beats is silent from the start",
     .beats_until = {{1, -1}},
     .fires_at = 15,
     .silent = {1}},
    {.name = "a finished peer is never silent", .finishes_at = {{2, 10}}},
    {.name = "this rank's own counter is not judged", .beats_until = {{0, -1}}},
    {.name = "the store stops answering: the store is named, not the peers",
     .store_until = 10,
     .fires_at = 25,
     .store_silent = true},
    {.name = "a slow store delays a stopped peer's verdict instead of faking others'",
     .beats_until = {{2, 9}},
     .store_until = 10,
     .fires_at = 25,
     .store_silent = true},
    {.name = "this process paused 30 s while the peers beat: clocks restart, nothing fires",
     .paused = {10, 39.5},
     .pause_seen = 30},
    {.name = "the whole job suspended 30 s: nothing fires after the resume",
     .paused = {10, 39.5},
     .job_paused = true,
     .pause_seen = 30},
    {.name = "a peer stopped during this process's pause is named 15 s after the resume",
     .beats_until = {{2, 10}},
     .paused = {10, 39.5},
     .fires_at = 55,
     .silent = {2},
     .pause_seen = 30},
    {.name = "a pause shorter than half the timeout counts toward a peer's silence",
     .beats_until = {{2, 10}},
     .paused = {20, 25},
     .fires_at = 25,
     .silent = {2}},
};

TEST(PeerSilenceTest, Scenarios) {
  for (const Row& row : kRows) {
    SCOPED_TRACE(row.name);
    const Outcome outcome = Simulate(row);
    EXPECT_EQ(outcome.fired_at, row.fires_at);
    std::vector<int> silent;
    for (const SilentRank& s : outcome.verdict.silent_ranks) silent.push_back(s.rank);
    EXPECT_THAT(silent, ElementsAreArray(row.silent));
    EXPECT_EQ(outcome.verdict.store_silent, row.store_silent);
    EXPECT_EQ(outcome.pause_seen, row.pause_seen);
  }
}

// Each rank watches the next two around the ring, so every rank has two watchers and the store
// serves three requests a rank a round; a rank it does not watch is never judged.
TEST(PeerSilenceTest, EachRankWatchesTheNextTwoAroundTheRing) {
  EXPECT_THAT(WatchedPeers(0, 2), ElementsAreArray({1}));
  EXPECT_THAT(WatchedPeers(2, 3), ElementsAreArray({0, 1}));
  EXPECT_THAT(WatchedPeers(6, 8), ElementsAreArray({7, 0}));
  EXPECT_THAT(WatchedPeers(3, 512), ElementsAreArray({4, 5}));
  constexpr int kBig = 8;
  std::vector<int> watchers(kBig, 0);
  for (int r = 0; r < kBig; ++r) {
    for (int w : WatchedPeers(r, kBig)) ++watchers[w];
  }
  EXPECT_THAT(watchers, ::testing::Each(2));

  PeerSilence silence(/*rank=*/0, kBig, std::chrono::seconds(15), kStart);
  std::vector<int64_t> counters(kBig, 0);
  SilenceVerdict verdict;
  for (int t = 1; t <= 20 && !verdict.Fired(); ++t) {
    counters[1] = t;  // rank 1 beats; ranks 2 (watched) and 3..7 (not watched) never do
    silence.RecordRound(At(t), counters);
    verdict = silence.Check(At(t));
  }
  std::vector<int> silent;
  for (const SilentRank& s : verdict.silent_ranks) silent.push_back(s.rank);
  EXPECT_THAT(silent, ElementsAreArray({2}));
}

TEST(PeerSilenceTest, SilenceIsMeasuredFromTheRoundThatFirstSawTheLastValue) {
  PeerSilence silence(/*rank=*/1, /*world_size=*/2, std::chrono::seconds(15), kStart);
  silence.RecordRound(At(1), {5, 0});
  silence.RecordRound(At(2), {5, 0});
  silence.Check(At(2));
  for (int t = 3; t <= 15; ++t) {
    silence.RecordRound(At(t), {5, 0});
    EXPECT_FALSE(silence.Check(At(t)).Fired()) << "t=" << t;
  }
  // 16 s after the start, 15 s after the first round that saw 5.
  silence.RecordRound(At(16), {5, 0});
  const SilenceVerdict verdict = silence.Check(At(16));
  ASSERT_EQ(verdict.silent_ranks.size(), 1u);
  EXPECT_EQ(verdict.silent_ranks[0].rank, 0);
  EXPECT_DOUBLE_EQ(Seconds(verdict.silent_ranks[0].silent_for), 15.0);
}

SilenceContext Context() {
  SilenceContext context;
  context.rank = 1;
  context.world_size = 4;
  context.timeout = std::chrono::seconds(15);
  context.store_address = "10.0.0.1:29500";
  context.store_host = "rank 0";
  context.exit_code = 75;
  return context;
}

TEST(DescribeSilenceTest, NamesTheSilentRankHowLongAndTheCauses) {
  SilenceVerdict verdict;
  verdict.silent_ranks = {{3, std::chrono::milliseconds(15250)}};
  const std::string line = DescribeSilence(verdict, Context());
  EXPECT_THAT(line, HasSubstr("peer watchdog on rank 1 of 4: rank 3 has sent no heartbeat for "
                              "15.2 s (timeout 15.0 s)"));
  EXPECT_THAT(line, HasSubstr("it is probably stopped (SIGSTOP, a debugger), hung with all its "
                              "threads"));
  EXPECT_THAT(line, HasSubstr("dead on a host"));
  EXPECT_THAT(line, HasSubstr("by the network"));
  EXPECT_THAT(line, HasSubstr("exit code 75"));
  EXPECT_THAT(line, HasSubstr("ddp_timeout"));
  EXPECT_THAT(line, HasSubstr("CPPTRAIN_PEER_TIMEOUT_S"));
}

TEST(DescribeSilenceTest, ListsSeveralRanksWithTheLongestSilence) {
  SilenceVerdict verdict;
  for (int r = 2; r < 40; ++r) verdict.silent_ranks.push_back({r, std::chrono::seconds(r)});
  const std::string line = DescribeSilence(verdict, Context());
  EXPECT_THAT(line, HasSubstr("ranks 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17 and "
                              "22 more have sent no heartbeat for 39.0 s"));
  EXPECT_THAT(line, HasSubstr("they are probably stopped (SIGSTOP, a debugger), hung with all "
                              "their threads, dead on a host whose launcher cannot see them"));
}

TEST(DescribeSilenceTest, NamesTheStoreAndItsHost) {
  SilenceVerdict verdict;
  verdict.store_silent = true;
  verdict.store_silent_for = std::chrono::milliseconds(15600);
  SilenceContext context = Context();
  context.last_store_error = "Connection reset by peer";
  const std::string line = DescribeSilence(verdict, context);
  EXPECT_THAT(line, HasSubstr("the store at 10.0.0.1:29500, hosted by rank 0, has not answered "
                              "for 15.6 s (timeout 15.0 s; last error: Connection reset by "
                              "peer): rank 0 is probably stopped"));
  EXPECT_THAT(line, HasSubstr("exit code 75"));

  context.store_host = "torchrun's agent";
  context.last_store_error.clear();
  const std::string agent = DescribeSilence(verdict, context);
  EXPECT_THAT(agent, HasSubstr("hosted by torchrun's agent, has not answered for 15.6 s "
                               "(timeout 15.0 s): the agent is probably stopped"));
  EXPECT_THAT(agent, Not(HasSubstr("last error")));
}

TEST(DescribeSilenceTest, PauseSaysTheClocksRestart) {
  SilenceVerdict verdict;
  verdict.paused_for = std::chrono::seconds(30);
  EXPECT_THAT(DescribePause(verdict, Context()),
              HasSubstr("rank 1 of 4: this process did not run for 30.0 s"));
}

}  // namespace
}  // namespace sharding_internal
}  // namespace cpptrain
