#include "sharding/gloo_communicator.h"

#include <chrono>
#include <cstdlib>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "sharding/testing/multi_rank.h"

namespace cpptrain {
namespace {

using ::testing::HasSubstr;
using StorePtr = c10::intrusive_ptr<c10d::Store>;

constexpr std::chrono::seconds kTimeout(60);

// Every dtype the communicator supports; the values used below are small integers and halves,
// exact in all of them, so results are compared exactly.
const std::vector<at::ScalarType> kDtypes = {at::kFloat, at::kBFloat16, at::kHalf,
                                             at::kLong,  at::kDouble,   at::kInt};

absl::StatusOr<std::unique_ptr<GlooCommunicator>> Join(const StorePtr& store, int rank, int world) {
  return GlooCommunicator::Create(c10::make_intrusive<c10d::PrefixStore>("comm", store), rank,
                                  world, kTimeout);
}

// A 1-D tensor of `n` elements with element i = f(i), in `dtype`.
at::Tensor Make(int64_t n, at::ScalarType dtype, const std::function<double(int64_t)>& f) {
  std::vector<double> values(n);
  for (int64_t i = 0; i < n; ++i) values[i] = f(i);
  return at::tensor(values, at::kDouble).to(dtype);
}

// Collects mismatches so that a rank keeps issuing the same collectives as its peers after a
// wrong value (returning early would leave the peers waiting for it).
class Checker {
 public:
  explicit Checker(int rank) : rank_(rank) {}

  void Equal(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
    if (got.scalar_type() != want.scalar_type() || got.numel() != want.numel() ||
        !at::equal(got.reshape(-1), want.reshape(-1))) {
      std::ostringstream out;
      out << what << " on rank " << rank_ << ": got " << got.reshape(-1).to(at::kDouble) << " want "
          << want.reshape(-1).to(at::kDouble);
      failures_.push_back(out.str());
    }
  }

  void Ok(const absl::Status& status, const std::string& what) {
    if (!status.ok()) failures_.push_back(absl::StrCat(what, ": ", status.ToString()));
  }

  absl::Status status() const {
    if (failures_.empty()) return absl::OkStatus();
    return absl::InternalError(absl::StrJoin(failures_, "\n"));
  }

