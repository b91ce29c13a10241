#include "generation/sampling.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace cpptrain {
namespace {

// The tokens and probabilities the filters keep, from their definitions (independently of
// FilterLogits): scores / temperature; the top_k highest; then the smallest most-probable set
// whose cumulative probability reaches top_p. In double.
std::vector<double> ExpectedProbs(const std::vector<double>& logits, const SamplingOptions& o) {
  const size_t n = logits.size();
  std::vector<double> scores(n);
  for (size_t i = 0; i < n; ++i) scores[i] = logits[i] / o.temperature;
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return scores[a] > scores[b]; });
  std::vector<bool> kept(n, true);
  if (o.top_k > 0) {
    for (size_t r = static_cast<size_t>(o.top_k); r < n; ++r) kept[order[r]] = false;
  }
  auto softmax = [&] {
    std::vector<double> p(n, 0.0);
    double max = -std::numeric_limits<double>::infinity();
    for (size_t i = 0; i < n; ++i) {
      if (kept[i]) max = std::max(max, scores[i]);
    }
    double sum = 0;
    for (size_t i = 0; i < n; ++i) {
      if (kept[i]) sum += p[i] = std::exp(scores[i] - max);
    }
    for (double& x : p) x /= sum;
    return p;
  };
  if (o.top_p < 1) {
    const std::vector<double> p = softmax();
    double cumulative = 0;
    size_t r = 0;
    for (; r < n && kept[order[r]]; ++r) {
      cumulative += p[order[r]];
      if (cumulative >= o.top_p) break;
    }
    for (size_t s = r + 1; s < n; ++s) kept[order[s]] = false;
  }
  return softmax();
}

// 12 logits with well-separated probabilities (no ties, no cumulative sum near a top_p).
const std::vector<double> kLogits = {2.0, -1.0, 0.5, 3.1, 1.2, -0.3,
                                     2.6, 0.1,  -2.0, 1.7, 0.8, -0.7};

at::Tensor LogitsRows(int64_t rows) {
  return at::tensor(kLogits, at::kDouble).to(at::kFloat).unsqueeze(0).expand({rows, -1});
}

// Draws 40,000 tokens with a fixed seed: every one inside the allowed set and each token's
// frequency within 0.01 of its filtered softmax probability (the largest standard deviation of
// a frequency here is sqrt(0.25 / 40000) = 0.0025: 4 sigma; the seed is fixed, so the test
// cannot flake).
TEST(SamplingTest, FrequenciesMatchTheFilteredSoftmax) {
  const int64_t draws = 40000;
  std::vector<SamplingOptions> cases(5);
  cases[1].temperature = 0.7;
  cases[2].top_k = 4;
  cases[3].top_p = 0.8;
  cases[4].temperature = 1.5;
  cases[4].top_k = 6;
  cases[4].top_p = 0.7;
  for (const SamplingOptions& options : cases) {
    const std::string what = "temperature " + std::to_string(options.temperature) + " top_k " +
                             std::to_string(options.top_k) + " top_p " +
                             std::to_string(options.top_p);
    const std::vector<double> expected = ExpectedProbs(kLogits, options);
    at::Generator generator = MakeSamplingGenerator(7);
    const at::Tensor tokens = SampleTokens(LogitsRows(draws), options, generator);
    ASSERT_EQ(tokens.sizes(), (std::vector<int64_t>{draws}));
    std::vector<int64_t> counts(kLogits.size(), 0);
    const int64_t* ids = tokens.data_ptr<int64_t>();
    for (int64_t i = 0; i < draws; ++i) {
      ASSERT_GE(ids[i], 0);
      ASSERT_LT(ids[i], static_cast<int64_t>(kLogits.size()));
      ++counts[ids[i]];
    }
    int allowed = 0;
    for (size_t t = 0; t < kLogits.size(); ++t) {
      const double frequency = static_cast<double>(counts[t]) / draws;
      if (expected[t] == 0) {
        EXPECT_EQ(counts[t], 0) << what << ": token " << t << " is filtered out";
      } else {
        ++allowed;
        EXPECT_NEAR(frequency, expected[t], 0.01) << what << ": token " << t;
      }
    }
    if (options.top_k > 0) {
      EXPECT_LE(allowed, options.top_k) << what;
    }
    if (options.top_p < 1 || options.top_k > 0) {
      EXPECT_LT(allowed, static_cast<int>(kLogits.size())) << what << ": the filter removes some";
    }
  }
}

TEST(SamplingTest, TopPKeepsAtLeastTheMostLikelyToken) {
  SamplingOptions options;
  options.top_p = 1e-6;
  const at::Tensor scores = FilterLogits(LogitsRows(1), options);
  EXPECT_EQ(at::isfinite(scores).sum().item<int64_t>(), 1);
  EXPECT_TRUE(at::isfinite(scores[0][3]).item<bool>());  // 3.1, the highest
}

TEST(SamplingTest, TopKOneIsGreedy) {
  at::manual_seed(3);
  const at::Tensor logits = at::randn({64, 50});
  SamplingOptions options;
  options.top_k = 1;
  options.temperature = 0.6;
  at::Generator generator = MakeSamplingGenerator(11);
  EXPECT_TRUE(at::equal(SampleTokens(logits, options, generator), GreedyTokens(logits)));
}

TEST(SamplingTest, SameSeedSameTokensOtherSeedOthers) {
  at::manual_seed(4);
  const at::Tensor logits = at::randn({32, 50});
  auto draw = [&](uint64_t seed) {
    at::Generator generator = MakeSamplingGenerator(seed);
    // Two steps from one generator, as a generation loop draws them.
    return at::cat({SampleTokens(logits, {}, generator), SampleTokens(logits, {}, generator)});
  };
  EXPECT_TRUE(at::equal(draw(5), draw(5)));
  EXPECT_FALSE(at::equal(draw(5), draw(6)));
}

TEST(SamplingTest, ValidationNamesTheValue) {
  SamplingOptions options;
  EXPECT_TRUE(ValidateSamplingOptions(options).ok());
  options.temperature = 0;
  EXPECT_NE(ValidateSamplingOptions(options).message().find("temperature is 0"),
            std::string::npos);
  options = {};
  options.top_k = -1;
  EXPECT_NE(ValidateSamplingOptions(options).message().find("top_k is -1"), std::string::npos);
  options = {};
  options.top_p = 1.5;
  EXPECT_NE(ValidateSamplingOptions(options).message().find("top_p is 1.5"), std::string::npos);
  options.top_p = 0;
  EXPECT_FALSE(ValidateSamplingOptions(options).ok());
}

}  // namespace
}  // namespace cpptrain
