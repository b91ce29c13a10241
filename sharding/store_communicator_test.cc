#include "sharding/store_communicator.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <sstream>
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
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "sharding/testing/multi_rank.h"

namespace cpptrain {
namespace {

using ::testing::HasSubstr;
using StorePtr = c10::intrusive_ptr<c10d::Store>;

constexpr std::chrono::seconds kTimeout(60);

const std::vector<at::ScalarType> kDtypes = {at::kFloat, at::kDouble, at::kBFloat16, at::kLong};
// Element counts that divide by no world size.
const std::vector<int64_t> kSizes = {7, 1001};

absl::StatusOr<std::unique_ptr<StoreCommunicator>> Join(const StorePtr& store, int rank,
                                                        int world) {
  return StoreCommunicator::Create(store, rank, world, kTimeout);
}

// A 1-D tensor of `n` elements with element i = f(i), in `dtype`; the values used below are
// small integers and halves, exact in every dtype, so results are compared exactly.
at::Tensor Fill(int64_t n, at::ScalarType dtype, const std::function<double(int64_t)>& f) {
  std::vector<double> values(n);
  for (int64_t i = 0; i < n; ++i) values[i] = f(i);
  return at::tensor(values, at::kDouble).to(dtype);
}

std::vector<ReduceOp> OpsFor(at::ScalarType dtype) {
  if (at::isFloatingType(dtype)) return {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax};
  return {ReduceOp::kSum, ReduceOp::kMax};
}

// Rank q holds q + 1 + i % m at position i; over `world` ranks that reduces to:
double Expected(ReduceOp op, int world, int64_t i, int m) {
  const double base = static_cast<double>(i % m);
  switch (op) {
    case ReduceOp::kSum:
      return world * (world + 1) / 2.0 + world * base;
    case ReduceOp::kAvg:
      return (world + 1) / 2.0 + base;
    case ReduceOp::kMax:
      return world + base;
  }
  return -1;
}

std::string Label(absl::string_view op, at::ScalarType dtype, ReduceOp reduce, int64_t n) {
  return absl::StrCat(op, " ", c10::toString(dtype), " ", ReduceOpName(reduce), " n=", n);
}

// Records wrong values and failed statuses instead of returning at the first one, so a rank
// keeps issuing the collectives its peers wait for.
class Expectations {
 public:
  explicit Expectations(int rank) : rank_(rank) {}

  void Equal(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
    if (got.scalar_type() == want.scalar_type() && got.numel() == want.numel() &&
        at::equal(got.reshape({-1}), want.reshape({-1}))) {
      return;
    }
    std::ostringstream out;
    out << what << " on rank " << rank_ << ": got " << got.reshape({-1}).to(at::kDouble) << " want "
        << want.reshape({-1}).to(at::kDouble);
    failures_.push_back(out.str());
  }

  void Ok(const absl::Status& status, const std::string& what) {
    if (!status.ok()) failures_.push_back(absl::StrCat(what, ": ", status.ToString()));
  }

  // Waits for `work` (which must exist) and records its failure.
  void Done(absl::StatusOr<std::unique_ptr<Work>> work, const std::string& what) {
    if (!work.ok()) return Ok(work.status(), what);
    Ok((*work)->Wait(), what);
  }

  absl::Status status() const {
    if (failures_.empty()) return absl::OkStatus();
    return absl::InternalError(absl::StrJoin(failures_, "\n"));
  }

