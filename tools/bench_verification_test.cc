#include "tools/bench_verification.h"

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <memory>

#include "engines/engine_factory.h"
#include "models/configs.h"
#include "models/decoder.h"

namespace cpptrain {
namespace {

TEST(MarkovTokensTest, EachSampleIsFixedAndFollowsItsSuccessorsThreeTimesInFour) {
  const MarkovTokens data(10, 4096, 151936);
  ASSERT_EQ(data.successors().size(), 512u);
  std::vector<int64_t> sorted = data.successors();
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 512; ++i) ASSERT_EQ(sorted[i], i) << "not a permutation";
  const at::Tensor ids = data.Get(3).inputs;
  EXPECT_TRUE(ids.equal(data.Get(3).inputs));
  EXPECT_FALSE(ids.equal(data.Get(4).inputs));
  EXPECT_LT(ids.max().item<int64_t>(), 512);
  EXPECT_GE(ids.min().item<int64_t>(), 0);
  int64_t follows = 0;
  for (int64_t t = 1; t < ids.size(0); ++t) {
    follows += ids[t].item<int64_t>() == data.successors()[ids[t - 1].item<int64_t>()];
  }
  // P(follow) = 0.75 + 0.25 / 512; 4095 draws: a standard deviation of 0.0068.
  EXPECT_NEAR(static_cast<double>(follows) / 4095, 0.75, 0.03);
  // Another dataset object, another run: the same chain.
  EXPECT_EQ(MarkovTokens(1, 8, 151936).successors(), data.successors());
}

TEST(MarkovTokensTest, ASmallVocabularyIsTheWholeChain) {
  const MarkovTokens data(2, 64, 64);
  EXPECT_EQ(data.successors().size(), 64u);
  EXPECT_LT(data.Get(1).inputs.max().item<int64_t>(), 64);
}

TEST(RandomTokensTest, TheSameIdsAsEarlierInitDirectoriesHold) {
  const RandomTokens data(4, 16, 1000);
  const at::Tensor expected = torch::randint(
      1000, {16}, at::make_generator<at::CPUGeneratorImpl>(uint64_t{2}), torch::kLong);
  EXPECT_TRUE(data.Get(2).inputs.equal(expected));
}

TEST(ParameterSquareSumTest, SumsEveryParameterOnceInFp64) {
  absl::StatusOr<proto::DecoderConfig> config = NamedDecoderConfig("tiny");
  ASSERT_TRUE(config.ok()) << config.status();
  torch::manual_seed(0);
  auto model = std::make_shared<DecoderLM>(*config);
  proto::TrainingArguments args;
  args.mutable_local()->set_device("cpu");
  absl::StatusOr<std::unique_ptr<Engine>> engine = CreateEngine(args);
  ASSERT_TRUE(engine.ok()) << engine.status();
  double expected = 0;
  std::vector<const void*> seen;
  for (const auto& item : model->named_parameters(/*recurse=*/true)) {
    const void* impl = item.value().unsafeGetTensorImpl();
    if (std::find(seen.begin(), seen.end(), impl) != seen.end()) continue;
    seen.push_back(impl);
    expected += item.value().to(at::kDouble).square().sum().item<double>();
  }
  absl::StatusOr<double> sum = ParameterSquareSum(*model, **engine);
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_NEAR(*sum, expected, 1e-9 * expected);
  // A step that moves one weight by 0.01 moves the sum by about 2 * 0.01 * w + 1e-4.
  {
    torch::NoGradGuard no_grad;
    model->named_parameters(true)[0].value().view(-1)[0].add_(0.01);
  }
  absl::StatusOr<double> moved = ParameterSquareSum(*model, **engine);
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_NE(*moved, *sum);
}

}  // namespace
}  // namespace cpptrain
