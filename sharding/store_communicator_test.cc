#include "sharding/store_communicator.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "sharding/testing/communicator_conformance.h"
#include "sharding/testing/expectations.h"
#include "sharding/testing/multi_rank.h"

namespace cpptrain {
namespace {

using ::cpptrain::conformance::CommunicatorConformanceTest;
using ::testing::HasSubstr;
using StorePtr = c10::intrusive_ptr<c10d::Store>;

constexpr std::chrono::seconds kTimeout(60);

absl::StatusOr<std::unique_ptr<StoreCommunicator>> Join(const StorePtr& store, int rank,
                                                        int world) {
  return StoreCommunicator::Create(store, rank, world, kTimeout);
}

conformance::CommunicatorUnderTest Store() {
  conformance::CommunicatorUnderTest store("Store", "store", "StoreCommunicator",
                                           conformance::FactoryOf<StoreCommunicator>());
  store.takes_non_contiguous = true;
  store.op_name = conformance::KebabCase;
  store.collective_timeout_error =
      "rank 0 of 2: store all-reduce #1 did not complete within 1.5 s: rank(s) 1 never "
      "contributed";
  store.join_timeout_error =
      "rank 1 of 3: store join #0 did not complete within 0.5 s: rank(s) 0, 2 never joined";
  store.join_timeout_code = absl::StatusCode::kDeadlineExceeded;
  return store;
}

// The whole suite again with every value over 16 bytes stored in pieces (the default cut is
// 4 MiB, for TCPStore's 8 MiB limit): every collective's data crosses several keys.
conformance::CommunicatorUnderTest StoreInPieces() {
  conformance::CommunicatorUnderTest store = Store();
  store.name = "StoreInPieces";
  store.create = [](StorePtr s, int rank, int size, std::chrono::milliseconds timeout)
      -> absl::StatusOr<std::unique_ptr<Communicator>> {
    return StoreCommunicator::Create(std::move(s), rank, size, timeout, /*max_value_bytes=*/16);
  };
  return store;
}

INSTANTIATE_TEST_SUITE_P(Store, CommunicatorConformanceTest,
                         ::testing::Values(Store(), StoreInPieces()), conformance::TestName);

class StoreKeysTest : public ::testing::TestWithParam<int> {};

INSTANTIATE_TEST_SUITE_P(WorldSizes, StoreKeysTest, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return absl::StrCat("world", info.param); });

// The store holds only what collectives in flight need: each time one of 200 all-reduces
// returns on rank 0, its keys are gone and at most the other ranks' contributions to the next
// one are there; afterwards only each rank's creation counter is left.
TEST_P(StoreKeysTest, ManyCollectivesLeaveNoKeysBehind) {
  const int world = GetParam();
  StorePtr shared;
  std::atomic<int64_t> most_keys{0};
  absl::Status s =
      multi_rank::RunRanksAsThreads(world, [&](int rank, StorePtr store) -> absl::Status {
        if (rank == 0) shared = store;
        CT_ASSIGN_OR_RETURN(auto comm, Join(store, rank, world));
        Expectations expect(rank);
        constexpr int kSteps = 200;
        for (int step = 0; step < kSteps; ++step) {
          at::Tensor t = at::full({7}, rank + step * 1.0);
          expect.Done(comm->AllReduce(t, ReduceOp::kMax), "AllReduce");
          expect.Equal(t, at::full({7}, world - 1.0 + step), absl::StrCat("AllReduce ", step));
          // (After the last one, the next collective is a reduce-scatter, with more keys.)
          if (rank == 0 && step + 1 < kSteps) {
            most_keys = std::max<int64_t>(most_keys, store->getNumKeys());
          }
        }
        // Reduce-scatter and scatter keys have one reader each, broadcast keys all but one.
        at::Tensor in = at::ones({world * 3});
        at::Tensor out = at::zeros({3});
        expect.Done(comm->ReduceScatter(in, out, ReduceOp::kSum), "ReduceScatter");
        expect.Done(comm->Scatter(rank == 0 ? in : at::Tensor(), out, 0), "Scatter");
        expect.Done(comm->Broadcast(out, world - 1), "Broadcast");
        return expect.status();
      });
  ASSERT_TRUE(s.ok()) << s;
  const int64_t counters = world;  // "store_comm/created/rank<r>"
  EXPECT_LE(most_keys.load(), counters + world - 1);
  EXPECT_EQ(shared->getNumKeys(), counters);
}

// A HashStore that remembers the longest value it was given.
class LongestValueStore : public c10d::HashStore {
 public:
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    longest = std::max<int64_t>(longest, static_cast<int64_t>(value.size()));
    c10d::HashStore::set(key, value);
  }
  std::atomic<int64_t> longest{0};
};

