#include "sharding/testing/communicator_conformance.h"

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "sharding/testing/multi_rank.h"

namespace cpptrain {
namespace conformance {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;
using StorePtr = c10::intrusive_ptr<c10d::Store>;
using WorkOr = absl::StatusOr<std::unique_ptr<Work>>;

constexpr std::chrono::seconds kTimeout(60);
constexpr int kMaxWorld = 4;

// Broadcast roots: the first, the second and the last rank.
std::vector<int> Roots(int world) {
  std::vector<int> roots = {0};
  if (world > 1) roots.push_back(1);
  if (world > 2) roots.push_back(world - 1);
  return roots;
}

// How the backend's errors name the collective `method` issues.
std::string OpName(const CommunicatorUnderTest& backend, absl::string_view method) {
  return backend.op_name ? backend.op_name(method) : std::string(method);
}

// Issues a collective on a non-contiguous tensor: done where the backend takes one (true: the
// caller checks the values), else refused before any communication.
bool DoneOrRefusedAsStrided(const CommunicatorUnderTest& backend, WorkOr work,
                            const std::string& what, Expectations& expect) {
  if (!backend.takes_non_contiguous) {
    expect.Refused(work, "not contiguous", what);
    return false;
  }
  expect.Done(std::move(work), what);
  return true;
}

}  // namespace

std::string KebabCase(absl::string_view method) {
  std::string name;
  for (char c : method) {
    if (absl::ascii_isupper(c) && !name.empty()) name += '-';
    name += absl::ascii_tolower(c);
  }
  return name;
}

void PrintTo(const CommunicatorUnderTest& backend, std::ostream* out) { *out << backend.name; }

std::string TestName(const ::testing::TestParamInfo<CommunicatorUnderTest>& info) {
  return info.param.name;
}

void CommunicatorConformanceTest::RunRanks(int world, const Body& body,
                                           std::chrono::milliseconds timeout) {
  const CommunicatorUnderTest& backend = GetParam();
  absl::Status s =
      multi_rank::RunRanksAsThreads(world, [&](int rank, StorePtr store) -> absl::Status {
        CT_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> comm,
                            backend.create(store, rank, world, timeout));
        Expectations expect(rank);
        body(rank, world, *comm, expect);
        // No rank tears its communicator down while a peer may still be connecting to it.
        expect.Ok(comm->Barrier(), "closing Barrier");
        return expect.status();
      });
  EXPECT_TRUE(s.ok()) << backend.name << ", world " << world << ": " << s;
}

void CommunicatorConformanceTest::RunRanks(int world, const Body& body) {
  RunRanks(world, body, kTimeout);
}

void CommunicatorConformanceTest::ForEachWorld(const Body& body) {
  for (int world = 1; world <= kMaxWorld; ++world) RunRanks(world, body);
}

TEST_P(CommunicatorConformanceTest, AllReduce) {
  ForEachWorld([](int rank, int world, Communicator& comm, Expectations& expect) {
    for (at::ScalarType dtype : ReducibleDtypes()) {
      for (int64_t n : {int64_t{7}, int64_t{1001}, int64_t{4099}}) {
        for (ReduceOp op : OpsFor(dtype)) {
          const std::string label = Label("AllReduce", dtype, op, n);
          at::Tensor t = Fill(n, dtype, [&](int64_t i) { return rank + 1 + i % 3; });
          expect.Done(comm.AllReduce(t, op), label);
          expect.Equal(t, Fill(n, dtype, [&](int64_t i) { return Reduced(op, world, i, 3); }),
                       label);
        }
      }
    }
    // In place on a 2-D tensor; Synchronize() waits as Wait() does.
    at::Tensor matrix = at::full({3, 5}, rank + 1.0);
    WorkOr work = comm.AllReduce(matrix, ReduceOp::kSum);
    expect.Ok(work.ok() ? (*work)->Synchronize() : work.status(), "AllReduce 2-D");
    expect.Equal(matrix, at::full({3, 5}, world * (world + 1) / 2.0), "AllReduce 2-D");
  });
}

TEST_P(CommunicatorConformanceTest, AllReduceOfNonContiguousViewWritesOnlyTheView) {
  ForEachWorld([this](int rank, int world, Communicator& comm, Expectations& expect) {
    at::Tensor base = at::full({4, 6}, -1.0);
    at::Tensor column = base.select(1, 2);  // Stride 6.
    column.copy_(Fill(4, at::kFloat, [&](int64_t i) { return rank + 1 + i % 3; }));
    const std::string label = "AllReduce of a column";
    if (!DoneOrRefusedAsStrided(GetParam(), comm.AllReduce(column, ReduceOp::kSum), label,
                                expect)) {
      return;
    }
    at::Tensor want = at::full({4, 6}, -1.0);
    want.select(1, 2).copy_(
        Fill(4, at::kFloat, [&](int64_t i) { return Reduced(ReduceOp::kSum, world, i, 3); }));
    expect.Equal(base, want, label);
  });
}

