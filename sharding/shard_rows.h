// How FullyShard splits dim 0 of a tensor over shard ranks, for everything that must agree with
// it (FullyShard itself, checkpoint manifests, the checkpoint converter): every rank gets a
// chunk of ceil(rows / shards) rows, the last ranks' chunks shorter or empty.
//
//   RowRange mine = ShardRowRange(/*rows=*/8, /*shards=*/3, /*shard=*/2);   // rows [6, 8)
#ifndef CPPTRAIN_SHARDING_SHARD_ROWS_H_
#define CPPTRAIN_SHARDING_SHARD_ROWS_H_

#include <algorithm>
#include <cstdint>

namespace cpptrain {

// Rows [begin, end) of dim 0.
struct RowRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t rows() const { return end - begin; }
};

// Rows per chunk, padded: ceil(rows / shards).
inline int64_t ShardChunkRows(int64_t rows, int shards) { return (rows + shards - 1) / shards; }

// Shard `shard` of `shards` holds [min(rows, shard * chunk), min(rows, (shard + 1) * chunk)).
inline RowRange ShardRowRange(int64_t rows, int shards, int shard) {
  const int64_t chunk = ShardChunkRows(rows, shards);
  const int64_t begin = std::min(rows, shard * chunk);
  return {begin, std::min(rows, begin + chunk)};
}

}  // namespace cpptrain

#endif  // CPPTRAIN_SHARDING_SHARD_ROWS_H_