// Values in 8-byte pieces: the store never holds a longer value, every collective's pieces are
// gone once it returns (only each rank's creation counter is left), and a max_value_bytes
// below 1 is refused.
TEST_P(StoreKeysTest, PiecesLeaveNoKeysBehind) {
  const int world = GetParam();
  auto shared = c10::make_intrusive<LongestValueStore>();
  absl::Status s =
      multi_rank::RunRanksAsThreads(world, [&](int rank, StorePtr) -> absl::Status {
        CT_ASSIGN_OR_RETURN(auto comm, StoreCommunicator::Create(shared, rank, world, kTimeout,
                                                                 /*max_value_bytes=*/8));
        Expectations expect(rank);
        for (int step = 0; step < 5; ++step) {
          at::Tensor t = at::full({7}, rank + step * 1.0);
          expect.Done(comm->AllReduce(t, ReduceOp::kMax), "AllReduce");
          expect.Equal(t, at::full({7}, world - 1.0 + step), absl::StrCat("AllReduce ", step));
        }
        at::Tensor in = at::arange(world * 5, at::kFloat);
        at::Tensor out = at::zeros({5});
        expect.Done(comm->ReduceScatter(in, out, ReduceOp::kSum), "ReduceScatter");
        expect.Equal(out, at::arange(rank * 5, rank * 5 + 5, at::kFloat) * world, "ReduceScatter");
        expect.Done(comm->Scatter(rank == 0 ? in : at::Tensor(), out, 0), "Scatter");
        expect.Equal(out, at::arange(rank * 5, rank * 5 + 5, at::kFloat), "Scatter");
        expect.Done(comm->Broadcast(out, world - 1), "Broadcast");
        expect.Equal(out, at::arange((world - 1) * 5, world * 5, at::kFloat), "Broadcast");
        at::Tensor full = at::zeros({world * 5});
        expect.Done(comm->AllGather(out, full), "AllGather");
        expect.Equal(full, at::arange((world - 1) * 5, world * 5, at::kFloat).repeat({world}),
                     "AllGather");
        return expect.status();
      });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_LE(shared->longest.load(), 8);
  EXPECT_EQ(shared->getNumKeys(), world);  // "store_comm/created/rank<r>"
  auto store = c10::make_intrusive<c10d::HashStore>();
  absl::StatusOr<std::unique_ptr<StoreCommunicator>> refused =
      StoreCommunicator::Create(store, 0, 1, kTimeout, /*max_value_bytes=*/0);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("max_value_bytes is 0"));
}

// Real sockets: every rank its own TCPStore client of one server on 127.0.0.1.
TEST(StoreCommunicatorTest, CollectivesOverTcpStore) {
  constexpr int kWorld = 3;
  c10d::TCPStoreOptions options;
  options.port = 0;
  options.isServer = true;
  options.waitWorkers = false;
  options.timeout = kTimeout;
  auto server = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
  const int64_t keys_before = server->getNumKeys();
  absl::Status s = multi_rank::RunRanksAsThreads(kWorld, [&](int rank, StorePtr) -> absl::Status {
    c10d::TCPStoreOptions client;
    client.port = server->getPort();
    client.timeout = kTimeout;
    StorePtr store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", client);
    CT_ASSIGN_OR_RETURN(auto comm,
                        Join(c10::make_intrusive<c10d::PrefixStore>("job", store), rank, kWorld));
    Expectations expect(rank);
    for (int step = 0; step < 20; ++step) {
      at::Tensor t = Fill(1001, at::kBFloat16, [&](int64_t i) { return rank + 1 + i % 3; });
      expect.Done(comm->AllReduce(t, ReduceOp::kSum), "AllReduce");
      expect.Equal(t,
                   Fill(1001, at::kBFloat16,
                        [&](int64_t i) { return Reduced(ReduceOp::kSum, kWorld, i, 3); }),
                   absl::StrCat("AllReduce ", step));
    }
    at::Tensor full = at::zeros({kWorld * 4}, at::kLong);
    expect.Done(comm->AllGather(at::full({4}, rank, at::kLong), full), "AllGather");
    expect.Equal(full, at::arange(kWorld, at::kLong).repeat_interleave(4), "AllGather");
    at::Tensor mine = at::zeros({2});
    expect.Done(comm->ReduceScatter(at::arange(kWorld * 2, at::kFloat), mine, ReduceOp::kSum),
                "ReduceScatter");
    expect.Equal(mine, at::arange(rank * 2, rank * 2 + 2, at::kFloat) * kWorld, "ReduceScatter");
    // The server lives in this thread's caller; everyone leaves after the same barrier.
    expect.Ok(comm->Barrier(), "Barrier");
    return expect.status();
  });
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(server->getNumKeys(), keys_before + kWorld);
}

