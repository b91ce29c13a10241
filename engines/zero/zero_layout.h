// The flat layout of ZeRO stages 1 and 2 (Megatron's distributed-optimizer layout): every
// trainable parameter gets a range of one flat buffer, in the order backward produces their
// gradients (reverse registration), each start aligned. The buffer is cut into buckets at
// parameter boundaries (a bucket closes once it would exceed `bucket_numel`; a larger
// parameter is a bucket alone), each padded to a multiple of world * alignment, and every
// bucket is split evenly: rank r owns the r-th 1/N of each bucket. Gradients of a bucket are
// one reduce-scatter, updated parameters one all-gather, and a rank's owned parts of all
// buckets, side by side, are its `local_numel` elements of optimizer state. A parameter lies in
// one bucket, so a rank owns one contiguous range of it (possibly empty).
//
//   ZeroLayout layout = BuildZeroLayout({1000, 37, 4096}, /*world=*/3, /*rank=*/1,
//                                       /*bucket_numel=*/2048, /*align=*/4);
//   const ZeroLayout::Param& p = layout.params[2];   // in the caller's order
//   // rank 1 owns elements [p.own_begin, p.own_begin + p.own_numel) of parameter 2,
//   // at [p.local_offset, ...) of its optimizer buffer.
#ifndef CPPTRAIN_ENGINES_ZERO_ZERO_LAYOUT_H_
#define CPPTRAIN_ENGINES_ZERO_ZERO_LAYOUT_H_

#include <cstdint>
#include <vector>

namespace cpptrain {

struct ZeroLayout {
  struct Param {
    int bucket = 0;
    int64_t offset = 0;  // start in the flat buffer
    int64_t numel = 0;
    // This rank's part: elements [own_begin, own_begin + own_numel) of the flattened
    // parameter, at [local_offset, local_offset + own_numel) of the rank's local buffer.
    int64_t own_begin = 0;
    int64_t own_numel = 0;
    int64_t local_offset = 0;
  };
  struct Bucket {
    int64_t begin = 0;         // start in the flat buffer
    int64_t numel = 0;         // padded: a multiple of world * align
    int64_t shard_numel = 0;   // numel / world: each rank's part
    int64_t local_offset = 0;  // where this rank's part sits in its local buffer
    std::vector<int> params;   // indices into `params`, in flat order
  };

  int world = 1;
  int rank = 0;
  std::vector<Param> params;    // the caller's order
  std::vector<Bucket> buckets;  // flat order: gradient-ready order, launch order
  int64_t total_numel = 0;      // the flat buffer, padded
  int64_t local_numel = 0;      // total_numel / world

  // Elements [begin, begin + shard_numel) of the flat buffer that `rank` owns in bucket b.
  int64_t OwnedBegin(int b, int of_rank) const {
    return buckets[b].begin + of_rank * buckets[b].shard_numel;
  }
};

// `numels[i]` is parameter i's element count; the flat buffer holds them in reverse order
// (the last registered parameter's gradient is ready first). bucket_numel and align are
// element counts (both at least 1).
ZeroLayout BuildZeroLayout(const std::vector<int64_t>& numels, int world, int rank,
                           int64_t bucket_numel, int64_t align);

}  // namespace cpptrain

#endif  // CPPTRAIN_ENGINES_ZERO_ZERO_LAYOUT_H_
