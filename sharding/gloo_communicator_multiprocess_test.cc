// Ranks as forked processes sharing a FileStore. The test process itself does no LibTorch work
// before forking, so the children start from a single-threaded image.
#include <unistd.h>

#include <chrono>
#include <iostream>
#include <sstream>
#include <string>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "sharding/gloo_communicator.h"
#include "sharding/testing/multi_rank.h"

namespace cpptrain {
namespace {

using StorePtr = c10::intrusive_ptr<c10d::Store>;

absl::Status ExpectEqual(const at::Tensor& got, const at::Tensor& want, absl::string_view what,
                         int rank) {
  if (at::equal(got, want)) return absl::OkStatus();
  std::ostringstream out;
  out << what << " on rank " << rank << ": got " << got << " want " << want;
  return absl::InternalError(out.str());
}

TEST(GlooMultiProcessTest, CollectivesAcrossThreeProcesses) {
  constexpr int kWorld = 3;
  absl::Status s = multi_rank::RunRanksAsProcesses(
      kWorld,
      [](int rank, StorePtr store) -> absl::Status {
        CT_ASSIGN_OR_RETURN(
            auto comm, GlooCommunicator::Create(store, rank, kWorld, std::chrono::seconds(60)));
        at::Tensor t = at::full({10}, rank + 1.0);
        CT_ASSIGN_OR_RETURN(auto reduce, comm->AllReduce(t, ReduceOp::kSum));
        CT_RETURN_IF_ERROR(reduce->Wait());
        CT_RETURN_IF_ERROR(
            ExpectEqual(t, at::full({10}, kWorld * (kWorld + 1) / 2.0), "AllReduce sum", rank));

        at::Tensor shard = at::arange(5, at::kLong) + 100 * rank;
        at::Tensor full = at::empty({kWorld * 5}, at::kLong);
        CT_ASSIGN_OR_RETURN(auto gather, comm->AllGather(shard, full));
        CT_RETURN_IF_ERROR(gather->Wait());
        at::Tensor want = (at::arange(5, at::kLong).repeat({kWorld}) +
                           100 * at::arange(kWorld, at::kLong).repeat_interleave(5));
        CT_RETURN_IF_ERROR(ExpectEqual(full, want, "AllGather", rank));

        at::Tensor grads = at::full({kWorld * 5}, rank + 1.0, at::kBFloat16);
        at::Tensor mine = at::empty({5}, at::kBFloat16);
        CT_ASSIGN_OR_RETURN(auto scatter, comm->ReduceScatter(grads, mine, ReduceOp::kAvg));
        CT_RETURN_IF_ERROR(scatter->Wait());
        CT_RETURN_IF_ERROR(ExpectEqual(mine, at::full({5}, (kWorld + 1) / 2.0, at::kBFloat16),
                                       "ReduceScatter avg bf16", rank));
        return comm->Barrier();
      },
      std::chrono::seconds(120));
  EXPECT_TRUE(s.ok()) << s;
}

// Rank 2 exits in the middle of a loop of all-reduces; the others must get an error naming the
// collective within 60 s rather than hang.
TEST(GlooMultiProcessTest, DeadPeerBecomesAnErrorNotAHang) {
  constexpr int kWorld = 3;
  constexpr int kDeathStep = 10;
  absl::Status s = multi_rank::RunRanksAsProcesses(
      kWorld,
      [](int rank, StorePtr store) -> absl::Status {
        CT_ASSIGN_OR_RETURN(
            auto comm, GlooCommunicator::Create(store, rank, kWorld, std::chrono::seconds(20)));
        for (int step = 0; step < 100; ++step) {
          if (rank == 2 && step == kDeathStep) _exit(0);
          const auto start = std::chrono::steady_clock::now();
          at::Tensor t = at::ones({1000});
          CT_ASSIGN_OR_RETURN(auto work, comm->AllReduce(t, ReduceOp::kSum));
          const absl::Status status = work->Wait();
          const auto seconds =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          if (status.ok()) {
            if (step >= kDeathStep) {
              return absl::InternalError(absl::StrCat("step ", step, " succeeded without rank 2"));
            }
            continue;
          }
          std::cerr << "rank " << rank << " step " << step << " failed after " << seconds
                    << " s: " << status << "\n";
          // Rank 2 leaves after its step kDeathStep - 1 completed; its peers may still be
          // reading that step's last bytes when its sockets reset, so either step may fail.
          if (step != kDeathStep && step != kDeathStep - 1) {
            return absl::InternalError(absl::StrCat("failed at step ", step, ", before rank 2 ",
                                                    "exited: ", status.ToString()));
          }
          if (seconds >= 60) {
            return absl::InternalError(absl::StrCat("the error took ", seconds, " s"));
          }
          const std::string message(status.message());
          if (message.find("AllReduce") == std::string::npos ||
              message.find(absl::StrCat("rank ", rank, " of 3")) == std::string::npos) {
            return absl::InternalError(
                absl::StrCat("the error does not name AllReduce and the rank: ", message));
          }
          return absl::OkStatus();
        }
        return absl::InternalError("all 100 steps succeeded");
      },
      std::chrono::seconds(120));
  EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace cpptrain