// A store that stops answering once closed, like a TCPStore whose host process exited.
class ClosableStore : public c10d::PrefixStore {
 public:
  explicit ClosableStore(StorePtr store) : c10d::PrefixStore("closable", std::move(store)) {}

  void Close() { closed_ = true; }

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    ThrowIfClosed();
    c10d::PrefixStore::set(key, value);
  }
  std::vector<uint8_t> get(const std::string& key) override {
    ThrowIfClosed();
    return c10d::PrefixStore::get(key);
  }
  int64_t add(const std::string& key, int64_t value) override {
    ThrowIfClosed();
    return c10d::PrefixStore::add(key, value);
  }
  bool deleteKey(const std::string& key) override {
    ThrowIfClosed();
    return c10d::PrefixStore::deleteKey(key);
  }
  bool check(const std::vector<std::string>& keys) override {
    ThrowIfClosed();
    return c10d::PrefixStore::check(keys);
  }
  void wait(const std::vector<std::string>& keys) override {
    ThrowIfClosed();
    c10d::PrefixStore::wait(keys);
  }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    ThrowIfClosed();
    c10d::PrefixStore::wait(keys, timeout);
  }

 private:
  void ThrowIfClosed() const {
    if (closed_) throw std::runtime_error("Connection reset by peer (the store was closed)");
  }

  std::atomic<bool> closed_{false};
};

// Rank 0 closes the store as soon as its collective returns, as the process hosting a TCPStore
// may exit after its last collective: the others must not need the store for it any more.
TEST(StoreCommunicatorTest, PeersNeedNoStoreOnceRankZeroReturns) {
  constexpr int kWorld = 4;
  const std::vector<std::pair<
      std::string, std::function<absl::StatusOr<std::unique_ptr<Work>>(int rank, Communicator&)>>>
      collectives = {
          {"all-reduce",
           [](int rank, Communicator& comm) {
             at::Tensor t = at::full({1001}, rank + 1.0);
             return comm.AllReduce(t, ReduceOp::kSum);
           }},
          {"broadcast",
           [](int rank, Communicator& comm) {
             at::Tensor t = at::full({7}, rank + 1.0);
             return comm.Broadcast(t, kWorld - 1);
           }},
          {"scatter",
           [](int rank, Communicator& comm) {
             at::Tensor in = at::ones({kWorld * 7});
             at::Tensor out = at::zeros({7});
             return comm.Scatter(rank == 2 ? in : at::Tensor(), out, 2);
           }},
          {"reduce-scatter",
           [](int rank, Communicator& comm) {
             at::Tensor out = at::zeros({7});
             return comm.ReduceScatter(at::ones({kWorld * 7}), out, ReduceOp::kAvg);
           }},
      };
  for (const auto& [name, collective] : collectives) {
    for (int trial = 0; trial < 10; ++trial) {
      auto store = c10::make_intrusive<ClosableStore>(c10::make_intrusive<c10d::HashStore>());
      absl::Status s =
          multi_rank::RunRanksAsThreads(kWorld, [&](int rank, StorePtr) -> absl::Status {
            CT_ASSIGN_OR_RETURN(auto comm, Join(store, rank, kWorld));
            CT_ASSIGN_OR_RETURN(auto work, collective(rank, *comm));
            CT_RETURN_IF_ERROR(work->Wait());
            if (rank == 0) store->Close();
            return absl::OkStatus();
          });
      EXPECT_TRUE(s.ok()) << name << " trial " << trial << ": " << s;
    }
  }
}

