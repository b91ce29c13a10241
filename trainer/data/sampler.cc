#include "trainer/data/sampler.h"

#include <algorithm>
#include <numeric>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace cpptrain {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

absl::StatusOr<DistributedSampler> DistributedSampler::Create(int64_t dataset_size,
                                                              const SamplerOptions& options) {
  if (dataset_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset has ", dataset_size, " samples: give the sampler a non-empty dataset"));
  }
  if (options.batch_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_size is ", options.batch_size, ": it must be at least 1"));
  }
  if (options.world_size <= 0 || options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", options.rank, " with world_size ", options.world_size,
                     ": need world_size >= 1 and 0 <= rank < world_size"));
  }
  if (options.split_batches && options.batch_size % options.world_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch_size ", options.batch_size, " is not divisible by world_size ", options.world_size,
        " with split_batches, which splits each global batch evenly "
        "across ranks: use a multiple of ",
        options.world_size, " or set split_batches=false"));
  }
  DistributedSampler sampler(dataset_size, options);
  if (options.drop_last && dataset_size < sampler.global_batch_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset of ", dataset_size, " samples is shorter than one global batch of ",
        sampler.global_batch_size(), " (batch_size ", options.batch_size,
        options.split_batches ? " split over" : " x", " world_size ", options.world_size,
        ") with drop_last, so no batch would be produced: lower batch_size or set "
        "drop_last=false"));
  }
  sampler.SetEpoch(0);
  return sampler;
}

DistributedSampler::DistributedSampler(int64_t dataset_size, const SamplerOptions& options)
    : dataset_size_(dataset_size),
      options_(options),
      rank_batch_size_(options.split_batches ? options.batch_size / options.world_size
                                             : options.batch_size),
      global_batch_size_(options.split_batches ? options.batch_size
                                               : options.batch_size * options.world_size) {}

void DistributedSampler::SetEpoch(int64_t epoch) {
  epoch_ = epoch;
  order_.resize(static_cast<size_t>(dataset_size_));
  if (!options_.shuffle) {
    std::iota(order_.begin(), order_.end(), int64_t{0});
    return;
  }
  at::Generator generator =
      at::make_generator<at::CPUGeneratorImpl>(options_.seed + static_cast<uint64_t>(epoch));
  const at::Tensor permutation = at::randperm(dataset_size_, generator, at::kLong);
  const int64_t* data = permutation.data_ptr<int64_t>();
  std::copy(data, data + dataset_size_, order_.begin());
  if (!options_.group_lengths.empty()) {
    order_ =
        LengthGroupedOrder(std::move(order_), options_.group_lengths, options_.group_batch_size);
  }
}

std::vector<int64_t> LengthGroupedOrder(std::vector<int64_t> order,
                                        const std::vector<int64_t>& lengths, int64_t batch_size) {
  const int64_t n = static_cast<int64_t>(order.size());
  batch_size = std::max<int64_t>(1, batch_size);
  const int64_t mult = std::max<int64_t>(1, std::min<int64_t>(n / (batch_size * 4), 50));
  const int64_t mega = mult * batch_size;
  auto longer = [&](int64_t a, int64_t b) { return lengths[a] > lengths[b]; };
  int64_t longest_head = 0;
  for (int64_t begin = 0; begin < n; begin += mega) {
    auto first = order.begin() + begin;
    std::stable_sort(first, order.begin() + std::min(n, begin + mega), longer);
    if (lengths[*first] > lengths[order[longest_head]]) longest_head = begin;
  }
  if (n > 0) std::swap(order[0], order[longest_head]);
  return order;
}

int64_t DistributedSampler::num_steps() const {
  if (options_.drop_last) return dataset_size_ / global_batch_size_;
  return CeilDiv(dataset_size_, global_batch_size_);
}

bool DistributedSampler::pads() const {
  // One process has no other rank to keep in step with: nothing is repeated (as Accelerate,
  // which shards batches only when there are several processes).
  return options_.even_batches && options_.world_size > 1;
}

int64_t DistributedSampler::num_samples_padded() const {
  if (options_.drop_last || pads()) return num_steps() * global_batch_size_;
  return dataset_size_;
}

int64_t DistributedSampler::num_padding_samples() const {
  return std::max<int64_t>(0, num_samples_padded() - dataset_size_);
}

int64_t DistributedSampler::rank_padding_samples() const {
  if (options_.drop_last || !pads()) return 0;
  const int64_t end =
      (num_steps() - 1) * global_batch_size_ + (options_.rank + 1) * rank_batch_size_;
  return std::clamp<int64_t>(end - dataset_size_, 0, rank_batch_size_);
}

int64_t DistributedSampler::num_batches() const {
  if (options_.drop_last || pads()) return num_steps();
  const int64_t offset = options_.rank * rank_batch_size_;
  return dataset_size_ > offset ? CeilDiv(dataset_size_ - offset, global_batch_size_) : 0;
}

std::vector<std::vector<int64_t>> DistributedSampler::Batches() const {
  const int64_t total = num_samples_padded();
  std::vector<std::vector<int64_t>> batches;
  batches.reserve(static_cast<size_t>(num_batches()));
  for (int64_t step = 0; step < num_steps(); ++step) {
    const int64_t begin = step * global_batch_size_ + options_.rank * rank_batch_size_;
    const int64_t end = std::min(begin + rank_batch_size_, total);
    if (begin >= end) continue;
    std::vector<int64_t> batch;
    batch.reserve(static_cast<size_t>(end - begin));
    for (int64_t i = begin; i < end; ++i) batch.push_back(order_[i % dataset_size_]);
    batches.push_back(std::move(batch));
  }
  return batches;
}

}  // namespace cpptrain
