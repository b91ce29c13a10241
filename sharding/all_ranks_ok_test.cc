#include "sharding/all_ranks_ok.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "sharding/gloo_communicator.h"
#include "sharding/testing/communicator_host_group.h"
#include "sharding/testing/multi_rank.h"

namespace cpptrain {
namespace {

using ::testing::ElementsAre;
using ::testing::EndsWith;
using ::testing::HasSubstr;

// Runs `body` on `world` ranks as threads, each with its CommunicatorHostGroup.
absl::Status OnRanks(int world, const std::function<absl::Status(HostGroup&)>& body) {
  return multi_rank::RunRanksAsThreads(world, [&](int rank, auto store) -> absl::Status {
    CT_ASSIGN_OR_RETURN(std::unique_ptr<GlooCommunicator> comm,
                        GlooCommunicator::Create(store, rank, world, std::chrono::seconds(60)));
    CommunicatorHostGroup group(std::move(comm));
    return body(group);
  });
}

TEST(AllRanksOkTest, EveryRankOkIsOkEverywhere) {
  const absl::Status s = OnRanks(3, [](HostGroup& g) -> absl::Status {
    CT_ASSIGN_OR_RETURN(std::vector<RankFailure> failures, GatherFailures(g, absl::OkStatus()));
    EXPECT_TRUE(failures.empty());
    EXPECT_TRUE(AllRanksOk(g, absl::OkStatus()).ok());
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(AllRanksOkTest, OneFailedRankIsNamedWithItsCodeAndMessageOnEveryOtherRank) {
  const std::string disk_full = "cannot write '/out/shard-00001-of-00003.safetensors': full";
  const absl::Status s = OnRanks(3, [&](HostGroup& g) -> absl::Status {
    const absl::Status mine =
        g.rank() == 1 ? absl::ResourceExhaustedError(disk_full) : absl::OkStatus();
    const absl::Status agreed = AllRanksOk(g, mine);
    if (g.rank() == 1) {
      EXPECT_EQ(agreed, mine);  // its own error, unchanged
    } else {
      EXPECT_EQ(agreed.code(), absl::StatusCode::kResourceExhausted) << agreed;
      EXPECT_EQ(agreed.message(), absl::StrCat("rank 1 failed: ", disk_full));
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

// Rank r fails when r is even, with a message naming r: every rank sees the same list.
TEST(AllRanksOkTest, SeveralFailedRanksAreListedInRankOrderAlike) {
  const absl::Status s = OnRanks(4, [](HostGroup& g) -> absl::Status {
    const absl::Status mine =
        g.rank() % 2 == 0
            ? absl::Status(
                  g.rank() == 0 ? absl::StatusCode::kDataLoss : absl::StatusCode::kInternal,
                  absl::StrCat("disk of rank ", g.rank(), std::string(g.rank(), '!')))
            : absl::OkStatus();
    CT_ASSIGN_OR_RETURN(std::vector<RankFailure> failures, GatherFailures(g, mine));
    std::vector<std::string> seen;
    for (const RankFailure& f : failures) seen.push_back(absl::StrCat(f.rank, ":", f.message));
    EXPECT_THAT(seen, ElementsAre("0:disk of rank 0", "2:disk of rank 2!!"));
    const absl::Status agreed = AllRanksOk(g, mine);
    if (g.rank() % 2 == 1) {
      EXPECT_EQ(agreed.code(), absl::StatusCode::kDataLoss);  // the first failed rank's
      EXPECT_EQ(agreed.message(),
                "ranks 0, 2 failed: rank 0: disk of rank 0; rank 2: disk of rank 2!!");
    } else {
      EXPECT_EQ(agreed, mine);
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(AllRanksOkTest, LongMessagesAreCut) {
  const absl::Status s = OnRanks(2, [](HostGroup& g) -> absl::Status {
    const absl::Status mine =
        g.rank() == 0 ? absl::InternalError(std::string(10000, 'x')) : absl::OkStatus();
    CT_ASSIGN_OR_RETURN(std::vector<RankFailure> failures, GatherFailures(g, mine));
    EXPECT_EQ(failures.size(), 1u);
    if (failures.size() == 1) {
      EXPECT_EQ(static_cast<int64_t>(failures[0].message.size()), kMaxRankFailureBytes);
      EXPECT_THAT(failures[0].message, EndsWith("x [...]"));
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(AllRanksOkTest, AloneItReturnsItsOwnStatus) {
  SingleProcessGroup alone;
  EXPECT_TRUE(AllRanksOk(alone, absl::OkStatus()).ok());
  const absl::Status error = absl::UnavailableError("cannot read 'x'");
  EXPECT_EQ(AllRanksOk(alone, error), error);
  absl::StatusOr<std::vector<RankFailure>> failures = GatherFailures(alone, error);
  ASSERT_TRUE(failures.ok()) << failures.status();
  ASSERT_EQ(failures->size(), 1u);
  EXPECT_THAT(DescribeFailures(*failures), HasSubstr("rank 0 failed: cannot read 'x'"));
}

}  // namespace
}  // namespace cpptrain