// Two communicators on one store, created one after the other and then used alternately: their
// keys never mix.
TEST(StoreCommunicatorTest, CommunicatorsSharingAStoreKeepTheirKeysApart) {
  absl::Status s = multi_rank::RunRanksAsThreads(3, [&](int rank, StorePtr store) -> absl::Status {
    CT_ASSIGN_OR_RETURN(auto first, Join(store, rank, 3));
    CT_ASSIGN_OR_RETURN(auto second, Join(store, rank, 3));
    Expectations expect(rank);
    for (int step = 0; step < 5; ++step) {
      at::Tensor a = at::full({3}, rank + 1.0);
      at::Tensor b = at::full({3}, 10.0 * (rank + 1));
      expect.Done(first->AllReduce(a, ReduceOp::kSum), "first AllReduce");
      expect.Done(second->AllReduce(b, ReduceOp::kSum), "second AllReduce");
      expect.Equal(a, at::full({3}, 6.0), "first AllReduce");
      expect.Equal(b, at::full({3}, 60.0), "second AllReduce");
    }
    return expect.status();
  });
  EXPECT_TRUE(s.ok()) << s;
}

// Rank 2 never issues the all-reduce: ranks 0 and 1 fail within the timeout, naming it, and
// their communicators refuse what follows.
TEST(StoreCommunicatorTest, MissingRankIsATimeoutNamingIt) {
  constexpr std::chrono::milliseconds kShort(1500);
  absl::Status s = multi_rank::RunRanksAsThreads(3, [&](int rank, StorePtr store) -> absl::Status {
    CT_ASSIGN_OR_RETURN(auto comm, StoreCommunicator::Create(store, rank, 3, kShort));
    if (rank == 2) {
      store->wait({"done/0", "done/1"}, kTimeout);
      return absl::OkStatus();
    }
    at::Tensor t = at::ones({8});
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<std::unique_ptr<Work>> work = comm->AllReduce(t, ReduceOp::kSum);
    const auto elapsed = std::chrono::steady_clock::now() - start;
    EXPECT_TRUE(work.ok()) << work.status();
    if (!work.ok()) return absl::OkStatus();
    const absl::Status status = (*work)->Wait();
    EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
    EXPECT_THAT(std::string(status.message()),
                HasSubstr(absl::StrCat("rank ", rank,
                                       " of 3: store all-reduce #1 did not "
                                       "complete within 1.5 s: rank(s) 2 never contributed")));
    EXPECT_GE(elapsed, kShort);
    EXPECT_LT(elapsed, kShort + std::chrono::seconds(5));
    absl::StatusOr<std::unique_ptr<Work>> next = comm->Broadcast(t, 0);
    EXPECT_TRUE(next.ok()) << next.status();
    if (next.ok()) {
      const absl::Status refused = (*next)->Wait();
      EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
      EXPECT_THAT(std::string(refused.message()), HasSubstr("create a new communicator"));
    }
    store->set(absl::StrCat("done/", rank), std::vector<uint8_t>{1});
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

// Rank 0 broadcasts while rank 1 all-reduces under the same number: rank 1 reads rank 0's
// broadcast value and says the ranks disagree, rather than reducing it; rank 0 waits in vain
// for rank 1 to finish the broadcast.
TEST(StoreCommunicatorTest, DifferentCollectivesUnderOneNumberAreAnError) {
  absl::Status s = multi_rank::RunRanksAsThreads(2, [&](int rank, StorePtr store) -> absl::Status {
    CT_ASSIGN_OR_RETURN(auto comm,
                        StoreCommunicator::Create(store, rank, 2, std::chrono::seconds(1)));
    at::Tensor t = at::ones({4});
    CT_ASSIGN_OR_RETURN(auto work,
                        rank == 0 ? comm->Broadcast(t, 0) : comm->AllReduce(t, ReduceOp::kSum));
    const absl::Status status = work->Wait();
    if (rank == 0) {
      EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
      EXPECT_THAT(std::string(status.message()),
                  HasSubstr("rank 0 of 2: store broadcast #1 did not complete within 1 s: rank(s) "
                            "1 never finished it"));
    } else {
      EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
      EXPECT_THAT(std::string(status.message()),
                  HasSubstr("rank 0's value under this number is from a store broadcast"));
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(StoreCommunicatorTest, DifferentSizesOnTheRanksAreAnError) {
  absl::Status s = multi_rank::RunRanksAsThreads(2, [&](int rank, StorePtr store) -> absl::Status {
    CT_ASSIGN_OR_RETURN(auto comm, Join(store, rank, 2));
    at::Tensor t = at::ones({4 + rank});
    CT_ASSIGN_OR_RETURN(auto work, comm->AllReduce(t, ReduceOp::kSum));
    const absl::Status status = work->Wait();
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    EXPECT_THAT(std::string(status.message()),
                HasSubstr(absl::StrCat("rank ", 1 - rank, " sent ", 16 + 4 * (1 - rank),
                                       " bytes but this rank expects ", 16 + 4 * rank)));
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace cpptrain
