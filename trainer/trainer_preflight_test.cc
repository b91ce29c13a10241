// Trainer::Preflight over two ranks (threads, the store communicator): ranks started with
// different training arguments all fail before the first step, naming the odd rank.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "engines/ddp/ddp_engine.h"
#include "sharding/store_communicator.h"
#include "sharding/testing/multi_rank.h"
#include "trainer/testing/trainer_testing.h"
#include "trainer/trainer.h"

namespace cpptrain {
namespace {

using ::testing::HasSubstr;

TEST(TrainerPreflightTest, RanksWithDifferentArgumentsFailBeforeTheFirstStep) {
  std::vector<absl::Status> results(2);
  std::vector<int64_t> steps(2, -1);
  const absl::Status s = multi_rank::RunRanksAsThreads(2, [&](int rank, auto store) {
    auto comm = StoreCommunicator::Create(store, rank, 2, std::chrono::seconds(30));
    if (!comm.ok()) return comm.status();
    auto engine = DdpEngine::Create(proto::DdpConfig(), MixedPrecision::kNone,
                                    c10::Device(c10::kCPU), std::move(*comm));
    if (!engine.ok()) return engine.status();
    proto::TrainingArguments args = testing::EquivalenceArgs(
        2, testing::TestTempDir(absl::StrCat("preflight_rank", rank)));
    args.set_learning_rate(rank == 0 ? 0.5 : 0.25);  // rank 1 got another --set
    testing::SgdTrainer trainer(args, testing::TinyDecoder(1), testing::VariableLengthTokens(8, 1),
                                nullptr, std::move(*engine));
    results[rank] = trainer.Train().status();
    steps[rank] = trainer.state().global_step;
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_THAT(std::string(results[rank].message()),
                HasSubstr("rank(s) 1 were started with other training arguments than rank 0"))
        << "rank " << rank;
    EXPECT_EQ(steps[rank], 0) << "rank " << rank;
  }
}

}  // namespace
}  // namespace cpptrain