 private:
  int rank_;
  std::vector<std::string> failures_;
};

std::string Label(const char* op, at::ScalarType dtype, ReduceOp reduce, int64_t n) {
  return absl::StrCat(op, " ", c10::toString(dtype), " ", ReduceOpName(reduce), " n=", n);
}

std::vector<ReduceOp> OpsFor(at::ScalarType dtype) {
  if (at::isFloatingType(dtype)) return {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax};
  return {ReduceOp::kSum, ReduceOp::kMax};
}

// Rank q contributes q + 1 + i % m at position i; the reduction over W ranks is then:
double Reduced(ReduceOp op, int world, int64_t i, int m) {
  const double base = i % m;
  switch (op) {
    case ReduceOp::kSum:
      return world * (world + 1) / 2.0 + world * base;
    case ReduceOp::kAvg:
      return (world + 1) / 2.0 + base;
    case ReduceOp::kMax:
      return world + base;
  }
  return 0;
}

class GlooCollectiveTest : public ::testing::TestWithParam<int> {};

INSTANTIATE_TEST_SUITE_P(WorldSizes, GlooCollectiveTest, ::testing::Values(2, 3, 4),
                         [](const auto& info) { return absl::StrCat("world", info.param); });

TEST_P(GlooCollectiveTest, AllReduce) {
  const int world = GetParam();
  absl::Status s =
      multi_rank::RunRanksAsThreads(world, [&](int rank, StorePtr store) -> absl::Status {
        CT_ASSIGN_OR_RETURN(auto comm, Join(store, rank, world));
        Checker check(rank);
        for (at::ScalarType dtype : kDtypes) {
          for (int64_t n : {int64_t{7}, int64_t{4099}}) {
            for (ReduceOp op : OpsFor(dtype)) {
              at::Tensor t = Make(n, dtype, [&](int64_t i) { return rank + 1 + i % 3; });
              CT_ASSIGN_OR_RETURN(auto work, comm->AllReduce(t, op));
              check.Ok(work->Wait(), Label("AllReduce", dtype, op, n));
              check.Equal(t, Make(n, dtype, [&](int64_t i) { return Reduced(op, world, i, 3); }),
                          Label("AllReduce", dtype, op, n));
            }
          }
        }
        // A 2-D tensor is reduced elementwise in place.
        at::Tensor matrix = at::full({3, 5}, rank + 1.0);
        CT_ASSIGN_OR_RETURN(auto work, comm->AllReduce(matrix, ReduceOp::kSum));
        check.Ok(work->Synchronize(), "AllReduce 2-D");
        check.Equal(matrix, at::full({3, 5}, world * (world + 1) / 2.0), "AllReduce 2-D");
        return check.status();
      });
  EXPECT_TRUE(s.ok()) << s;
}

TEST_P(GlooCollectiveTest, AllGatherIntoFlatOutput) {
  const int world = GetParam();
  absl::Status s =
      multi_rank::RunRanksAsThreads(world, [&](int rank, StorePtr store) -> absl::Status {
        CT_ASSIGN_OR_RETURN(auto comm, Join(store, rank, world));
        Checker check(rank);
        const auto value = [](int r, int64_t i) { return r * 10.0 + i % 10; };
        for (at::ScalarType dtype : kDtypes) {
          for (int64_t n : {int64_t{5}, int64_t{1}, int64_t{13}}) {
            const std::string label = absl::StrCat("AllGather ", c10::toString(dtype), " n=", n);
            at::Tensor input = Make(n, dtype, [&](int64_t i) { return value(rank, i); });
            at::Tensor output = at::full({world * n}, -1.0, at::TensorOptions().dtype(dtype));
            CT_ASSIGN_OR_RETURN(auto work, comm->AllGather(input, output));
            check.Ok(work->Wait(), label);
            check.Equal(output,
                        Make(world * n, dtype,
                             [&](int64_t j) { return value(static_cast<int>(j / n), j % n); }),
                        label);
          }
        }
        // In place: the input is this rank's slice of a [world, 5] output.
        at::Tensor output = at::zeros({world, 5});
        at::Tensor mine = output[rank];
        mine.copy_(Make(5, at::kFloat, [&](int64_t i) { return value(rank, i); }));
        CT_ASSIGN_OR_RETURN(auto work, comm->AllGather(mine, output));
        check.Ok(work->Wait(), "AllGather in place");
        check.Equal(output,
                    Make(world * 5, at::kFloat, [&](int64_t j) { return value(j / 5, j % 5); }),
                    "AllGather in place");
        return check.status();
      });
  EXPECT_TRUE(s.ok()) << s;
}

TEST_P(GlooCollectiveTest, ReduceScatterFromFlatInput) {
  const int world = GetParam();
  absl::Status s =
      multi_rank::RunRanksAsThreads(world, [&](int rank, StorePtr store) -> absl::Status {
        CT_ASSIGN_OR_RETURN(auto comm, Join(store, rank, world));
        Checker check(rank);
        for (at::ScalarType dtype : kDtypes) {
          for (int64_t n : {int64_t{5}, int64_t{1}, int64_t{11}}) {
            for (ReduceOp op : OpsFor(dtype)) {
              const std::string label = Label("ReduceScatter", dtype, op, n);
              // A [world, n] input: row r is what rank r receives the reduction of.
              at::Tensor input = Make(world * n, dtype, [&](int64_t j) {
                                   return rank + 1 + j % 7;
                                 }).view({world, n});
              at::Tensor output = at::full({n}, -1.0, at::TensorOptions().dtype(dtype));
              CT_ASSIGN_OR_RETURN(auto work, comm->ReduceScatter(input, output, op));
              check.Ok(work->Wait(), label);
              check.Equal(
                  output,
                  Make(n, dtype, [&](int64_t i) { return Reduced(op, world, rank * n + i, 7); }),
                  label);
            }
          }
        }
        return check.status();
      });
  EXPECT_TRUE(s.ok()) << s;
}

TEST_P(GlooCollectiveTest, BroadcastFromNonZeroRoots) {
  const int world = GetParam();
  absl::Status s =
      multi_rank::RunRanksAsThreads(world, [&](int rank, StorePtr store) -> absl::Status {
        CT_ASSIGN_OR_RETURN(auto comm, Join(store, rank, world));
        Checker check(rank);
        for (int root : {world - 1, 1}) {
          for (at::ScalarType dtype : kDtypes) {
            const auto value = [&](int r, int64_t i) { return r * 7.0 + i % 5; };
            at::Tensor t = Make(9, dtype, [&](int64_t i) { return value(rank, i); }).view({3, 3});
            CT_ASSIGN_OR_RETURN(auto work, comm->Broadcast(t, root));
            const std::string label =
                absl::StrCat("Broadcast ", c10::toString(dtype), " root ", root);
            check.Ok(work->Wait(), label);
            check.Equal(t, Make(9, dtype, [&](int64_t i) { return value(root, i); }), label);
          }
        }
        return check.status();
      });
  EXPECT_TRUE(s.ok()) << s;
}

TEST_P(GlooCollectiveTest, CoalescedFormsWithMixedDtypes) {
  const int world = GetParam();
  absl::Status s =
      multi_rank::RunRanksAsThreads(world, [&](int rank, StorePtr store) -> absl::Status {
        CT_ASSIGN_OR_RETURN(auto comm, Join(store, rank, world));
        Checker check(rank);
        const std::vector<std::pair<at::ScalarType, int64_t>> specs = {
            {at::kFloat, 7},  {at::kBFloat16, 3}, {at::kLong, 4}, {at::kHalf, 2},
            {at::kDouble, 5}, {at::kInt, 1},      {at::kFloat, 0}};

        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kAvg}) {
          std::vector<at::Tensor> tensors;
          for (const auto& [dtype, n] : specs) {
            if (op == ReduceOp::kAvg && !at::isFloatingType(dtype)) continue;
            tensors.push_back(Make(n, dtype, [&](int64_t i) { return rank + 1 + i % 3; }));
          }
          CT_ASSIGN_OR_RETURN(auto work, comm->AllReduceCoalesced(tensors, op));
          check.Ok(work->Wait(), absl::StrCat("AllReduceCoalesced ", ReduceOpName(op)));
          for (const at::Tensor& t : tensors) {
            check.Equal(t,
                        Make(t.numel(), t.scalar_type(),
                             [&](int64_t i) { return Reduced(op, world, i, 3); }),
                        Label("AllReduceCoalesced", t.scalar_type(), op, t.numel()));
          }
        }

        std::vector<at::Tensor> inputs, outputs;
        for (const auto& [dtype, n] : specs) {
          inputs.push_back(Make(n, dtype, [&](int64_t i) { return rank * 10 + i % 10; }));
          outputs.push_back(at::full({world * n}, -1.0, at::TensorOptions().dtype(dtype)));
        }
        CT_ASSIGN_OR_RETURN(auto gather, comm->AllGatherCoalesced(inputs, outputs));
        check.Ok(gather->Wait(), "AllGatherCoalesced");
        for (size_t k = 0; k < specs.size(); ++k) {
          const auto [dtype, n] = specs[k];
          check.Equal(
              outputs[k],
              Make(world * n, dtype, [&, n = n](int64_t j) { return (j / n) * 10 + (j % n) % 10; }),
              absl::StrCat("AllGatherCoalesced ", c10::toString(dtype), " n=", n));
        }

        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kAvg}) {
          std::vector<at::Tensor> ins, outs;
          for (const auto& [dtype, n] : specs) {
            if (op == ReduceOp::kAvg && !at::isFloatingType(dtype)) continue;
            ins.push_back(Make(world * n, dtype, [&](int64_t j) { return rank + 1 + j % 7; }));
            outs.push_back(at::full({n}, -1.0, at::TensorOptions().dtype(dtype)));
          }
          CT_ASSIGN_OR_RETURN(auto work, comm->ReduceScatterCoalesced(ins, outs, op));
          check.Ok(work->Wait(), absl::StrCat("ReduceScatterCoalesced ", ReduceOpName(op)));
          for (const at::Tensor& out : outs) {
            const int64_t n = out.numel();
            check.Equal(out,
                        Make(n, out.scalar_type(),
                             [&](int64_t i) { return Reduced(op, world, rank * n + i, 7); }),
                        Label("ReduceScatterCoalesced", out.scalar_type(), op, n));
          }
        }