 private:
  int rank_;
  std::vector<std::string> failures_;
};

class StoreCollectiveTest : public ::testing::TestWithParam<int> {
 protected:
  // Runs `body` on GetParam() ranks as threads, each with its own communicator.
  void RunRanks(const std::function<void(int rank, int world, Communicator& comm,
                                         Expectations& expect)>& body) {
    const int world = GetParam();
    absl::Status s =
        multi_rank::RunRanksAsThreads(world, [&](int rank, StorePtr store) -> absl::Status {
          CT_ASSIGN_OR_RETURN(auto comm, Join(store, rank, world));
          Expectations expect(rank);
          body(rank, world, *comm, expect);
          return expect.status();
        });
    EXPECT_TRUE(s.ok()) << s;
  }
};

INSTANTIATE_TEST_SUITE_P(WorldSizes, StoreCollectiveTest, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return absl::StrCat("world", info.param); });

TEST_P(StoreCollectiveTest, AllReduce) {
  RunRanks([](int rank, int world, Communicator& comm, Expectations& expect) {
    for (at::ScalarType dtype : kDtypes) {
      for (int64_t n : kSizes) {
        for (ReduceOp op : OpsFor(dtype)) {
          at::Tensor t = Fill(n, dtype, [&](int64_t i) { return rank + 1 + i % 3; });
          const std::string label = Label("AllReduce", dtype, op, n);
          expect.Done(comm.AllReduce(t, op), label);
          expect.Equal(t, Fill(n, dtype, [&](int64_t i) { return Expected(op, world, i, 3); }),
                       label);
        }
      }
    }
    // In place on a 2-D tensor.
    at::Tensor matrix = at::full({3, 5}, rank + 1.0);
    expect.Done(comm.AllReduce(matrix, ReduceOp::kSum), "AllReduce 2-D");
    expect.Equal(matrix, at::full({3, 5}, world * (world + 1) / 2.0), "AllReduce 2-D");
  });
}

TEST_P(StoreCollectiveTest, AllReduceOfNonContiguousViewWritesOnlyTheView) {
  RunRanks([](int rank, int world, Communicator& comm, Expectations& expect) {
    at::Tensor base = at::full({4, 6}, -1.0);
    at::Tensor column = base.select(1, 2);  // Stride 6.
    column.copy_(Fill(4, at::kFloat, [&](int64_t i) { return rank + 1 + i % 3; }));
    expect.Done(comm.AllReduce(column, ReduceOp::kSum), "AllReduce of a column");
    at::Tensor want = at::full({4, 6}, -1.0);
    want.select(1, 2).copy_(
        Fill(4, at::kFloat, [&](int64_t i) { return Expected(ReduceOp::kSum, world, i, 3); }));
    expect.Equal(base, want, "AllReduce of a column");
  });
}

// Reducing in bfloat16 would lose the small contributions next to 256 (bf16 steps by 2 there);
// in float32 they add up before the one rounding back to bfloat16.
TEST_P(StoreCollectiveTest, BFloat16IsReducedInFloat32) {
  RunRanks([](int rank, int world, Communicator& comm, Expectations& expect) {
    at::Tensor t = at::full({5}, rank == 0 ? 256.0 : 1.0, at::kBFloat16);
    expect.Done(comm.AllReduce(t, ReduceOp::kSum), "AllReduce bf16");
    expect.Equal(t, at::full({5}, 256.0f + (world - 1), at::kFloat).to(at::kBFloat16),
                 "AllReduce bf16");
  });
}

TEST_P(StoreCollectiveTest, AllGather) {
  RunRanks([](int rank, int world, Communicator& comm, Expectations& expect) {
    const auto value = [](int r, int64_t i) { return r * 10.0 + i % 10; };
    for (at::ScalarType dtype : kDtypes) {
      for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1001}}) {
        const std::string label = absl::StrCat("AllGather ", c10::toString(dtype), " n=", n);
        at::Tensor input = Fill(n, dtype, [&](int64_t i) { return value(rank, i); });
        at::Tensor output = at::full({world * n}, -1.0, at::TensorOptions().dtype(dtype));
        expect.Done(comm.AllGather(input, output), label);
        expect.Equal(output,
                     Fill(world * n, dtype,
                          [&](int64_t j) { return value(static_cast<int>(j / n), j % n); }),
                     label);
      }
    }
    // In place: the input is this rank's row of a [world, 5] output.
    at::Tensor output = at::zeros({world, 5});
    output[rank].copy_(Fill(5, at::kFloat, [&](int64_t i) { return value(rank, i); }));
    at::Tensor mine = output[rank];
    expect.Done(comm.AllGather(mine, output), "AllGather in place");
    expect.Equal(output,
                 Fill(world * 5, at::kFloat,
                      [&](int64_t j) { return value(static_cast<int>(j / 5), j % 5); }),
                 "AllGather in place");
    // A strided input.
    at::Tensor strided = Fill(10, at::kLong, [&](int64_t i) { return value(rank, i); });
    at::Tensor gathered = at::zeros({world * 5}, at::kLong);
    expect.Done(comm.AllGather(strided.slice(0, 0, 10, 2), gathered), "AllGather strided");
    expect.Equal(gathered,
                 Fill(world * 5, at::kLong,
                      [&](int64_t j) { return value(static_cast<int>(j / 5), 2 * (j % 5)); }),
                 "AllGather strided");
  });
}

