// Best-fit-decreasing packing of examples into rows of at most `max_length` tokens, as TRL's
// pack_dataset(strategy="bfd") does: empty examples are dropped, longer ones are truncated to
// max_length (their tail is lost, as in TRL), then the examples, longest first (ties in
// index order), each go into the open row whose free space is the smallest that still fits it
// (the oldest such row on a tie), or into a new row. TRL packs the dataset in chunks of
// `chunk_size` consecutive examples (datasets' map batch, 1000) and so does this: rows never
// mix examples of two chunks. Rows come out in the order they were opened, each listing its
// examples in the order they went in.
//
//   std::vector<PackedRow> rows = PackBestFitDecreasing({5, 2, 3, 1}, /*max_length=*/4);
//   // rows: {0 (4 of its 5 tokens)}, {2, 3}, {1}: TRL's docstring example.
#ifndef CPPTRAIN_TRAINER_DATA_BFD_PACKING_H_
#define CPPTRAIN_TRAINER_DATA_BFD_PACKING_H_

#include <cstdint>
#include <vector>

namespace cpptrain {

struct PackedRow {
  // Example indices, in the order they were placed.
  std::vector<int64_t> examples;
  // Tokens taken from each: min(length, max_length).
  std::vector<int64_t> lengths;
};

// max_length >= 1, chunk_size >= 1.
std::vector<PackedRow> PackBestFitDecreasing(const std::vector<int64_t>& lengths,
                                             int64_t max_length, int64_t chunk_size = 1000);

}  // namespace cpptrain

#endif  // CPPTRAIN_TRAINER_DATA_BFD_PACKING_H_
