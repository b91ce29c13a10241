#include "sharding/peer_watchdog.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace cpptrain {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using std::chrono::milliseconds;

absl::StatusOr<milliseconds> FromValue(const char* value) {
  return PeerTimeoutFromEnvironment([value](const char* name) -> const char* {
    return std::string(name) == kPeerTimeoutVariable ? value : nullptr;
  });
}

TEST(PeerTimeoutFromEnvironmentTest, DefaultOffAndSeconds) {
  const std::vector<std::pair<const char*, milliseconds>> good = {
      {nullptr, milliseconds(15000)}, {"", milliseconds(15000)}, {"0", milliseconds(0)},
      {"1", milliseconds(1000)},      {"2.5", milliseconds(2500)}, {"30", milliseconds(30000)},
      {"86400", milliseconds(86400000)}};
  for (const auto& [value, expected] : good) {
    absl::StatusOr<milliseconds> timeout = FromValue(value);
    ASSERT_TRUE(timeout.ok()) << (value ? value : "unset") << ": " << timeout.status();
    EXPECT_EQ(*timeout, expected) << (value ? value : "unset");
  }
}

TEST(PeerTimeoutFromEnvironmentTest, BadValuesNameTheVariableTheValueAndTheFix) {
  for (const char* value : {"abc", "15s", "-1", "0.5", "86401", "nan", "inf"}) {
    absl::StatusOr<milliseconds> timeout = FromValue(value);
    ASSERT_FALSE(timeout.ok()) << value;
    EXPECT_EQ(timeout.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(timeout.status().message()),
                AllOf(HasSubstr(std::string("CPPTRAIN_PEER_TIMEOUT_S=\"") + value + "\""),
                      HasSubstr("from 1 to 86400"), HasSubstr("15 when unset"),
                      HasSubstr("0 to turn the peer watchdog off")));
  }
}

TEST(HeartbeatIntervalTest, ATenthOfTheTimeoutAtMostOneSecond) {
  EXPECT_EQ(HeartbeatInterval(milliseconds(15000)), milliseconds(1000));
  EXPECT_EQ(HeartbeatInterval(milliseconds(5000)), milliseconds(500));
  EXPECT_EQ(HeartbeatInterval(milliseconds(1000)), milliseconds(100));
}

TEST(PeerWatchdogTest, StartRejectsBadOptions) {
  PeerWatchdogOptions options;
  options.host = "127.0.0.1";
  options.port = 29500;
  options.world_size = 1;
  EXPECT_THAT(std::string(PeerWatchdog::Start(options).status().message()),
              HasSubstr("got rank 0, world_size 1"));
  options.world_size = 2;
  options.rank = 2;
  EXPECT_THAT(std::string(PeerWatchdog::Start(options).status().message()),
              HasSubstr("got rank 2, world_size 2"));
  options.rank = 0;
  options.port = 0;
  EXPECT_THAT(std::string(PeerWatchdog::Start(options).status().message()),
              HasSubstr("port 0 is outside 1..65535"));
  options.port = 29500;
  options.interval = milliseconds(20000);
  EXPECT_THAT(std::string(PeerWatchdog::Start(options).status().message()),
              HasSubstr("got interval 20000 ms, timeout 15000 ms"));
}

// A TCP socket listening on a free port of 127.0.0.1 that never accepts: connections complete
// in its backlog and requests get no answer, as from a stopped process's store.
class SilentListener {
 public:
  SilentListener() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t size = sizeof(addr);
    if (bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd_, 16) != 0 ||
        getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &size) != 0) {
      ADD_FAILURE() << "cannot listen on 127.0.0.1";
    }
    port_ = ntohs(addr.sin_port);
  }
  ~SilentListener() { close(fd_); }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

c10::intrusive_ptr<c10d::TCPStore> HostStore() {
  c10d::TCPStoreOptions options;
  options.port = 0;
  options.isServer = true;
  options.waitWorkers = false;
  options.multiTenant = true;
  return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
}