TEST_P(StoreCollectiveTest, ReduceScatter) {
  RunRanks([](int rank, int world, Communicator& comm, Expectations& expect) {
    for (at::ScalarType dtype : kDtypes) {
      for (int64_t n : kSizes) {
        for (ReduceOp op : OpsFor(dtype)) {
          const std::string label = Label("ReduceScatter", dtype, op, n);
          // Row r of the [world, n] input is what rank r receives the reduction of.
          at::Tensor input =
              Fill(world * n, dtype, [&](int64_t j) { return rank + 1 + j % 7; }).view({world, n});
          at::Tensor output = at::full({n}, -1.0, at::TensorOptions().dtype(dtype));
          expect.Done(comm.ReduceScatter(input, output, op), label);
          expect.Equal(
              output,
              Fill(n, dtype, [&](int64_t i) { return Expected(op, world, rank * n + i, 7); }),
              label);
        }
      }
    }
  });
}

TEST_P(StoreCollectiveTest, BroadcastFromFirstAndLastRank) {
  RunRanks([](int rank, int world, Communicator& comm, Expectations& expect) {
    const auto value = [](int r, int64_t i) { return r * 7.0 + i % 5; };
    for (int root : {0, world - 1}) {
      for (at::ScalarType dtype : kDtypes) {
        for (int64_t n : kSizes) {
          const std::string label =
              absl::StrCat("Broadcast ", c10::toString(dtype), " n=", n, " root ", root);
          at::Tensor t = Fill(n, dtype, [&](int64_t i) { return value(rank, i); });
          expect.Done(comm.Broadcast(t, root), label);
          expect.Equal(t, Fill(n, dtype, [&](int64_t i) { return value(root, i); }), label);
        }
      }
    }
    // Into a transposed (non-contiguous) view.
    at::Tensor matrix = Fill(6, at::kFloat, [&](int64_t i) { return value(rank, i); }).view({2, 3});
    at::Tensor transposed = matrix.t();
    expect.Done(comm.Broadcast(transposed, 0), "Broadcast transposed");
    expect.Equal(matrix, Fill(6, at::kFloat, [&](int64_t i) { return value(0, i); }),
                 "Broadcast transposed");
  });
}

TEST_P(StoreCollectiveTest, ScatterFromFirstAndLastRank) {
  RunRanks([](int rank, int world, Communicator& comm, Expectations& expect) {
    for (int root : {0, world - 1}) {
      for (at::ScalarType dtype : kDtypes) {
        for (int64_t n : kSizes) {
          const std::string label =
              absl::StrCat("Scatter ", c10::toString(dtype), " n=", n, " root ", root);
          // Only the root has an input: part r is r * 100 + i % 50.
          at::Tensor input;
          if (rank == root) {
            input = Fill(world * n, dtype, [&](int64_t j) { return (j / n) * 100 + (j % n) % 50; });
          }
          at::Tensor output = at::full({n}, -1.0, at::TensorOptions().dtype(dtype));
          expect.Done(comm.Scatter(input, output, root), label);
          expect.Equal(output, Fill(n, dtype, [&](int64_t i) { return rank * 100 + i % 50; }),
                       label);
        }
      }
    }
  });
}

TEST_P(StoreCollectiveTest, CoalescedFormsWithMixedDtypes) {
  RunRanks([](int rank, int world, Communicator& comm, Expectations& expect) {
    const std::vector<std::pair<at::ScalarType, int64_t>> specs = {
        {at::kFloat, 7},  {at::kBFloat16, 1001}, {at::kLong, 3}, {at::kHalf, 2},
        {at::kDouble, 5}, {at::kInt, 1},         {at::kFloat, 0}};
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
      std::vector<at::Tensor> tensors;
      for (const auto& [dtype, n] : specs) {
        if (op == ReduceOp::kAvg && !at::isFloatingType(dtype)) continue;
        tensors.push_back(Fill(n, dtype, [&](int64_t i) { return rank + 1 + i % 3; }));
      }
      expect.Done(comm.AllReduceCoalesced(tensors, op),
                  absl::StrCat("AllReduceCoalesced ", ReduceOpName(op)));
      for (const at::Tensor& t : tensors) {
        expect.Equal(
            t,
            Fill(t.numel(), t.scalar_type(), [&](int64_t i) { return Expected(op, world, i, 3); }),
            Label("AllReduceCoalesced", t.scalar_type(), op, t.numel()));
      }
    }

    std::vector<at::Tensor> inputs, outputs;
    for (const auto& [dtype, n] : specs) {
      inputs.push_back(Fill(n, dtype, [&](int64_t i) { return rank * 10 + i % 10; }));
      outputs.push_back(at::full({world * n}, -1.0, at::TensorOptions().dtype(dtype)));
    }
    expect.Done(comm.AllGatherCoalesced(inputs, outputs), "AllGatherCoalesced");
    for (size_t k = 0; k < specs.size(); ++k) {
      const int64_t n = specs[k].second;
      expect.Equal(
          outputs[k],
          Fill(world * n, specs[k].first, [&](int64_t j) { return (j / n) * 10 + (j % n) % 10; }),
          absl::StrCat("AllGatherCoalesced ", c10::toString(specs[k].first), " n=", n));
    }

    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
      std::vector<at::Tensor> ins, outs;
      for (const auto& [dtype, n] : specs) {
        if (op == ReduceOp::kAvg && !at::isFloatingType(dtype)) continue;
        ins.push_back(Fill(world * n, dtype, [&](int64_t j) { return rank + 1 + j % 7; }));
        outs.push_back(at::full({n}, -1.0, at::TensorOptions().dtype(dtype)));
      }
      expect.Done(comm.ReduceScatterCoalesced(ins, outs, op),
                  absl::StrCat("ReduceScatterCoalesced ", ReduceOpName(op)));
      for (const at::Tensor& out : outs) {
        const int64_t n = out.numel();
        expect.Equal(out,
                     Fill(n, out.scalar_type(),
                          [&](int64_t i) { return Expected(op, world, rank * n + i, 7); }),
                     Label("ReduceScatterCoalesced", out.scalar_type(), op, n));
      }
    }

    std::vector<at::Tensor> none;
    expect.Done(comm.AllReduceCoalesced(none, ReduceOp::kSum), "AllReduceCoalesced of nothing");
  });
}

