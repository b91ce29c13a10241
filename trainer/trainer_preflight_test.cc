// Trainer::Preflight over two ranks (threads, the store communicator): ranks started with
// different training arguments, another model or data configuration, or another number of
// samples, all fail before the first step, naming the odd rank; so does an output_dir that
// rank 0 cannot create. And what the ranks' evaluation reports is the same on each. (Ranks of
// another launcher's job: two_jobs_test.sh.)
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include <c10/core/Device.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engines/ddp/ddp_engine.h"
#include "sharding/store_communicator.h"
#include "sharding/testing/multi_rank.h"
#include "trainer/testing/trainer_testing.h"
#include "trainer/trainer.h"

namespace cpptrain {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// Rank `rank` of two: DDP on the CPU over the store communicator.
absl::StatusOr<std::unique_ptr<DdpEngine>> CpuDdpEngine(int rank,
                                                       c10::intrusive_ptr<c10d::Store> store) {
  auto comm = StoreCommunicator::Create(store, rank, 2, std::chrono::seconds(30));
  if (!comm.ok()) return comm.status();
  return DdpEngine::Create(proto::DdpConfig(), MixedPrecision::kNone, c10::Device(c10::kCPU),
                           std::move(*comm));
}

using VaryRank = std::function<void(int, proto::TrainingArguments&, std::string&)>;

// What each of two ranks' Train returned, and the steps it ran.
struct TwoRanks {
  std::vector<absl::Status> results = std::vector<absl::Status>(2);
  std::vector<int64_t> steps = std::vector<int64_t>(2, -1);
};

// Trains two ranks whose arguments and job identity `vary` sets per rank, rank 1 on
// `rank_one_samples` samples (rank 0 on 8).
TwoRanks TrainTwoRanks(const VaryRank& vary, int64_t rank_one_samples = 8) {
  TwoRanks out;
  const absl::Status s = multi_rank::RunRanksAsThreads(2, [&](int rank, auto store) {
    auto engine = CpuDdpEngine(rank, store);
    if (!engine.ok()) return engine.status();
    proto::TrainingArguments args = testing::EquivalenceArgs(
        2, testing::TestTempDir(absl::StrCat("preflight_rank", rank)));
    std::string job = "model tiny data seq_len: 8";
    vary(rank, args, job);
    const int64_t samples = rank == 1 ? rank_one_samples : 8;
    testing::SgdTrainer trainer(args, testing::TinyDecoder(1),
                                testing::VariableLengthTokens(samples, 1), nullptr,
                                std::move(*engine));
    trainer.set_job_identity(job);
    out.results[rank] = trainer.Train().status();
    out.steps[rank] = trainer.state().global_step;
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

// Every rank's status must name rank 1 with `expected`, and no step may run.
void ExpectRankOneRefused(const VaryRank& vary, const std::string& expected,
                          int64_t rank_one_samples = 8) {
  const TwoRanks ran = TrainTwoRanks(vary, rank_one_samples);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_THAT(std::string(ran.results[rank].message()), HasSubstr(expected))
        << "rank " << rank;
    EXPECT_EQ(ran.steps[rank], 0) << "rank " << rank;
  }
}

TEST(TrainerPreflightTest, RanksWithDifferentArgumentsFailBeforeTheFirstStep) {
  ExpectRankOneRefused(
      [](int rank, proto::TrainingArguments& args, std::string&) {
        args.set_learning_rate(rank == 0 ? 0.5 : 0.25);  // rank 1 got another --set
      },
      "rank(s) 1 were started with other training arguments than rank 0");
}

TEST(TrainerPreflightTest, RanksWithAnotherDataConfigurationFailBeforeTheFirstStep) {
  ExpectRankOneRefused(
      [](int rank, proto::TrainingArguments&, std::string& job) {
        if (rank == 1) job = "model tiny data seq_len: 16";  // another job's data
      },
      "rank(s) 1 were started with another model or data configuration than rank 0");
}

// A stale copy of a data file on one node: same configuration text, fewer samples. Each rank
// would count other steps per epoch and leave the loop at another step than the rest.
TEST(TrainerPreflightTest, RanksWithAnotherDatasetSizeFailBeforeTheFirstStep) {
  ExpectRankOneRefused([](int, proto::TrainingArguments&, std::string&) {},
                       "rank(s) 1 see other datasets than rank 0 (samples, train / eval, -1 for "
                       "none: rank 0: 8 / -1, rank 1: 6 / -1)",
                       /*rank_one_samples=*/6);
}

// Rank 0 alone creates output_dir; when it cannot, every rank returns its error. It used to
// return before the preflight while rank 1 waited in the preflight's gather (here until the
// store's 30 s timeout; on NCCL until ddp_timeout).
TEST(TrainerPreflightTest, AnOutputDirRankZeroCannotCreateFailsEveryRank) {
  const std::string file = testing::TestTempDir("output_dir_blocker");
  std::error_code ignored;
  std::filesystem::remove(file, ignored);  // a file left by an earlier run
  { std::ofstream(file) << "a file, so no directory can be made under it"; }
  ASSERT_TRUE(std::filesystem::is_regular_file(file)) << file;
  const TwoRanks ran = TrainTwoRanks([&](int rank, proto::TrainingArguments& args, std::string&) {
    if (rank == 0) args.set_output_dir(file + "/out");
  });
  EXPECT_THAT(std::string(ran.results[0].message()), HasSubstr("/out\" cannot be created"));
  EXPECT_THAT(std::string(ran.results[1].message()),
              AllOf(HasSubstr("rank 0 failed"), HasSubstr("/out\" cannot be created")));
}

// eval_runtime and the rates read from it are the ranks' means, the same number on every rank:
// each rank's own clock made them differ, so a decision read from one (metric_for_best_model:
// eval_runtime with save_strategy BEST, early stopping) split the ranks.
TEST(TrainerEvalAgreementTest, TimingMetricsAreTheSameOnEveryRank) {
  std::vector<Metrics> metrics(2);
  const absl::Status s = multi_rank::RunRanksAsThreads(2, [&](int rank, auto store) {
    auto engine = CpuDdpEngine(rank, store);
    if (!engine.ok()) return engine.status();
    proto::TrainingArguments args = testing::EquivalenceArgs(
        2, testing::TestTempDir(absl::StrCat("eval_agreement_rank", rank)));
    testing::SgdTrainer trainer(args, testing::TinyDecoder(1), testing::VariableLengthTokens(8, 1),
                                testing::VariableLengthTokens(6, 2), std::move(*engine));
    absl::StatusOr<Metrics> m = trainer.Evaluate();
    if (!m.ok()) return m.status();
    metrics[rank] = *m;
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  for (const char* key : {"eval_runtime", "eval_samples_per_second", "eval_steps_per_second",
                          "eval_loss"}) {
    ASSERT_EQ(metrics[0].count(key), 1u) << key;
    EXPECT_EQ(metrics[0].at(key), metrics[1].at(key)) << key;
  }
  EXPECT_GT(metrics[0].at("eval_runtime"), 0);
}

}  // namespace
}  // namespace cpptrain
