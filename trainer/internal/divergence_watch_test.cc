#include "trainer/internal/divergence_watch.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/types.h>

#include <chrono>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/status.h"
#include "sharding/gloo_communicator.h"
#include "sharding/testing/communicator_host_group.h"
#include "sharding/testing/multi_rank.h"

namespace cpptrain {
namespace trainer_internal {
namespace {

using ::testing::HasSubstr;

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// Runs `body` on `world` ranks as threads; returns each rank's verdict, by rank.
std::vector<absl::Status> Verdicts(int world,
                                   const std::function<void(int, DivergenceWatch&)>& record) {
  std::vector<absl::Status> verdicts(world);
  std::mutex mu;
  const absl::Status s = multi_rank::RunRanksAsThreads(
      world, [&](int rank, auto store) -> absl::Status {
        CT_ASSIGN_OR_RETURN(std::unique_ptr<GlooCommunicator> comm,
                            GlooCommunicator::Create(store, rank, world, std::chrono::seconds(60)));
        CommunicatorHostGroup group(std::move(comm));
        DivergenceWatch watch;
        record(rank, watch);
        const absl::Status verdict = watch.Check(group);
        std::lock_guard<std::mutex> lock(mu);
        verdicts[rank] = verdict;
        return absl::OkStatus();
      });
  EXPECT_TRUE(s.ok()) << s;
  return verdicts;
}

torch::Tensor Scalar(double v) { return torch::tensor(v, torch::kFloat64); }

TEST(DivergenceWatchTest, FiniteStepsPassOnEveryRank) {
  for (const absl::Status& v : Verdicts(3, [](int rank, DivergenceWatch& w) {
         for (int step = 1; step <= 4; ++step) w.Record(step, Scalar(2.5 + rank), Scalar(1e30));
       })) {
    EXPECT_TRUE(v.ok()) << v;
  }
}

TEST(DivergenceWatchTest, NothingRecordedPasses) {
  SingleProcessGroup alone;
  EXPECT_TRUE(DivergenceWatch().Check(alone).ok());
}

// The loss is each rank's own: one rank's NaN must stop every rank, with the same message.
TEST(DivergenceWatchTest, OneRanksNanLossStopsEveryRankAlike) {
  const std::vector<absl::Status> verdicts = Verdicts(3, [](int rank, DivergenceWatch& w) {
    for (int step = 1; step <= 5; ++step) {
      const bool bad = rank == 1 && step >= 3;
      w.Record(step, Scalar(bad ? (step == 3 ? kNan : kInf) : 2.0), torch::Tensor());
    }
  });
  for (const absl::Status& v : verdicts) {
    EXPECT_EQ(v.code(), absl::StatusCode::kFailedPrecondition) << v;
    EXPECT_THAT(v.message(), HasSubstr("the loss was nan at step 3 on rank(s) 1."));
    EXPECT_THAT(v.message(), HasSubstr("before step 3"));
    EXPECT_EQ(v, verdicts[0]);
  }
}

TEST(DivergenceWatchTest, EarliestLossStepNamesEveryRankThatSawIt) {
  const std::vector<absl::Status> verdicts = Verdicts(3, [](int rank, DivergenceWatch& w) {
    for (int step = 1; step <= 6; ++step) {
      const int first_bad = rank == 0 ? 5 : 4;
      w.Record(step, Scalar(step >= first_bad ? -kInf : 1.0), Scalar(1.0));
    }
  });
  for (const absl::Status& v : verdicts) {
    EXPECT_THAT(v.message(), HasSubstr("the loss was -inf at step 4 on rank(s) 1, 2."));
  }
}

TEST(DivergenceWatchTest, GradientNormIsNamedWithItsStep) {
  SingleProcessGroup alone;
  DivergenceWatch w;
  w.Record(1, Scalar(3.0), Scalar(2.0));
  w.Record(2, Scalar(3.0), Scalar(kInf));
  w.Record(3, Scalar(kNan), Scalar(kNan));
  const absl::Status v = w.Check(alone);
  EXPECT_EQ(v.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(v.message(), HasSubstr("the loss was nan at step 3; the gradient norm was inf "
                                     "at step 2."));
  EXPECT_THAT(v.message(), HasSubstr("before step 2"));
  w.Reset();
  EXPECT_TRUE(w.Check(alone).ok());
}

// The loss lags the weights (it is computed before the update): weights one rank holds NaN
// in stop every rank, naming the parameter and the rank.
TEST(DivergenceWatchTest, NonFiniteWeightsOnOneRankStopEveryRank) {
  const std::vector<absl::Status> verdicts = Verdicts(3, [](int rank, DivergenceWatch& w) {
    w.Record(7, Scalar(2.0), Scalar(1.0));
    torch::Tensor b = torch::ones({4});
    if (rank == 2) b[3] = kInf;
    w.RecordParameters(7, {{"a", torch::ones({2})}, {"empty", torch::ones({0})}, {"b", b}});
  });
  for (const absl::Status& v : verdicts) {
    EXPECT_EQ(v.code(), absl::StatusCode::kFailedPrecondition) << v;
    EXPECT_THAT(v.message(),
                HasSubstr("parameter b held NaN or infinite values after step 7 on rank(s) 2."));
    EXPECT_EQ(v, verdicts[0]);
  }
  SingleProcessGroup alone;
  DivergenceWatch finite;
  finite.RecordParameters(3, {{"a", torch::ones({2})}, {"empty", torch::ones({0})}});
  EXPECT_TRUE(finite.Check(alone).ok());
}

}  // namespace
}  // namespace trainer_internal
}  // namespace cpptrain
