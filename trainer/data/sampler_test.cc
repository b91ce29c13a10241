#include "trainer/data/sampler.h"

#include <algorithm>
#include <numeric>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace cpptrain {
namespace {

using ::testing::HasSubstr;
using Batches = std::vector<std::vector<int64_t>>;

SamplerOptions Options(int64_t batch_size, int64_t rank = 0, int64_t world_size = 1) {
  SamplerOptions options;
  options.batch_size = batch_size;
  options.rank = rank;
  options.world_size = world_size;
  return options;
}

Batches BatchesFor(int64_t n, SamplerOptions options, int64_t epoch = 0) {
  absl::StatusOr<DistributedSampler> sampler = DistributedSampler::Create(n, options);
  EXPECT_TRUE(sampler.ok()) << sampler.status();
  if (!sampler.ok()) return {};
  sampler->SetEpoch(epoch);
  return sampler->Batches();
}

std::vector<int64_t> Flatten(const Batches& batches) {
  std::vector<int64_t> out;
  for (const auto& b : batches) out.insert(out.end(), b.begin(), b.end());
  return out;
}

TEST(LengthGroupedOrderTest, SortsEachMegabatchAndPutsTheLongestFirst) {
  // 10 samples, batch 2: megabatches of max(1, min(10 / 8, 50)) * 2 = 2, each longest first
  // ([1,0] [3,2] [4,5] [6,7] [9,8]); the longest head (3, length 9) swaps with the first.
  const std::vector<int64_t> lengths = {1, 5, 2, 9, 3, 3, 7, 0, 4, 6};
  std::vector<int64_t> order(10);
  std::iota(order.begin(), order.end(), 0);
  EXPECT_EQ(LengthGroupedOrder(order, lengths, 2),
            (std::vector<int64_t>{3, 0, 1, 2, 4, 5, 6, 7, 9, 8}));
  // 400 samples of batch 2: megabatches of 50 * 2.
  std::vector<int64_t> many(400), many_lengths(400);
  std::iota(many.begin(), many.end(), 0);
  for (int64_t i = 0; i < 400; ++i) many_lengths[i] = (i * 37) % 101;
  const std::vector<int64_t> grouped = LengthGroupedOrder(many, many_lengths, 2);
  EXPECT_TRUE(std::is_permutation(grouped.begin(), grouped.end(), many.begin()));
  for (int64_t i = 101; i < 200; ++i) {
    EXPECT_GE(many_lengths[grouped[i - 1]], many_lengths[grouped[i]]) << i;
  }
  EXPECT_EQ(many_lengths[grouped[0]], 100);
}

TEST(DistributedSamplerTest, GroupLengthsGroupTheShuffledOrder) {
  SamplerOptions options;
  options.batch_size = 2;
  options.seed = 5;
  std::vector<int64_t> lengths(40);
  for (int64_t i = 0; i < 40; ++i) lengths[i] = i % 7;
  options.group_lengths = lengths;
  options.group_batch_size = 2;
  auto sampler = DistributedSampler::Create(40, options);
  ASSERT_TRUE(sampler.ok()) << sampler.status();
  sampler->SetEpoch(1);
  int64_t sorted_pairs = 0;
  for (const auto& batch : sampler->Batches())
    sorted_pairs += lengths[batch[0]] >= lengths[batch[1]];
  EXPECT_EQ(sorted_pairs, 20);  // megabatches of 5 * 2, each longest first
}

TEST(DistributedSamplerTest, ShuffleIsSeededBySeedAndEpoch) {
  SamplerOptions options = Options(/*batch_size=*/100);
  options.seed = 5;
  const std::vector<int64_t> a = Flatten(BatchesFor(100, options, 0));
  EXPECT_EQ(a, Flatten(BatchesFor(100, options, 0)));
  EXPECT_NE(a, Flatten(BatchesFor(100, options, 1)));
  std::vector<int64_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> iota(100);
  std::iota(iota.begin(), iota.end(), 0);
  EXPECT_EQ(sorted, iota);
  EXPECT_NE(a, iota);
  options.seed = 6;
  EXPECT_NE(a, Flatten(BatchesFor(100, options, 0)));

  options.shuffle = false;
  EXPECT_EQ(Flatten(BatchesFor(100, options, 3)), iota);
}

TEST(DistributedSamplerTest, UnevenSizeGivesEqualBatchCountsAndMarksRepeats) {
  // 10 samples, 3 ranks, batch 2: one global step is 6, so 12 samples with 2 repeats.
  std::vector<int64_t> gathered;
  std::vector<Batches> per_rank;
  for (int64_t rank = 0; rank < 3; ++rank) {
    SamplerOptions options = Options(2, rank, 3);
    options.shuffle = true;
    absl::StatusOr<DistributedSampler> sampler = DistributedSampler::Create(10, options);
    ASSERT_TRUE(sampler.ok());
    EXPECT_EQ(sampler->num_batches(), 2);
    EXPECT_EQ(sampler->num_samples_padded(), 12);
    EXPECT_EQ(sampler->num_padding_samples(), 2);
    EXPECT_EQ(sampler->rank_padding_samples(), rank == 0 ? 0 : (rank == 1 ? 0 : 2));
    per_rank.push_back(sampler->Batches());
    ASSERT_EQ(per_rank.back().size(), 2u);
    for (const auto& batch : per_rank.back()) EXPECT_EQ(batch.size(), 2u);
  }
  // Gathering each step's batches in rank order and dropping the trailing repeats gives
  // every sample exactly once.
  for (size_t step = 0; step < 2; ++step) {
    for (const Batches& batches : per_rank) {
      gathered.insert(gathered.end(), batches[step].begin(), batches[step].end());
    }
  }
  gathered.resize(10);
  std::sort(gathered.begin(), gathered.end());
  std::vector<int64_t> iota(10);
  std::iota(iota.begin(), iota.end(), 0);
  EXPECT_EQ(gathered, iota);
}

TEST(DistributedSamplerTest, SequentialAssignmentFollowsAccelerate) {
  // Without shuffling: batch k of the global list goes to rank k % world_size, and the tail
  // is filled by cycling from the start.
  std::vector<Batches> expected = {{{0, 1}, {6, 7}}, {{2, 3}, {8, 9}}, {{4, 5}, {0, 1}}};
  for (int64_t rank = 0; rank < 3; ++rank) {
    SamplerOptions options = Options(2, rank, 3);
    options.shuffle = false;
    EXPECT_EQ(BatchesFor(10, options), expected[rank]) << "rank " << rank;
    options.split_batches = true;
    options.batch_size = 6;
    EXPECT_EQ(BatchesFor(10, options), expected[rank]) << "split, rank " << rank;
  }
}

TEST(DistributedSamplerTest, DropLastAndUnevenBatches) {
  for (int64_t rank = 0; rank < 3; ++rank) {
    SamplerOptions options = Options(2, rank, 3);
    options.shuffle = false;
    options.drop_last = true;
    EXPECT_EQ(BatchesFor(10, options), (Batches{{2 * rank, 2 * rank + 1}}));
    absl::StatusOr<DistributedSampler> sampler = DistributedSampler::Create(10, options);
    ASSERT_TRUE(sampler.ok());
    EXPECT_EQ(sampler->num_samples_padded(), 6);
    EXPECT_EQ(sampler->num_padding_samples(), 0);
  }
  // Neither drop_last nor even_batches: the last step is left short, as in Accelerate.
  std::vector<Batches> expected = {{{0, 1}, {6, 7}}, {{2, 3}, {8, 9}}, {{4, 5}}};
  for (int64_t rank = 0; rank < 3; ++rank) {
    SamplerOptions options = Options(2, rank, 3);
    options.shuffle = false;
    options.even_batches = false;
    absl::StatusOr<DistributedSampler> sampler = DistributedSampler::Create(10, options);
    ASSERT_TRUE(sampler.ok());
    EXPECT_EQ(sampler->Batches(), expected[rank]);
    EXPECT_EQ(sampler->num_batches(), static_cast<int64_t>(expected[rank].size()));
    EXPECT_EQ(sampler->num_samples_padded(), 10);
  }
}

TEST(DistributedSamplerTest, DatasetSmallerThanOneStepIsCycled) {
  SamplerOptions options = Options(4, 1, 2);
  options.shuffle = false;
  absl::StatusOr<DistributedSampler> sampler = DistributedSampler::Create(3, options);
  ASSERT_TRUE(sampler.ok());
  EXPECT_EQ(sampler->Batches(), (Batches{{1, 2, 0, 1}}));
  EXPECT_EQ(sampler->rank_padding_samples(), 4);
  options.rank = 0;
  sampler = DistributedSampler::Create(3, options);
  ASSERT_TRUE(sampler.ok());
  EXPECT_EQ(sampler->Batches(), (Batches{{0, 1, 2, 0}}));
  EXPECT_EQ(sampler->rank_padding_samples(), 1);
}

// (dataset size, world size, batch size, split_batches, drop_last, even_batches)
class ShardingTest
    : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, int64_t, bool, bool, bool>> {};

TEST_P(ShardingTest, RanksAreDisjointCoverEverythingAndAgreeOnCounts) {
  const auto [n, world, batch, split, drop_last, even] = GetParam();
  // Combinations the sampler must refuse: a split batch that the ranks cannot share evenly, or
  // drop_last with fewer samples than one global batch.
  if ((split && batch % world != 0) || (drop_last && n < (split ? batch : batch * world))) {
    SamplerOptions options = Options(batch, 0, world);
    options.split_batches = split;
    options.drop_last = drop_last;
    options.even_batches = even;
    EXPECT_FALSE(DistributedSampler::Create(n, options).ok());
    return;
  }
  std::multiset<int64_t> real;  // Samples excluding the repeats.
  int64_t repeats = 0;
  int64_t yielded = 0;
  std::set<int64_t> batch_counts;
  int64_t padded = 0;
  for (int64_t rank = 0; rank < world; ++rank) {
    SamplerOptions options = Options(batch, rank, world);
    options.split_batches = split;
    options.drop_last = drop_last;
    options.even_batches = even;
    options.seed = 11;
    absl::StatusOr<DistributedSampler> sampler = DistributedSampler::Create(n, options);
    ASSERT_TRUE(sampler.ok()) << sampler.status();
    sampler->SetEpoch(2);
    const Batches batches = sampler->Batches();
    ASSERT_EQ(static_cast<int64_t>(batches.size()), sampler->num_batches());
    batch_counts.insert(sampler->num_batches());
    padded = sampler->num_samples_padded();
    std::vector<int64_t> flat = Flatten(batches);
    yielded += static_cast<int64_t>(flat.size());
    if ((even && world > 1) || drop_last) {
      for (const auto& b : batches) {
        EXPECT_EQ(static_cast<int64_t>(b.size()), sampler->rank_batch_size());
      }
    }
    repeats += sampler->rank_padding_samples();
    flat.resize(flat.size() - sampler->rank_padding_samples());
    real.insert(flat.begin(), flat.end());
  }
  EXPECT_EQ(yielded, padded);
  std::set<int64_t> distinct(real.begin(), real.end());
  EXPECT_EQ(distinct.size(), real.size()) << "a sample reached two ranks";
  if (drop_last) {
    const int64_t global = split ? batch : batch * world;
    EXPECT_EQ(static_cast<int64_t>(real.size()), n / global * global);
    EXPECT_EQ(repeats, 0);
  } else {
    EXPECT_EQ(static_cast<int64_t>(real.size()), n);
    EXPECT_EQ(*distinct.begin(), 0);
    EXPECT_EQ(*distinct.rbegin(), n - 1);
  }
  if (even || drop_last) {
    EXPECT_EQ(batch_counts.size(), 1u) << "ranks disagree on the number of batches";
    EXPECT_EQ(repeats, padded - static_cast<int64_t>(real.size()));
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, ShardingTest,
                         ::testing::Combine(::testing::Values(1, 7, 10, 24, 101),
                                            ::testing::Values(1, 2, 3, 4),
                                            ::testing::Values(1, 2, 4, 6), ::testing::Bool(),
                                            ::testing::Bool(), ::testing::Bool()));

TEST(DistributedSamplerTest, RejectsBadOptionsNamingValues) {
  auto error_of = [](int64_t n, SamplerOptions options) {
    absl::StatusOr<DistributedSampler> s = DistributedSampler::Create(n, options);
    return s.ok() ? std::string("ok") : std::string(s.status().message());
  };
  EXPECT_THAT(error_of(0, Options(2)), HasSubstr("0 samples"));
  EXPECT_THAT(error_of(10, Options(0)), HasSubstr("batch_size is 0"));
  EXPECT_THAT(error_of(10, Options(2, 3, 3)), HasSubstr("rank 3 with world_size 3"));
  SamplerOptions split = Options(5, 0, 3);
  split.split_batches = true;
  EXPECT_THAT(error_of(10, split), HasSubstr("batch_size 5 is not divisible by world_size 3"));
  SamplerOptions drop = Options(4, 0, 2);
  drop.drop_last = true;
  const std::string message = error_of(7, drop);
  EXPECT_THAT(message, HasSubstr("7 samples is shorter than one global batch of 8"));
  EXPECT_THAT(message, HasSubstr("set drop_last=false"));
}

}  // namespace
}  // namespace cpptrain
