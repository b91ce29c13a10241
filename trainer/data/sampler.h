// Which dataset indices each rank reads in one epoch, following Hugging Face Accelerate's
// BatchSamplerShard. The epoch's order (a torch::randperm seeded with seed + epoch, or
// 0..N-1) is identical on every process; it is cut into global steps of G indices, and rank r
// takes the r-th contiguous block of each step:
//
//   G = batch_size * world_size        (split_batches = false: batch_size is per rank)
//   G = batch_size                     (split_batches = true: the global batch is split)
//   b = G / world_size                 (the per-rank batch)
//   step s, rank r -> order[s*G + r*b, s*G + (r+1)*b)
//
// This is Accelerate's assignment: without split_batches, batch k of the global list goes to
// rank k % world_size. The tail, when N is not a multiple of G:
//   drop_last:               the incomplete step is dropped.
//   even_batches (default):  the list is extended by cycling from its start, order[i % N],
//                            to a multiple of G. Every rank then has the same number of full
//                            batches; the repeats sit at the end of the last batches (see
//                            rank_padding_samples) so evaluation can drop them.
//   neither:                 the last step is left short: some ranks get a partial batch or
//                            one batch fewer (as in Accelerate; collectives must cope).
//
//   SamplerOptions options;
//   options.batch_size = 8;
//   options.rank = 1;
//   options.world_size = 4;
//   CT_ASSIGN_OR_RETURN(DistributedSampler sampler,
//                       DistributedSampler::Create(ds->size(), options));
//   sampler.SetEpoch(epoch);
//   for (const std::vector<int64_t>& batch : sampler.Batches()) ...
#ifndef CPPTRAIN_TRAINER_DATA_SAMPLER_H_
#define CPPTRAIN_TRAINER_DATA_SAMPLER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace cpptrain {

struct SamplerOptions {
  // Samples per batch on each rank; with split_batches, samples per global batch.
  int64_t batch_size = 1;
  bool shuffle = true;
  uint64_t seed = 0;
  bool drop_last = false;
  int64_t rank = 0;
  int64_t world_size = 1;
  bool even_batches = true;
  bool split_batches = false;
  // group_by_length (Hugging Face's LengthGroupedSampler): with a length per sample, the
  // shuffled order is cut into megabatches of min(N / (4 * group_batch_size), 50) (at least
  // 1) times group_batch_size samples, each sorted longest first, and the longest megabatch
  // head is swapped to the front (an out-of-memory error shows on the first step). Empty: off.
  std::vector<int64_t> group_lengths;
  int64_t group_batch_size = 1;
};

// The length-grouped order of `order` (above); `lengths` is indexed by sample.
std::vector<int64_t> LengthGroupedOrder(std::vector<int64_t> order,
                                        const std::vector<int64_t>& lengths, int64_t batch_size);

class DistributedSampler {
 public:
  // Fails on an empty dataset, batch_size or world_size < 1, rank outside [0, world_size),
  // batch_size not divisible by world_size with split_batches, or (with drop_last) a dataset
  // shorter than one global batch.
  static absl::StatusOr<DistributedSampler> Create(int64_t dataset_size,
                                                   const SamplerOptions& options);

  // Selects the epoch; the shuffle is seeded with seed + epoch. The epoch is 0 until set.
  void SetEpoch(int64_t epoch);
  int64_t epoch() const { return epoch_; }

  // This rank's batches for the current epoch, in order, each a list of dataset indices.
  std::vector<std::vector<int64_t>> Batches() const;

  // Batches on this rank this epoch. Identical on every rank with drop_last or even_batches.
  int64_t num_batches() const;
  // Batches on the rank with the most this epoch (rank 0): the global steps.
  int64_t max_num_batches() const { return num_steps(); }
  // Samples in a full batch on this rank (b above).
  int64_t rank_batch_size() const { return rank_batch_size_; }
  // Samples per optimizer-step across all ranks (G above).
  int64_t global_batch_size() const { return global_batch_size_; }
  int64_t dataset_size() const { return dataset_size_; }
  // Samples yielded this epoch summed over ranks, repeats included: a multiple of G with
  // even_batches or drop_last, the dataset size otherwise.
  int64_t num_samples_padded() const;
  // How many of those are repeats: num_samples_padded() - dataset_size() with even_batches,
  // else 0. When every rank's batches of each step are gathered in rank order, the repeats
  // are the last num_padding_samples() samples of the gathered epoch.
  int64_t num_padding_samples() const;
  // How many samples at the end of this rank's last batch are repeats (0 <= n <= b).
  int64_t rank_padding_samples() const;

 private:
  DistributedSampler(int64_t dataset_size, const SamplerOptions& options);

  // Global steps this epoch; the last may be partial without even_batches or drop_last.
  int64_t num_steps() const;
  // Whether even_batches repeats samples here (only with more than one rank).
  bool pads() const;

  int64_t dataset_size_;
  SamplerOptions options_;
  int64_t rank_batch_size_;
  int64_t global_batch_size_;
  int64_t epoch_ = 0;
  // The epoch's permutation of 0..dataset_size-1.
  std::vector<int64_t> order_;
};

}  // namespace cpptrain

#endif  // CPPTRAIN_TRAINER_DATA_SAMPLER_H_