TEST_P(StoreCollectiveTest, BarrierWaitsForEveryRank) {
  const int world = GetParam();
  absl::Status s =
      multi_rank::RunRanksAsThreads(world, [&](int rank, StorePtr store) -> absl::Status {
        CT_ASSIGN_OR_RETURN(auto comm, Join(store, rank, world));
        for (int round = 0; round < 3; ++round) {
          store->set(absl::StrCat("arrived/", round, "/", rank), std::vector<uint8_t>{1});
          CT_RETURN_IF_ERROR(comm->Barrier());
          for (int r = 0; r < world; ++r) {
            // check() does not wait: without the barrier a fast rank would find a key missing.
            if (!store->check({absl::StrCat("arrived/", round, "/", r)})) {
              return absl::InternalError(absl::StrCat("rank ", rank, " passed barrier ", round,
                                                      " before rank ", r, " arrived"));
            }
          }
        }
        return absl::OkStatus();
      });
  EXPECT_TRUE(s.ok()) << s;
}

// The store holds only what collectives in flight need: each time one of 200 all-reduces
// returns on rank 0, its keys are gone and at most the other ranks' contributions to the next
// one are there; afterwards only each rank's creation counter is left.
TEST_P(StoreCollectiveTest, ManyCollectivesLeaveNoKeysBehind) {
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

TEST_P(StoreCollectiveTest, FinishedWorkCanBeWaitedInAnyOrderAndTwice) {
  RunRanks([](int rank, int world, Communicator& comm, Expectations& expect) {
    std::vector<at::Tensor> tensors;
    std::vector<std::unique_ptr<Work>> works;
    for (int k = 0; k < 4; ++k) {
      tensors.push_back(at::full({10 + k}, (rank + 1.0) * (k + 1)));
      absl::StatusOr<std::unique_ptr<Work>> work = comm.AllReduce(tensors.back(), ReduceOp::kAvg);
      expect.Ok(work.status(), "AllReduce");
      if (work.ok()) works.push_back(*std::move(work));
    }
    for (int k = static_cast<int>(works.size()) - 1; k >= 0; --k) {
      expect.Ok(works[k]->Wait(), "Wait");
      expect.Ok(works[k]->Synchronize(), "Synchronize after Wait");
      expect.Equal(tensors[k], at::full({10 + k}, (world + 1) / 2.0 * (k + 1)),
                   absl::StrCat("AllReduce ", k));
    }
  });
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
                        [&](int64_t i) { return Expected(ReduceOp::kSum, kWorld, i, 3); }),
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

TEST(StoreCommunicatorTest, CreateTimesOutNamingTheRanksThatNeverJoined) {
  StorePtr store = c10::make_intrusive<c10d::HashStore>();
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::unique_ptr<StoreCommunicator>> comm =
      StoreCommunicator::Create(store, 1, 3, std::chrono::milliseconds(500));
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(comm.status().message()),
              HasSubstr("rank 1 of 3: store join #0 did not complete within 0.5 s: rank(s) 0, 2 "
                        "never joined"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
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

// Each invalid call is made on rank 0 only. Had any of them communicated, the final all-reduce
// would pair with it and fail or time out.
TEST(StoreCommunicatorTest, InvalidArgumentsFailBeforeAnyCommunication) {
  absl::Status s = multi_rank::RunRanksAsThreads(2, [&](int rank, StorePtr store) -> absl::Status {
    CT_ASSIGN_OR_RETURN(auto comm,
                        StoreCommunicator::Create(store, rank, 2, std::chrono::seconds(5)));
    if (rank == 0) {
      const auto expect_invalid = [](const absl::StatusOr<std::unique_ptr<Work>>& result,
                                     const std::vector<std::string>& parts) {
        EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << result.status();
        for (const std::string& part : parts) {
          EXPECT_THAT(std::string(result.status().message()), HasSubstr(part));
        }
      };
      at::Tensor input = at::ones({5});
      at::Tensor short_output = at::zeros({9});
      expect_invalid(comm->AllGather(input, short_output),
                     {"all-gather (rank 0 of 2)", "has 9 elements; expected 10"});
      at::Tensor int_output = at::zeros({10}, at::kInt);
      expect_invalid(comm->AllGather(input, int_output), {"dtype Float", "dtype Int"});
      at::Tensor long_input = at::ones({11});
      at::Tensor output = at::zeros({5});
      expect_invalid(comm->ReduceScatter(long_input, output, ReduceOp::kSum),
                     {"reduce-scatter", "has 11 elements; expected 10"});
      at::Tensor ints = at::ones({4}, at::kLong);
      expect_invalid(comm->AllReduce(ints, ReduceOp::kAvg), {"avg", "Long"});
      at::Tensor flags = at::ones({4}, at::kBool);
      expect_invalid(comm->AllReduce(flags, ReduceOp::kMax), {"dtype Bool", "reductions take"});
      at::Tensor undefined;
      expect_invalid(comm->Broadcast(undefined, 0), {"undefined"});
      at::Tensor meta = at::empty({4}, at::TensorOptions().device(at::kMeta));
      expect_invalid(comm->AllReduce(meta, ReduceOp::kSum), {"device meta", "CPU tensors only"});
      at::Tensor cpu = at::ones({4});
      expect_invalid(comm->Broadcast(cpu, 2), {"root 2 is outside [0, 2)"});
      expect_invalid(comm->Scatter(at::ones({7}), cpu, 0), {"scatter", "expected 8"});
      std::vector<at::Tensor> two{at::ones({2}), at::ones({2})};
      std::vector<at::Tensor> one{at::zeros({4})};
      expect_invalid(comm->AllGatherCoalesced(two, one), {"2 inputs but 1 outputs"});
      std::vector<at::Tensor> mixed{at::ones({2}), at::ones({2}, at::kLong)};
      expect_invalid(comm->AllReduceCoalesced(mixed, ReduceOp::kAvg), {"tensors[1]", "avg"});
    }
    at::Tensor t = at::full({3}, rank + 1.0);
    CT_ASSIGN_OR_RETURN(auto work, comm->AllReduce(t, ReduceOp::kSum));
    CT_RETURN_IF_ERROR(work->Wait());
    EXPECT_TRUE(at::equal(t, at::full({3}, 3.0))) << t;
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(StoreCommunicatorTest, ReportsRankSizeBackendAndDevice) {
  absl::Status s = multi_rank::RunRanksAsThreads(3, [&](int rank, StorePtr store) -> absl::Status {
    CT_ASSIGN_OR_RETURN(auto comm, Join(store, rank, 3));
    EXPECT_EQ(comm->rank(), rank);
    EXPECT_EQ(comm->size(), 3);
    EXPECT_EQ(comm->backend(), "store");
    EXPECT_TRUE(comm->device().has_value());
    EXPECT_EQ(comm->device().value_or(c10::Device(c10::kMeta)), c10::Device(c10::kCPU));
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(StoreCommunicatorTest, CreateRejectsBadArguments) {
  StorePtr store = c10::make_intrusive<c10d::HashStore>();
  const auto message = [](const absl::StatusOr<std::unique_ptr<StoreCommunicator>>& comm) {
    return std::string(comm.status().message());
  };
  EXPECT_THAT(message(StoreCommunicator::Create(store, 2, 2, kTimeout)),
              HasSubstr("got rank 2, size 2"));
  EXPECT_THAT(message(StoreCommunicator::Create(store, 0, 0, kTimeout)), HasSubstr("size 0"));
  EXPECT_THAT(message(StoreCommunicator::Create(StorePtr(), 0, 1, kTimeout)),
              HasSubstr("store is null"));
  EXPECT_THAT(message(StoreCommunicator::Create(store, 0, 1, std::chrono::milliseconds(0))),
              HasSubstr("timeout must be positive"));
}

}  // namespace
}  // namespace cpptrain