// Reducing in bfloat16 would lose the small contributions next to 256 (bf16 steps by 2 there);
// in float32 they add up before the one rounding back to bfloat16.
TEST_P(CommunicatorConformanceTest, BFloat16IsReducedInFloat32) {
  ForEachWorld([](int rank, int world, Communicator& comm, Expectations& expect) {
    at::Tensor t = at::full({5}, rank == 0 ? 256.0 : 1.0, at::kBFloat16);
    expect.Done(comm.AllReduce(t, ReduceOp::kSum), "AllReduce bf16");
    expect.Equal(t, at::full({5}, 256.0f + (world - 1), at::kFloat).to(at::kBFloat16),
                 "AllReduce bf16");
  });
}

TEST_P(CommunicatorConformanceTest, AllGather) {
  ForEachWorld([this](int rank, int world, Communicator& comm, Expectations& expect) {
    const auto value = [](int r, int64_t i) { return r * 10.0 + i % 10; };
    for (at::ScalarType dtype : ReducibleDtypes()) {
      for (int64_t n : {int64_t{1}, int64_t{5}, int64_t{7}, int64_t{13}, int64_t{1001}}) {
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
    at::Tensor mine = output[rank];
    mine.copy_(Fill(5, at::kFloat, [&](int64_t i) { return value(rank, i); }));
    expect.Done(comm.AllGather(mine, output), "AllGather in place");
    expect.Equal(output,
                 Fill(world * 5, at::kFloat,
                      [&](int64_t j) { return value(static_cast<int>(j / 5), j % 5); }),
                 "AllGather in place");
    // A strided input.
    at::Tensor strided = Fill(10, at::kLong, [&](int64_t i) { return value(rank, i); });
    at::Tensor gathered = at::zeros({world * 5}, at::kLong);
    if (DoneOrRefusedAsStrided(GetParam(), comm.AllGather(strided.slice(0, 0, 10, 2), gathered),
                               "AllGather strided", expect)) {
      expect.Equal(gathered,
                   Fill(world * 5, at::kLong,
                        [&](int64_t j) { return value(static_cast<int>(j / 5), 2 * (j % 5)); }),
                   "AllGather strided");
    }
  });
}

TEST_P(CommunicatorConformanceTest, ReduceScatter) {
  ForEachWorld([](int rank, int world, Communicator& comm, Expectations& expect) {
    for (at::ScalarType dtype : ReducibleDtypes()) {
      for (int64_t n : {int64_t{1}, int64_t{5}, int64_t{7}, int64_t{11}, int64_t{1001}}) {
        for (ReduceOp op : OpsFor(dtype)) {
          const std::string label = Label("ReduceScatter", dtype, op, n);
          // Row r of the [world, n] input is what rank r receives the reduction of.
          at::Tensor input =
              Fill(world * n, dtype, [&](int64_t j) { return rank + 1 + j % 7; }).view({world, n});
          at::Tensor output = at::full({n}, -1.0, at::TensorOptions().dtype(dtype));
          expect.Done(comm.ReduceScatter(input, output, op), label);
          expect.Equal(
              output,
              Fill(n, dtype, [&](int64_t i) { return Reduced(op, world, rank * n + i, 7); }),
              label);
        }
      }
    }
  });
}

TEST_P(CommunicatorConformanceTest, BroadcastFromFirstSecondAndLastRank) {
  ForEachWorld([this](int rank, int world, Communicator& comm, Expectations& expect) {
    const auto value = [](int r, int64_t i) { return r * 7.0 + i % 5; };
    const std::vector<std::vector<int64_t>> shapes = {{3, 3}, {7}, {1001}};
    for (int root : Roots(world)) {
      for (at::ScalarType dtype : ReducibleDtypes()) {
        for (const std::vector<int64_t>& shape : shapes) {
          const int64_t n = c10::multiply_integers(shape);
          const std::string label =
              absl::StrCat("Broadcast ", c10::toString(dtype), " n=", n, " root ", root);
          at::Tensor t = Fill(n, dtype, [&](int64_t i) { return value(rank, i); }).view(shape);
          expect.Done(comm.Broadcast(t, root), label);
          expect.Equal(t, Fill(n, dtype, [&](int64_t i) { return value(root, i); }), label);
        }
      }
    }
    // Into a transposed (non-contiguous) view.
    at::Tensor matrix = Fill(6, at::kFloat, [&](int64_t i) { return value(rank, i); }).view({2, 3});
    at::Tensor transposed = matrix.t();
    if (DoneOrRefusedAsStrided(GetParam(), comm.Broadcast(transposed, 0), "Broadcast transposed",
                               expect)) {
      expect.Equal(matrix, Fill(6, at::kFloat, [&](int64_t i) { return value(0, i); }),
                   "Broadcast transposed");
    }
  });
}

TEST_P(CommunicatorConformanceTest, ScatterFromFirstAndLastRank) {
  ForEachWorld([](int rank, int world, Communicator& comm, Expectations& expect) {
    for (int root : {0, world - 1}) {
      for (at::ScalarType dtype : ReducibleDtypes()) {
        for (int64_t n : {int64_t{7}, int64_t{1001}}) {
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

TEST_P(CommunicatorConformanceTest, CoalescedFormsWithMixedDtypes) {
  ForEachWorld([](int rank, int world, Communicator& comm, Expectations& expect) {
    const std::vector<std::pair<at::ScalarType, int64_t>> specs = {
        {at::kFloat, 7}, {at::kBFloat16, 3}, {at::kBFloat16, 1001}, {at::kLong, 4}, {at::kLong, 3},
        {at::kHalf, 2},  {at::kDouble, 5},   {at::kInt, 1},         {at::kFloat, 0}};
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
            Fill(t.numel(), t.scalar_type(), [&](int64_t i) { return Reduced(op, world, i, 3); }),
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
                          [&](int64_t i) { return Reduced(op, world, rank * n + i, 7); }),
                     Label("ReduceScatterCoalesced", out.scalar_type(), op, n));
      }
    }

    std::vector<at::Tensor> none;
    expect.Done(comm.AllReduceCoalesced(none, ReduceOp::kSum), "AllReduceCoalesced of nothing");
  });
}

TEST_P(CommunicatorConformanceTest, BarrierWaitsForEveryRank) {
  const CommunicatorUnderTest& backend = GetParam();
  for (int world = 1; world <= kMaxWorld; ++world) {
    absl::Status s =
        multi_rank::RunRanksAsThreads(world, [&](int rank, StorePtr store) -> absl::Status {
          CT_ASSIGN_OR_RETURN(auto comm, backend.create(store, rank, world, kTimeout));
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
          return comm->Barrier();
        });
    EXPECT_TRUE(s.ok()) << "world " << world << ": " << s;
  }
}

TEST_P(CommunicatorConformanceTest, WorkCanBeWaitedInAnyOrderAndAgain) {
  ForEachWorld([](int rank, int world, Communicator& comm, Expectations& expect) {
    // Gloo still has them queued when the last is issued; the store has finished each.
    const std::vector<int64_t> sizes = {100, 101, 102, 103, 104, 105, 10, 11, 12, 13};
    std::vector<at::Tensor> tensors;
    std::vector<std::unique_ptr<Work>> works;
    for (int64_t n : sizes) {
      tensors.push_back(at::full({n}, (rank + 1.0) * (n % 10 + 1)));
      WorkOr work = comm.AllReduce(tensors.back(), ReduceOp::kAvg);
      expect.Ok(work.status(), absl::StrCat("AllReduce n=", n));
      works.push_back(work.ok() ? *std::move(work) : nullptr);
    }
    for (int k = static_cast<int>(sizes.size()) - 1; k >= 0; --k) {
      if (works[k] == nullptr) continue;
      const std::string label = absl::StrCat("AllReduce n=", sizes[k]);
      expect.Ok(works[k]->Wait(), label);
      expect.Ok(works[k]->Wait(), absl::StrCat("second Wait of ", label));
      expect.Ok(works[k]->Synchronize(), absl::StrCat("Synchronize after Wait of ", label));
      expect.Equal(tensors[k], at::full({sizes[k]}, (world + 1) / 2.0 * (sizes[k] % 10 + 1)),
                   label);
    }
  });
}

namespace {

void ExpectInvalid(const WorkOr& result, const std::vector<std::string>& parts) {
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << result.status();
  for (const std::string& part : parts) {
    EXPECT_THAT(std::string(result.status().message()), HasSubstr(part));
  }
}

// Calls that must fail before any communication, on rank 0 of 2.
void MakeInvalidCalls(const CommunicatorUnderTest& backend, Communicator& comm) {
  const auto op_name = [&](absl::string_view method) { return OpName(backend, method); };
  at::Tensor input = at::ones({5});
  at::Tensor short_output = at::zeros({9});
  ExpectInvalid(comm.AllGather(input, short_output),
                {absl::StrCat(backend.class_name, " ", op_name("AllGather"), " (rank 0 of 2)"),
                 "has 9 elements; expected 10"});
  at::Tensor int_output = at::zeros({10}, at::kInt);
  ExpectInvalid(comm.AllGather(input, int_output), {"dtype Float", "dtype Int"});
  if (!backend.takes_non_contiguous) {
    at::Tensor strided_output = at::zeros({10, 2}).select(1, 0);
    ExpectInvalid(comm.AllGather(input, strided_output), {"not contiguous"});
  }
  at::Tensor long_input = at::ones({11});
  at::Tensor output = at::zeros({5});
  ExpectInvalid(comm.ReduceScatter(long_input, output, ReduceOp::kSum),
                {op_name("ReduceScatter"), "has 11 elements; expected 10"});
  at::Tensor ints = at::ones({4}, at::kLong);
  ExpectInvalid(comm.AllReduce(ints, ReduceOp::kAvg), {"avg", "Long"});
  at::Tensor int_chunks = at::ones({8}, at::kLong);
  at::Tensor int_out = at::zeros({4}, at::kLong);
  ExpectInvalid(comm.ReduceScatter(int_chunks, int_out, ReduceOp::kAvg), {"avg"});
  at::Tensor flags = at::ones({4}, at::kBool);
  ExpectInvalid(comm.AllReduce(flags, ReduceOp::kMax),
                {"dtype Bool", "reductions take Float, Double, BFloat16, Half, Int, Long"});
  at::Tensor undefined;
  ExpectInvalid(comm.Broadcast(undefined, 0), {"undefined"});
  at::Tensor meta = at::empty({4}, at::TensorOptions().device(at::kMeta));
  ExpectInvalid(comm.AllReduce(meta, ReduceOp::kSum), {"device meta", "CPU tensors only"});
  at::Tensor cpu = at::ones({4});
  ExpectInvalid(comm.Broadcast(cpu, 2), {"root 2 is outside [0, 2)"});
  ExpectInvalid(comm.Scatter(at::ones({7}), cpu, 0), {op_name("Scatter"), "expected 8"});
  std::vector<at::Tensor> two{at::ones({2}), at::ones({2})};
  std::vector<at::Tensor> one{at::zeros({4})};
  ExpectInvalid(comm.AllGatherCoalesced(two, one), {"2 inputs but 1 outputs"});
  std::vector<at::Tensor> mixed{at::ones({2}), at::ones({2}, at::kLong)};
  ExpectInvalid(comm.AllReduceCoalesced(mixed, ReduceOp::kAvg), {"tensors[1]", "avg"});
}

}  // namespace

// Each invalid call is made on rank 0 only. Had any of them communicated, the all-reduce that
// follows would pair with it and fail or time out.
TEST_P(CommunicatorConformanceTest, InvalidArgumentsFailBeforeAnyCommunication) {
  RunRanks(
      2,
      [this](int rank, int world, Communicator& comm, Expectations& expect) {
        if (rank == 0) MakeInvalidCalls(GetParam(), comm);
        at::Tensor t = at::full({3}, rank + 1.0);
        expect.Done(comm.AllReduce(t, ReduceOp::kSum), "AllReduce after the invalid calls");
        expect.Equal(t, at::full({3}, 3.0), "AllReduce after the invalid calls");
      },
      std::chrono::seconds(5));
}

// Rank 1 never issues the all-reduce: rank 0's fails after the communicator's timeout, with an
// error naming the collective and the rank.
TEST_P(CommunicatorConformanceTest, CollectiveTimeoutNamesTheCollectiveAndTheRank) {
  const CommunicatorUnderTest& backend = GetParam();
  constexpr std::chrono::milliseconds kShort(1500);
  absl::Status s = multi_rank::RunRanksAsThreads(2, [&](int rank, StorePtr store) -> absl::Status {
    CT_ASSIGN_OR_RETURN(auto comm, backend.create(store, rank, 2, kShort));
    if (rank == 1) {
      store->wait({"rank0_done"}, kTimeout);
      return absl::OkStatus();
    }
    at::Tensor t = at::ones({8});
    const auto start = Clock::now();
    WorkOr work = comm->AllReduce(t, ReduceOp::kSum);
    const absl::Status status = work.ok() ? (*work)->Wait() : work.status();
    const auto elapsed = Clock::now() - start;
    store->set("rank0_done", std::vector<uint8_t>{1});
    EXPECT_TRUE(work.ok()) << work.status();
    EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr("rank 0 of 2"));
    EXPECT_THAT(std::string(status.message()), HasSubstr(backend.collective_timeout_error));
    EXPECT_GE(elapsed, kShort);
    EXPECT_LT(elapsed, kShort + std::chrono::seconds(5));
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST_P(CommunicatorConformanceTest, SingleRankGroupWithoutThreads) {
  StorePtr store = c10::make_intrusive<c10d::HashStore>();
  absl::StatusOr<std::unique_ptr<Communicator>> comm = GetParam().create(store, 0, 1, kTimeout);
  ASSERT_TRUE(comm.ok()) << comm.status();
  at::Tensor t = at::full({4}, 3.0, at::kBFloat16);
  at::Tensor gathered = at::zeros({4}, at::kBFloat16);
  at::Tensor scattered = at::zeros({4}, at::kBFloat16);
  std::vector<WorkOr> works;
  works.push_back((*comm)->AllReduce(t, ReduceOp::kAvg));
  works.push_back((*comm)->AllGather(t, gathered));
  works.push_back((*comm)->ReduceScatter(t, scattered, ReduceOp::kSum));
  works.push_back((*comm)->Broadcast(t, 0));
  for (WorkOr& work : works) {
    ASSERT_TRUE(work.ok()) << work.status();
    EXPECT_TRUE((*work)->Wait().ok());
  }
  EXPECT_TRUE(at::equal(t, at::full({4}, 3.0, at::kBFloat16)));
  EXPECT_TRUE(at::equal(gathered, t));
  EXPECT_TRUE(at::equal(scattered, t));
  EXPECT_TRUE((*comm)->Barrier().ok());
}

TEST_P(CommunicatorConformanceTest, ReportsRankSizeBackendAndDevice) {
  RunRanks(3, [this](int rank, int world, Communicator& comm, Expectations& expect) {
    EXPECT_EQ(comm.rank(), rank);
    EXPECT_EQ(comm.size(), 3);
    EXPECT_EQ(comm.backend(), GetParam().backend);
    EXPECT_TRUE(comm.device().has_value());
    EXPECT_EQ(comm.device().value_or(c10::Device(c10::kMeta)), c10::Device(c10::kCPU));
  });
}

TEST_P(CommunicatorConformanceTest, CreateRejectsBadArguments) {
  const CommunicatorUnderTest& backend = GetParam();
  StorePtr store = c10::make_intrusive<c10d::HashStore>();
  const auto message = [&](StorePtr s, int rank, int size, std::chrono::milliseconds timeout) {
    return std::string(backend.create(std::move(s), rank, size, timeout).status().message());
  };
  const std::string create = backend.class_name + "::Create: ";
  EXPECT_THAT(message(store, 2, 2, kTimeout), HasSubstr(create + "need 0 <= rank < size"));
  EXPECT_THAT(message(store, 2, 2, kTimeout), HasSubstr("got rank 2, size 2"));
  EXPECT_THAT(message(store, 0, 0, kTimeout), HasSubstr("size 0"));
  EXPECT_THAT(message(StorePtr(), 0, 1, kTimeout), HasSubstr(create + "store is null"));
  EXPECT_THAT(message(store, 0, 1, std::chrono::milliseconds(0)),
              HasSubstr(create + "timeout must be positive"));
}

TEST_P(CommunicatorConformanceTest, CreateTimesOutNamingTheRank) {
  const CommunicatorUnderTest& backend = GetParam();
  StorePtr store = c10::make_intrusive<c10d::HashStore>();
  const auto start = Clock::now();
  absl::StatusOr<std::unique_ptr<Communicator>> comm =
      backend.create(store, 1, 3, std::chrono::milliseconds(500));
  const auto elapsed = Clock::now() - start;
  ASSERT_FALSE(comm.ok());
  EXPECT_THAT(std::string(comm.status().message()), HasSubstr("rank 1 of 3"));
  EXPECT_THAT(std::string(comm.status().message()), HasSubstr(backend.join_timeout_error));
  if (backend.join_timeout_code.has_value()) {
    EXPECT_EQ(comm.status().code(), *backend.join_timeout_code) << comm.status();
  }
  EXPECT_LT(elapsed, std::chrono::seconds(10));
}

}  // namespace conformance
}  // namespace cpptrain