        std::vector<at::Tensor> none;
        CT_ASSIGN_OR_RETURN(auto empty, comm->AllReduceCoalesced(none, ReduceOp::kSum));
        check.Ok(empty->Wait(), "AllReduceCoalesced of no tensors");
        return check.status();
      });
  EXPECT_TRUE(s.ok()) << s;
}

TEST_P(GlooCollectiveTest, BarrierWaitsForEveryRank) {
  const int world = GetParam();
  absl::Status s =
      multi_rank::RunRanksAsThreads(world, [&](int rank, StorePtr store) -> absl::Status {
        CT_ASSIGN_OR_RETURN(auto comm, Join(store, rank, world));
        store->set(absl::StrCat("arrived/", rank), {1});
        CT_RETURN_IF_ERROR(comm->Barrier());
        for (int r = 0; r < world; ++r) {
          // check() does not wait: without the barrier a fast rank would find a key missing.
          if (!store->check({absl::StrCat("arrived/", r)})) {
            return absl::InternalError(
                absl::StrCat("rank ", rank, " passed the barrier before rank ", r, " arrived"));
          }
        }
        return absl::OkStatus();
      });
  EXPECT_TRUE(s.ok()) << s;
}

TEST_P(GlooCollectiveTest, QueuedWorkCompletesInIssueOrderWithoutWaiting) {
  const int world = GetParam();
  absl::Status s =
      multi_rank::RunRanksAsThreads(world, [&](int rank, StorePtr store) -> absl::Status {
        CT_ASSIGN_OR_RETURN(auto comm, Join(store, rank, world));
        Checker check(rank);
        std::vector<at::Tensor> tensors;
        std::vector<std::unique_ptr<Work>> works;
        for (int k = 0; k < 6; ++k) {
          tensors.push_back(at::full({100 + k}, (rank + 1.0) * (k + 1)));
          CT_ASSIGN_OR_RETURN(auto work, comm->AllReduce(tensors.back(), ReduceOp::kAvg));
          works.push_back(std::move(work));
        }
        for (int k = 5; k >= 0; --k) {
          check.Ok(works[k]->Wait(), absl::StrCat("AllReduce ", k));
          check.Ok(works[k]->Wait(), absl::StrCat("second Wait of AllReduce ", k));
          check.Equal(tensors[k], at::full({100 + k}, (world + 1) / 2.0 * (k + 1)),
                      absl::StrCat("queued AllReduce ", k));
        }
        return check.status();
      });
  EXPECT_TRUE(s.ok()) << s;
}

