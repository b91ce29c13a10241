#include "engines/zero/zero_layout.h"

#include <algorithm>

namespace cpptrain {
namespace {

int64_t RoundUp(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

// Closes `bucket` at `end` (unpadded): pads it and records where this rank's part goes.
void CloseBucket(ZeroLayout& layout, ZeroLayout::Bucket& bucket, int64_t end, int64_t align) {
  const int64_t unit = align * layout.world;
  bucket.numel = std::max<int64_t>(unit, RoundUp(end - bucket.begin, unit));
  bucket.shard_numel = bucket.numel / layout.world;
  bucket.local_offset = layout.local_numel;
  layout.local_numel += bucket.shard_numel;
  const int64_t own_lo = bucket.begin + layout.rank * bucket.shard_numel;
  const int64_t own_hi = own_lo + bucket.shard_numel;
  for (int i : bucket.params) {
    ZeroLayout::Param& p = layout.params[i];
    const int64_t lo = std::max(p.offset, own_lo);
    const int64_t hi = std::min(p.offset + p.numel, own_hi);
    p.own_numel = std::max<int64_t>(0, hi - lo);
    p.own_begin = p.own_numel > 0 ? lo - p.offset : 0;
    p.local_offset = bucket.local_offset + (p.own_numel > 0 ? lo - own_lo : 0);
  }
  layout.total_numel = bucket.begin + bucket.numel;
  layout.buckets.push_back(std::move(bucket));
}

}  // namespace

ZeroLayout BuildZeroLayout(const std::vector<int64_t>& numels, int world, int rank,
                           int64_t bucket_numel, int64_t align) {
  ZeroLayout layout;
  layout.world = world;
  layout.rank = rank;
  layout.params.resize(numels.size());
  ZeroLayout::Bucket bucket;
  int64_t end = 0;  // unpadded end of the open bucket
  for (int i = static_cast<int>(numels.size()) - 1; i >= 0; --i) {
    const int64_t start = RoundUp(end, align);
    if (!bucket.params.empty() && start + numels[i] - bucket.begin > bucket_numel) {
      CloseBucket(layout, bucket, end, align);
      bucket = ZeroLayout::Bucket();
      bucket.begin = layout.total_numel;
      end = bucket.begin;
    }
    ZeroLayout::Param& p = layout.params[i];
    p.bucket = static_cast<int>(layout.buckets.size());
    p.offset = RoundUp(end, align);
    p.numel = numels[i];
    end = p.offset + p.numel;
    bucket.params.push_back(i);
  }
  if (!bucket.params.empty()) CloseBucket(layout, bucket, end, align);
  return layout;
}

}  // namespace cpptrain