// What one rank's watchdog reported; the first report only.
class Reports {
 public:
  std::function<void(const std::string&)> Callback(int rank) {
    return [this, rank](const std::string& message) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!messages_.emplace(rank, message).second) return;
      fired_[rank].Notify();
    };
  }
  // Waits up to `wait` for `rank`'s report.
  std::optional<std::string> Await(int rank, absl::Duration wait) {
    if (!fired_[rank].WaitForNotificationWithTimeout(wait)) return std::nullopt;
    std::lock_guard<std::mutex> lock(mu_);
    return messages_.at(rank);
  }

 private:
  std::mutex mu_;
  std::map<int, std::string> messages_;  // guarded by mu_
  absl::Notification fired_[4];
};

PeerWatchdogOptions RankOptions(int rank, int world, int port, milliseconds timeout,
                                Reports& reports) {
  PeerWatchdogOptions options;
  options.rank = rank;
  options.world_size = world;
  options.host = "127.0.0.1";
  options.port = port;
  options.timeout = timeout;
  options.on_silence = reports.Callback(rank);
  return options;
}

std::unique_ptr<PeerWatchdog> Start(const PeerWatchdogOptions& options) {
  absl::StatusOr<std::unique_ptr<PeerWatchdog>> watchdog = PeerWatchdog::Start(options);
  EXPECT_TRUE(watchdog.ok()) << watchdog.status();
  return watchdog.ok() ? *std::move(watchdog) : nullptr;
}

std::unique_ptr<PeerWatchdog> StartRank(int rank, int world, int port, milliseconds timeout,
                                        Reports& reports) {
  return Start(RankOptions(rank, world, port, timeout, reports));
}

// Rank 0's options as ConnectStore gives them under LibTorch 1.x: it drains at Stop.
PeerWatchdogOptions HostOptions(int world, int port, milliseconds timeout, Reports& reports) {
  PeerWatchdogOptions options = RankOptions(0, world, port, timeout, reports);
  options.drain_peers_at_stop = true;
  return options;
}

TEST(PeerWatchdogTest, ASilentRankIsNamedByEveryOther) {
  auto store = HostStore();
  Reports reports;
  // Rank 1 of 3 never starts its watchdog: it is silent from the start.
  auto rank0 = StartRank(0, 3, store->getPort(), milliseconds(1000), reports);
  auto rank2 = StartRank(2, 3, store->getPort(), milliseconds(1000), reports);
  for (int rank : {0, 2}) {
    const std::optional<std::string> message = reports.Await(rank, absl::Seconds(20));
    ASSERT_TRUE(message.has_value()) << "rank " << rank << " did not report rank 1";
    EXPECT_THAT(*message, AllOf(HasSubstr(absl::StrCat("peer watchdog on rank ", rank, " of 3: "
                                                       "rank 1 has sent no heartbeat for ")),
                                HasSubstr("(timeout 1.0 s)"), HasSubstr("exit code 75")));
  }
}

TEST(PeerWatchdogTest, ARankThatStoppedNormallyIsNotSilent) {
  auto store = HostStore();
  Reports reports;
  const milliseconds timeout(2000);
  auto rank0 = StartRank(0, 2, store->getPort(), timeout, reports);
  auto rank1 = StartRank(1, 2, store->getPort(), timeout, reports);
  rank1->Stop();  // marks rank 1 finished
  // Rank 1 is silent from now on, for well past the timeout: finished, so not reported.
  EXPECT_EQ(reports.Await(0, absl::Seconds(6)), std::nullopt);
  rank0->Stop();
}

