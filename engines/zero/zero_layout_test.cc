#include "engines/zero/zero_layout.h"

#include <gtest/gtest.h>

#include <vector>

namespace cpptrain {
namespace {

// Every element of every parameter is owned by exactly one rank, at distinct local offsets.
TEST(ZeroLayoutTest, RanksPartitionEveryParameter) {
  const std::vector<int64_t> numels = {1000, 37, 4096, 3, 129};
  for (int world : {1, 2, 3, 4}) {
    std::vector<std::vector<int>> owner(numels.size());
    for (size_t i = 0; i < numels.size(); ++i) owner[i].assign(numels[i], -1);
    for (int rank = 0; rank < world; ++rank) {
      const ZeroLayout layout = BuildZeroLayout(numels, world, rank, 2048, 4);
      EXPECT_EQ(layout.total_numel % (world * 4), 0);
      EXPECT_EQ(layout.local_numel * world, layout.total_numel);
      std::vector<bool> local_used(layout.local_numel, false);
      for (size_t i = 0; i < numels.size(); ++i) {
        const ZeroLayout::Param& p = layout.params[i];
        EXPECT_EQ(p.offset % 4, 0);
        for (int64_t e = 0; e < p.own_numel; ++e) {
          EXPECT_EQ(owner[i][p.own_begin + e], -1) << "element owned twice";
          owner[i][p.own_begin + e] = rank;
          EXPECT_FALSE(local_used[p.local_offset + e]);
          local_used[p.local_offset + e] = true;
          // The flat position of this element lies in this rank's part of its bucket.
          const int64_t flat = p.offset + p.own_begin + e;
          const int64_t own = layout.OwnedBegin(p.bucket, rank);
          EXPECT_GE(flat, own);
          EXPECT_LT(flat, own + layout.buckets[p.bucket].shard_numel);
          EXPECT_EQ(p.local_offset + e - layout.buckets[p.bucket].local_offset, flat - own);
        }
      }
    }
    for (size_t i = 0; i < numels.size(); ++i) {
      for (int o : owner[i]) EXPECT_GE(o, 0) << "world " << world << " param " << i;
    }
  }
}

TEST(ZeroLayoutTest, BucketsFollowGradientOrderAndCap) {
  const ZeroLayout layout = BuildZeroLayout({1000, 37, 4096, 3}, 2, 0, 2048, 4);
  // Reverse order: 3 then 4096 (over the cap: closes the first bucket), then 37 and 1000.
  ASSERT_EQ(layout.buckets.size(), 3u);
  EXPECT_EQ(layout.buckets[0].params, std::vector<int>({3}));
  EXPECT_EQ(layout.buckets[1].params, std::vector<int>({2}));
  EXPECT_EQ(layout.buckets[2].params, std::vector<int>({1, 0}));
  EXPECT_EQ(layout.params[3].offset, 0);
  EXPECT_EQ(layout.buckets[1].begin, layout.buckets[0].numel);
  EXPECT_EQ(layout.buckets[0].numel, 8);  // 3 padded to world * align
}

}  // namespace
}  // namespace cpptrain
