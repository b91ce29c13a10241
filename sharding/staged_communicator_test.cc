#include "sharding/staged_communicator.h"

#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "base/status.h"
#include "sharding/gloo_communicator.h"
#include "sharding/store_communicator.h"
#include "sharding/testing/communicator_conformance.h"
#include "sharding/testing/multi_rank.h"

namespace cpptrain {
namespace {

using ::cpptrain::conformance::CommunicatorConformanceTest;
using ::testing::HasSubstr;
using StorePtr = c10::intrusive_ptr<c10d::Store>;

// A staged communicator over the host communicator class `Host`, staging CPU tensors: the
// path a GPU run takes, with host copies instead of device copies.
template <typename Host>
conformance::CommunicatorFactory StagedOver() {
  return [](StorePtr store, int rank, int size,
            std::chrono::milliseconds timeout) -> absl::StatusOr<std::unique_ptr<Communicator>> {
    CT_ASSIGN_OR_RETURN(std::unique_ptr<Host> host,
                        Host::Create(std::move(store), rank, size, timeout));
    CT_ASSIGN_OR_RETURN(std::unique_ptr<StagedCommunicator> staged,
                        StagedCommunicator::Create(std::move(host), CpuStaging()));
    return std::unique_ptr<Communicator>(std::move(staged));
  };
}

// The argument errors are the host communicator's (run on the host copies), so they name it.
conformance::CommunicatorUnderTest StagedGloo() {
  conformance::CommunicatorUnderTest gloo("StagedGloo", "staged-gloo", "GlooCommunicator",
                                          StagedOver<GlooCommunicator>());
  gloo.collective_timeout_error = "Gloo AllReduce failed on rank 0 of 2";
  gloo.join_timeout_error = "Gloo rendezvous failed on rank 1 of 3";
  return gloo;
}

conformance::CommunicatorUnderTest StagedStore() {
  conformance::CommunicatorUnderTest store("StagedStore", "staged-store", "StoreCommunicator",
                                           StagedOver<StoreCommunicator>());
  store.op_name = conformance::KebabCase;
  store.collective_timeout_error =
      "rank 0 of 2: store all-reduce #1 did not complete within 1.5 s: rank(s) 1 never "
      "contributed";
  store.join_timeout_error =
      "rank 1 of 3: store join #0 did not complete within 0.5 s: rank(s) 0, 2 never joined";
  store.join_timeout_code = absl::StatusCode::kDeadlineExceeded;
  return store;
}

INSTANTIATE_TEST_SUITE_P(Staged, CommunicatorConformanceTest,
                         ::testing::Values(StagedGloo(), StagedStore()), conformance::TestName);

TEST(StagedCommunicatorTest, CreateNeedsAHostCommunicatorAndAStaging) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  absl::StatusOr<std::unique_ptr<StoreCommunicator>> host =
      StoreCommunicator::Create(store, 0, 1, std::chrono::seconds(10));
  ASSERT_TRUE(host.ok()) << host.status();
  absl::StatusOr<std::unique_ptr<StagedCommunicator>> staged =
      StagedCommunicator::Create(*std::move(host), nullptr);
  EXPECT_EQ(staged.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(staged.status().message()), HasSubstr("must both be given"));
}

// The results are copied back at Wait, as NCCL's land on the device only for a stream that
// waited: a caller that reads before Wait sees its own values, which is what exposes a missing
// Wait in the engines when they run staged.
TEST(StagedCommunicatorTest, ResultsLandAtWait) {
  absl::Status s = multi_rank::RunRanksAsThreads(2, [](int rank, StorePtr store) -> absl::Status {
    CT_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> comm,
                        StagedOver<StoreCommunicator>()(store, rank, 2, std::chrono::seconds(30)));
    at::Tensor t = at::full({4}, rank + 1.0);
    CT_ASSIGN_OR_RETURN(std::unique_ptr<Work> work, comm->AllReduce(t, ReduceOp::kSum));
    EXPECT_TRUE(at::equal(t, at::full({4}, rank + 1.0))) << "rank " << rank;
    CT_RETURN_IF_ERROR(work->Wait());
    EXPECT_TRUE(at::equal(t, at::full({4}, 3.0))) << "rank " << rank;
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace cpptrain