TEST(PeerWatchdogTest, AStoreThatDoesNotAnswerIsNamedWithItsHost) {
  // Never closed: that would reset the connections waiting in its backlog, and the thread
  // LibTorch 1.13's TCPStore client keeps for callbacks lets that exception end the process
  // (std::terminate). A watchdog that reports a silent store ends its process first.
  static const SilentListener& listener = *new SilentListener;
  Reports reports;
  auto rank1 = StartRank(1, 2, listener.port(), milliseconds(1000), reports);
  const std::optional<std::string> message = reports.Await(1, absl::Seconds(20));
  ASSERT_TRUE(message.has_value()) << "the unanswering store was not reported";
  EXPECT_THAT(*message, HasSubstr(absl::StrCat("the store at 127.0.0.1:", listener.port(),
                                               ", hosted by rank 0, has not answered for ")));
  EXPECT_THAT(*message, HasSubstr("rank 0 is probably stopped"));
  // Its beats thread is blocked in a request the listener never answers: Stop returns anyway.
  const auto start = std::chrono::steady_clock::now();
  rank1->Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(PeerWatchdogTest, AStoreWhoseHostExitedEndsTheWatchQuietly) {
  auto store = HostStore();
  Reports reports;
  const milliseconds timeout(2000);
  auto rank0 = StartRank(0, 2, store->getPort(), timeout, reports);
  auto rank1 = StartRank(1, 2, store->getPort(), timeout, reports);
  // The store's host goes away (rank 0 exiting: its port now refuses connections). Nobody
  // beats any more, and nobody can tell, so nobody is blamed: a launcher sees such an exit.
  store.reset();
  EXPECT_EQ(reports.Await(1, absl::Seconds(6)), std::nullopt);
  EXPECT_EQ(reports.Await(0, absl::Seconds(0)), std::nullopt);
}

// The store's host, draining at Stop, returns only after the others' finished marks and the
// grace that lets their connections close.
TEST(PeerWatchdogTest, TheStoresHostStopsAfterTheOthersFinished) {
  auto store = HostStore();
  Reports reports;
  const milliseconds timeout(5000);
  auto host = Start(HostOptions(3, store->getPort(), timeout, reports));
  ASSERT_NE(host, nullptr);
  auto rank1 = StartRank(1, 3, store->getPort(), timeout, reports);
  auto rank2 = StartRank(2, 3, store->getPort(), timeout, reports);
  std::atomic<bool> others_stopping{false};
  std::chrono::steady_clock::time_point others_from;
  std::thread others([&] {
    std::this_thread::sleep_for(milliseconds(400));
    others_from = std::chrono::steady_clock::now();
    others_stopping = true;
    rank1->Stop();
    rank2->Stop();
  });
  host->Stop();
  const auto host_at = std::chrono::steady_clock::now();
  // The host returned: both finished marks must be in the store already.
  for (int r : {1, 2}) {
    const std::string key = absl::StrCat("cpptrain_peer_watchdog/heartbeat/", r);
    EXPECT_GE(store->add(key, 0), int64_t{1} << 40)
        << "the host stopped before rank " << r << " had marked itself finished";
  }
  const bool began_before_host = others_stopping.load();
  others.join();
  ASSERT_TRUE(began_before_host) << "the host stopped before the others began to";
  EXPECT_GE(host_at - others_from, kDrainGrace);
  EXPECT_EQ(reports.Await(0, absl::Seconds(0)), std::nullopt);
}

// A rank that beats but never finishes holds the host at most drain_limit.
TEST(PeerWatchdogTest, TheStoresHostWaitsAtMostTheDrainLimit) {
  auto store = HostStore();
  Reports reports;
  PeerWatchdogOptions options = HostOptions(2, store->getPort(), milliseconds(10000), reports);
  options.drain_limit = milliseconds(300);
  auto host = Start(options);
  ASSERT_NE(host, nullptr);
  auto rank1 = StartRank(1, 2, store->getPort(), options.timeout, reports);
  const auto start = std::chrono::steady_clock::now();
  host->Stop();
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_GE(waited, milliseconds(300));
  EXPECT_LT(waited, milliseconds(3000));
  rank1->Stop();
}

// A rank that does not beat (here: never started; in a job, a process gone) is not waited for
// past 3 s (three intervals, if longer), well before the limit.
TEST(PeerWatchdogTest, TheStoresHostDoesNotWaitForARankThatStoppedBeating) {
  auto store = HostStore();
  Reports reports;
  PeerWatchdogOptions options = HostOptions(2, store->getPort(), milliseconds(20000), reports);
  options.interval = milliseconds(100);
  auto host = Start(options);
  ASSERT_NE(host, nullptr);
  const auto start = std::chrono::steady_clock::now();
  host->Stop();
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_GE(waited, milliseconds(3000));
  EXPECT_LT(waited, milliseconds(12000));
}

}  // namespace
}  // namespace cpptrain