// Each invalid call is made on rank 0 only. If any of them had issued a collective, the
// ranks' sequences would no longer match and the final all-reduce would hang or be wrong.
TEST(GlooCommunicatorTest, InvalidArgumentsFailBeforeAnyCommunication) {
  absl::Status s = multi_rank::RunRanksAsThreads(2, [&](int rank, StorePtr store) -> absl::Status {
    CT_ASSIGN_OR_RETURN(auto comm, Join(store, rank, 2));
    if (rank == 0) {
      const auto expect_invalid = [](const absl::StatusOr<std::unique_ptr<Work>>& result,
                                     std::vector<std::string> parts) {
        EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << result.status();
        for (const std::string& part : parts) {
          EXPECT_THAT(std::string(result.status().message()), HasSubstr(part));
        }
      };
      at::Tensor input = at::ones({5});
      at::Tensor short_output = at::zeros({9});
      expect_invalid(comm->AllGather(input, short_output),
                     {"AllGather", "rank 0 of 2", "has 9 elements; expected 10"});
      at::Tensor int_output = at::zeros({10}, at::kInt);
      expect_invalid(comm->AllGather(input, int_output), {"dtype Float", "dtype Int"});
      at::Tensor strided_output = at::zeros({10, 2}).select(1, 0);
      expect_invalid(comm->AllGather(input, strided_output), {"not contiguous"});
      at::Tensor long_input = at::ones({11});
      at::Tensor output = at::zeros({5});
      expect_invalid(comm->ReduceScatter(long_input, output, ReduceOp::kSum),
                     {"ReduceScatter", "has 11 elements; expected 10"});
      at::Tensor ints = at::ones({4}, at::kLong);
      expect_invalid(comm->AllReduce(ints, ReduceOp::kAvg), {"avg", "Long"});
      at::Tensor int_chunks = at::ones({8}, at::kLong);
      at::Tensor int_out = at::zeros({4}, at::kLong);
      expect_invalid(comm->ReduceScatter(int_chunks, int_out, ReduceOp::kAvg), {"avg"});
      at::Tensor flags = at::ones({4}, at::kBool);
      expect_invalid(comm->AllReduce(flags, ReduceOp::kMax), {"dtype Bool", "reductions take"});
      expect_invalid(comm->Broadcast(flags, 0), {"dtype Bool", "supported: Float"});
      at::Tensor undefined;
      expect_invalid(comm->Broadcast(undefined, 0), {"undefined"});
      at::Tensor meta = at::empty({4}, at::TensorOptions().device(at::kMeta));
      expect_invalid(comm->AllReduce(meta, ReduceOp::kSum), {"device meta", "CPU tensors only"});
      at::Tensor cpu = at::ones({4});
      expect_invalid(comm->Broadcast(cpu, 2), {"root 2 is outside [0, 2)"});
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

// Rank 1 never joins the all-reduce: rank 0's Wait must fail after the communicator's
// timeout with an error naming the collective, the rank and the world.
TEST(GlooCommunicatorTest, CollectiveTimeoutNamesCollectiveRankAndWorld) {
  absl::Status s = multi_rank::RunRanksAsThreads(2, [&](int rank, StorePtr store) -> absl::Status {
    CT_ASSIGN_OR_RETURN(auto comm,
                        GlooCommunicator::Create(c10::make_intrusive<c10d::PrefixStore>("c", store),
                                                 rank, 2, std::chrono::seconds(2)));
    if (rank == 1) {
      store->wait({"rank0_done"}, std::chrono::seconds(60));
      return absl::OkStatus();
    }
    at::Tensor t = at::ones({8});
    const auto start = std::chrono::steady_clock::now();
    CT_ASSIGN_OR_RETURN(auto work, comm->AllReduce(t, ReduceOp::kSum));
    const absl::Status status = work->Wait();
    const auto elapsed = std::chrono::steady_clock::now() - start;
    store->set("rank0_done", {1});
    EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr("Gloo AllReduce failed on rank 0 of 2"));
    EXPECT_GE(elapsed, std::chrono::milliseconds(1500));
    EXPECT_LT(elapsed, std::chrono::seconds(30));
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(GlooCommunicatorTest, SingleRankGroup) {
  StorePtr store = c10::make_intrusive<c10d::HashStore>();
  absl::StatusOr<std::unique_ptr<GlooCommunicator>> comm = Join(store, 0, 1);
  ASSERT_TRUE(comm.ok()) << comm.status();
  at::Tensor t = at::full({4}, 3.0, at::kBFloat16);
  at::Tensor gathered = at::zeros({4}, at::kBFloat16);
  at::Tensor scattered = at::zeros({4}, at::kBFloat16);
  std::vector<absl::StatusOr<std::unique_ptr<Work>>> works;
  works.push_back((*comm)->AllReduce(t, ReduceOp::kAvg));
  works.push_back((*comm)->AllGather(t, gathered));
  works.push_back((*comm)->ReduceScatter(t, scattered, ReduceOp::kSum));
  works.push_back((*comm)->Broadcast(t, 0));
  for (auto& work : works) {
    ASSERT_TRUE(work.ok()) << work.status();
    EXPECT_TRUE((*work)->Wait().ok());
  }
  EXPECT_TRUE(at::equal(t, at::full({4}, 3.0, at::kBFloat16)));
  EXPECT_TRUE(at::equal(gathered, t));
  EXPECT_TRUE(at::equal(scattered, t));
  EXPECT_TRUE((*comm)->Barrier().ok());
}

TEST(GlooCommunicatorTest, ReportsRankSizeAndBackend) {
  absl::Status s = multi_rank::RunRanksAsThreads(3, [&](int rank, StorePtr store) -> absl::Status {
    CT_ASSIGN_OR_RETURN(auto comm, Join(store, rank, 3));
    EXPECT_EQ(comm->rank(), rank);
    EXPECT_EQ(comm->size(), 3);
    EXPECT_EQ(comm->backend(), "gloo");
    // No rank tears its communicator down while a peer may still be finishing its side of the
    // connections (that peer would see "connection closed by peer" during its rendezvous).
    return comm->Barrier();
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(GlooCommunicatorTest, CreateRejectsBadArguments) {
  StorePtr store = c10::make_intrusive<c10d::HashStore>();
  EXPECT_THAT(std::string(GlooCommunicator::Create(store, 2, 2, kTimeout).status().message()),
              HasSubstr("got rank 2, size 2"));
  EXPECT_THAT(std::string(GlooCommunicator::Create(store, 0, 0, kTimeout).status().message()),
              HasSubstr("size 0"));
  EXPECT_THAT(std::string(GlooCommunicator::Create(StorePtr(), 0, 1, kTimeout).status().message()),
              HasSubstr("store is null"));
  EXPECT_THAT(
      std::string(
          GlooCommunicator::Create(store, 0, 1, std::chrono::milliseconds(0)).status().message()),
      HasSubstr("timeout must be positive"));
}

TEST(GlooCommunicatorTest, RendezvousTimesOutNamingTheRank) {
  StorePtr store = c10::make_intrusive<c10d::HashStore>();
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::unique_ptr<GlooCommunicator>> comm =
      GlooCommunicator::Create(store, 1, 2, std::chrono::milliseconds(500));
  EXPECT_FALSE(comm.ok());
  EXPECT_THAT(std::string(comm.status().message()), HasSubstr("rank 1 of 2"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

TEST(GlooDeviceChoiceTest, FollowsTheEnvironment) {
  const auto choose = [](std::map<std::string, std::string> env) {
    return ChooseGlooDevice([env](const char* name) -> const char* {
      auto it = env.find(name);
      return it == env.end() ? nullptr : it->second.c_str();
    });
  };
  using Kind = GlooDeviceChoice::Kind;
  EXPECT_EQ(choose({}).kind, Kind::kLoopback);
  EXPECT_EQ(choose({{"MASTER_ADDR", "127.0.0.1"}}).kind, Kind::kLoopback);
  EXPECT_EQ(choose({{"MASTER_ADDR", "localhost"}}).kind, Kind::kLoopback);
  EXPECT_EQ(choose({{"MASTER_ADDR", "10.1.2.3"}}).kind, Kind::kHostname);
  const GlooDeviceChoice ifnames =
      choose({{"MASTER_ADDR", "10.1.2.3"}, {"GLOO_SOCKET_IFNAME", "eth0, ib0"}});
  EXPECT_EQ(ifnames.kind, Kind::kInterfaces);
  EXPECT_EQ(ifnames.interfaces, (std::vector<std::string>{"eth0", "ib0"}));
  EXPECT_THAT(ifnames.Describe(), HasSubstr("eth0,ib0"));
}

TEST(ReduceOpNameTest, NamesEveryOp) {
  EXPECT_STREQ(ReduceOpName(ReduceOp::kSum), "sum");
  EXPECT_STREQ(ReduceOpName(ReduceOp::kAvg), "avg");
  EXPECT_STREQ(ReduceOpName(ReduceOp::kMax), "max");
}

}  // namespace
}  // namespace cpptrain
