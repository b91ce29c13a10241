#include "trainer/data/bfd_packing.h"

#include <gtest/gtest.h>

#include <vector>

namespace cpptrain {
namespace {

using Ids = std::vector<int64_t>;

// TRL's pack_dataset docstring: lengths 5, 2, 3, 1 into rows of 4 give [[0], [2, 3], [1]],
// the 5-token example truncated to 4.
TEST(BfdPackingTest, TrlDocstringExample) {
  const std::vector<PackedRow> rows = PackBestFitDecreasing({5, 2, 3, 1}, 4);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].examples, Ids({0}));
  EXPECT_EQ(rows[0].lengths, Ids({4}));
  EXPECT_EQ(rows[1].examples, Ids({2, 3}));
  EXPECT_EQ(rows[1].lengths, Ids({3, 1}));
  EXPECT_EQ(rows[2].examples, Ids({1}));
}

// Best fit, not first fit: 3 goes to the row with 3 free (not the older one with 5 free), and
// equal lengths keep their index order; empty examples are dropped.
TEST(BfdPackingTest, BestFitAndStableOrder) {
  // Lengths 5, 7, 0, 3, 3 into rows of 10: 7 -> row 0 (3 free), 5 -> row 1 (5 free),
  // 3 (index 3) -> row 0 (exact fit), 3 (index 4) -> row 1.
  const std::vector<PackedRow> rows = PackBestFitDecreasing({5, 7, 0, 3, 3}, 10);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].examples, Ids({1, 3}));
  EXPECT_EQ(rows[1].examples, Ids({0, 4}));
}

TEST(BfdPackingTest, OldestRowWinsATieAndChunksDoNotMix) {
  // 4, 4 open two rows with 2 free each; 2 then fills the older one.
  const std::vector<PackedRow> rows = PackBestFitDecreasing({4, 4, 2}, 6);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].examples, Ids({0, 2}));
  EXPECT_EQ(rows[1].examples, Ids({1}));
  // In chunks of 2, example 2 starts a chunk of its own and cannot join row 0.
  const std::vector<PackedRow> chunked = PackBestFitDecreasing({4, 4, 2}, 6, /*chunk_size=*/2);
  ASSERT_EQ(chunked.size(), 3u);
  EXPECT_EQ(chunked[2].examples, Ids({2}));
}

}  // namespace
}  // namespace cpptrain
