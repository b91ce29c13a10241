#include "trainer/data/data_loader.h"

#include <atomic>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace cpptrain {
namespace {

using ::testing::HasSubstr;

// Example i is the tokens {i, ..., i} of length 1 + i % 3; records every Get. Index
// `bad_index` yields an undefined example, which the collator rejects.
class CountingDataset : public Dataset {
 public:
  explicit CountingDataset(int64_t size, int64_t bad_index = -1)
      : size_(size), bad_index_(bad_index) {}
  int64_t size() const override { return size_; }
  Example Get(int64_t index) const override {
    gets_.fetch_add(1);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      read_.insert(index);
    }
    if (index == bad_index_) return Example();
    return Example{at::full({1 + index % 3}, index, at::kLong), {}};
  }
  int64_t gets() const { return gets_.load(); }
  std::set<int64_t> read() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return read_;
  }

 private:
  int64_t size_;
  int64_t bad_index_;
  mutable std::atomic<int64_t> gets_{0};
  mutable std::mutex mutex_;
  mutable std::set<int64_t> read_;
};

DataLoaderOptions ShuffledOptions(int64_t batch_size, int64_t num_workers) {
  DataLoaderOptions options;
  options.batch_size = batch_size;
  options.shuffle = true;
  options.seed = 17;
  options.num_workers = num_workers;
  return options;
}

std::vector<Batch> Drain(DataLoader& loader, int64_t skip = 0) {
  std::vector<Batch> batches;
  loader.Start(skip);
  while (std::optional<Batch> batch = loader.Next()) batches.push_back(*batch);
  EXPECT_TRUE(loader.status().ok()) << loader.status();
  return batches;
}

void ExpectSameBatches(const std::vector<Batch>& a, const std::vector<Batch>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(at::equal(a[i].inputs, b[i].inputs)) << "batch " << i;
    EXPECT_TRUE(at::equal(a[i].labels, b[i].labels)) << "batch " << i;
    EXPECT_TRUE(at::equal(a[i].attention_mask, b[i].attention_mask)) << "batch " << i;
  }
}

TEST(DataLoaderTest, YieldsEveryExampleOncePerEpoch) {
  auto ds = std::make_shared<CountingDataset>(10);
  DataLoaderOptions options;
  options.batch_size = 4;
  absl::StatusOr<std::unique_ptr<DataLoader>> loader = DataLoader::Create(ds, options);
  ASSERT_TRUE(loader.ok()) << loader.status();
  EXPECT_EQ((*loader)->num_batches(), 3);
  const std::vector<Batch> batches = Drain(**loader);
  ASSERT_EQ(batches.size(), 3u);
  // Sequential: batch 0 is examples 0..3 padded to length 3 with pad id 0.
  EXPECT_TRUE(at::equal(batches[0].inputs.select(1, 0), at::arange(4, at::kLong)));
  EXPECT_EQ(batches[0].inputs.size(1), 3);
  EXPECT_EQ(batches[0].attention_mask.sum().item<int64_t>(), 1 + 2 + 3 + 1);
  // One process repeats nothing: the last batch is short (examples 8, 9).
  EXPECT_TRUE(at::equal(batches[2].inputs.select(1, 0), at::tensor({8, 9}, at::kLong)));
  EXPECT_EQ((*loader)->sampler().rank_padding_samples(), 0);
  EXPECT_EQ(ds->gets(), 10);
}

TEST(DataLoaderTest, SkipDoesNotReadSkippedExamplesAndMatchesFullPass) {
  for (int64_t workers : {0, 3}) {
    auto full_ds = std::make_shared<CountingDataset>(37);
    auto loader = DataLoader::Create(full_ds, ShuffledOptions(4, workers));
    ASSERT_TRUE(loader.ok()) << loader.status();
    (*loader)->SetEpoch(2);
    const std::vector<Batch> full = Drain(**loader);
    ASSERT_EQ(full.size(), 10u);

    auto ds = std::make_shared<CountingDataset>(37);
    auto resumed = DataLoader::Create(ds, ShuffledOptions(4, workers));
    ASSERT_TRUE(resumed.ok());
    (*resumed)->SetEpoch(2);
    const std::vector<Batch> rest = Drain(**resumed, /*skip=*/6);
    ExpectSameBatches(std::vector<Batch>(full.begin() + 6, full.end()), rest);
    EXPECT_EQ(ds->gets(), 3 * 4 + 1) << "workers " << workers;  // 37 = 9 x 4 + 1
    std::set<int64_t> skipped;
    for (size_t i = 0; i < 6; ++i) {
      for (int64_t j = 0; j < 4; ++j) skipped.insert(full[i].inputs[j][0].item<int64_t>());
    }
    std::set<int64_t> expected_read;
    for (size_t i = 6; i < 10; ++i) {
      for (int64_t j = 0; j < full[i].size(); ++j) {
        expected_read.insert(full[i].inputs[j][0].item<int64_t>());
      }
    }
    EXPECT_EQ(ds->read(), expected_read);
  }
}

TEST(DataLoaderTest, WorkersGiveTheSameBatchesAsNoWorkers) {
  auto ds = std::make_shared<CountingDataset>(103);
  auto serial = DataLoader::Create(ds, ShuffledOptions(5, 0));
  DataLoaderOptions options = ShuffledOptions(5, 3);
  options.prefetch_factor = 1;
  auto parallel = DataLoader::Create(ds, options);
  auto parallel_default = DataLoader::Create(ds, ShuffledOptions(5, 4));
  ASSERT_TRUE(serial.ok() && parallel.ok() && parallel_default.ok());
  for (int64_t epoch : {0, 1}) {
    (*serial)->SetEpoch(epoch);
    (*parallel)->SetEpoch(epoch);
    (*parallel_default)->SetEpoch(epoch);
    const std::vector<Batch> expected = Drain(**serial);
    ASSERT_EQ(expected.size(), 21u);
    ExpectSameBatches(expected, Drain(**parallel));
    ExpectSameBatches(expected, Drain(**parallel_default));
  }
  (*serial)->SetEpoch(0);
  (*serial)->Start();
  (*serial)->SetEpoch(1);
  (*serial)->Start();
  std::optional<Batch> first = (*serial)->Next();
  ASSERT_TRUE(first.has_value());
  EXPECT_TRUE(at::equal(first->inputs, Drain(**parallel)[0].inputs));
}

// dataloader_persistent_workers: the same batches, with the worker threads started once
// for all epochs (and restarts mid-epoch) instead of once per epoch.
TEST(DataLoaderTest, PersistentWorkersAreStartedOnce) {
  auto ds = std::make_shared<CountingDataset>(103);
  auto serial = DataLoader::Create(ds, ShuffledOptions(5, 0));
  DataLoaderOptions options = ShuffledOptions(5, 3);
  options.persistent_workers = true;
  auto persistent = DataLoader::Create(ds, options);
  auto restarted = DataLoader::Create(ds, ShuffledOptions(5, 3));
  ASSERT_TRUE(serial.ok() && persistent.ok() && restarted.ok());
  for (int64_t epoch : {0, 1, 2}) {
    (*serial)->SetEpoch(epoch);
    (*persistent)->SetEpoch(epoch);
    (*restarted)->SetEpoch(epoch);
    const std::vector<Batch> expected = Drain(**serial);
    ExpectSameBatches(expected, Drain(**persistent));
    // Restarted mid-epoch.
    ExpectSameBatches(std::vector<Batch>(expected.begin() + 7, expected.end()),
                      Drain(**persistent, /*skip=*/7));
    ExpectSameBatches(expected, Drain(**restarted));
  }
  EXPECT_EQ((*persistent)->threads_started(), 3);
  EXPECT_EQ((*restarted)->threads_started(), 9);
}

// Without even_batches some ranks have a batch fewer; every rank knows the busiest rank's
// count, and a join batch runs through the model but counts no target.
TEST(DataLoaderTest, UnevenRanksKnowTheLongestAndJoin) {
  auto ds = std::make_shared<CountingDataset>(10);  // 2 per rank and step: 5 + 3 + 2 batches
  for (int64_t rank = 0; rank < 3; ++rank) {
    DataLoaderOptions options = ShuffledOptions(2, 0);
    options.rank = rank;
    options.world_size = 3;
    options.even_batches = false;
    auto loader = DataLoader::Create(ds, options);
    ASSERT_TRUE(loader.ok());
    EXPECT_EQ((*loader)->num_batches(), rank < 2 ? 2 : 1) << "rank " << rank;
    EXPECT_EQ((*loader)->max_num_batches(), 2);
    auto join = (*loader)->JoinBatch();
    ASSERT_TRUE(join.ok()) << join.status();
    EXPECT_EQ(join->size(), 1);
    EXPECT_TRUE(join->labels.eq(kIgnoreIndex).all().item<bool>());
  }
}

TEST(DataLoaderTest, PrefetchIsBounded) {
  auto ds = std::make_shared<CountingDataset>(200);
  DataLoaderOptions options = ShuffledOptions(2, 2);
  options.prefetch_factor = 1;
  auto loader = DataLoader::Create(ds, options);
  ASSERT_TRUE(loader.ok());
  (*loader)->Start();
  ASSERT_TRUE((*loader)->Next().has_value());
  // Delivered 1 batch; workers may hold at most 2 more.
  EXPECT_LE(ds->gets(), (1 + 2) * 2);
}

TEST(DataLoaderTest, RestartAndDestroyMidEpochShutDownCleanly) {
  auto ds = std::make_shared<CountingDataset>(500);
  auto loader = DataLoader::Create(ds, ShuffledOptions(3, 4));
  ASSERT_TRUE(loader.ok());
  (*loader)->Start();
  std::optional<Batch> first = (*loader)->Next();
  ASSERT_TRUE(first.has_value());
  ASSERT_TRUE((*loader)->Next().has_value());
  (*loader)->Start();  // Restart mid-epoch: begins again at batch 0.
  std::optional<Batch> again = (*loader)->Next();
  ASSERT_TRUE(again.has_value());
  EXPECT_TRUE(at::equal(first->inputs, again->inputs));
  loader->reset();  // Destroyed with workers mid-epoch; must join, not hang or crash.
  SUCCEED();
}

TEST(DataLoaderTest, RanksGetEqualBatchCounts) {
  auto ds = std::make_shared<CountingDataset>(10);
  std::set<int64_t> seen;
  for (int64_t rank = 0; rank < 3; ++rank) {
    DataLoaderOptions options = ShuffledOptions(2, rank % 2);
    options.rank = rank;
    options.world_size = 3;
    auto loader = DataLoader::Create(ds, options);
    ASSERT_TRUE(loader.ok());
    EXPECT_EQ((*loader)->num_batches(), 2);
    const std::vector<Batch> batches = Drain(**loader);
    ASSERT_EQ(batches.size(), 2u);
    for (const Batch& b : batches) {
      for (int64_t j = 0; j < b.size(); ++j) seen.insert(b.inputs[j][0].item<int64_t>());
    }
  }
  EXPECT_EQ(seen.size(), 10u);
}

TEST(DataLoaderTest, ReportsDatasetErrorsThroughStatus) {
  for (int64_t workers : {0, 2}) {
    auto ds = std::make_shared<CountingDataset>(12, /*bad_index=*/5);
    DataLoaderOptions options;
    options.batch_size = 2;
    options.num_workers = workers;
    auto loader = DataLoader::Create(ds, options);
    ASSERT_TRUE(loader.ok());
    (*loader)->Start();
    int64_t good = 0;
    while ((*loader)->Next().has_value()) ++good;
    EXPECT_EQ(good, 2);  // Batch 2 holds example 5.
    EXPECT_FALSE((*loader)->status().ok());
    EXPECT_THAT(std::string((*loader)->status().message()), HasSubstr("batch 2 of epoch 0"));
    EXPECT_FALSE((*loader)->Next().has_value());
  }
}

TEST(DataLoaderTest, StartAndNextMisuse) {
  auto ds = std::make_shared<CountingDataset>(8);
  DataLoaderOptions options;
  options.batch_size = 2;
  auto loader = DataLoader::Create(ds, options);
  ASSERT_TRUE(loader.ok());
  EXPECT_FALSE((*loader)->Next().has_value());
  EXPECT_EQ((*loader)->status().code(), absl::StatusCode::kFailedPrecondition);
  (*loader)->Start(5);
  EXPECT_FALSE((*loader)->Next().has_value());
  EXPECT_THAT(std::string((*loader)->status().message()), HasSubstr("skip_batches is 5"));
  (*loader)->Start(4);
  EXPECT_FALSE((*loader)->Next().has_value());
  EXPECT_TRUE((*loader)->status().ok());
  EXPECT_EQ(ds->gets(), 0);
}

TEST(DataLoaderTest, CreateRejectsBadOptions) {
  auto ds = std::make_shared<CountingDataset>(7);
  auto error_of = [&](std::shared_ptr<const Dataset> dataset, DataLoaderOptions options) {
    auto loader = DataLoader::Create(std::move(dataset), options);
    return loader.ok() ? std::string("ok") : std::string(loader.status().message());
  };
  DataLoaderOptions options;
  EXPECT_THAT(error_of(std::make_shared<CountingDataset>(0), options), HasSubstr("empty dataset"));
  EXPECT_THAT(error_of(nullptr, options), HasSubstr("no dataset"));
  options.batch_size = 0;
  EXPECT_THAT(error_of(ds, options), HasSubstr("batch_size is 0"));
  options.batch_size = 4;
  options.world_size = 2;
  options.drop_last = true;
  EXPECT_THAT(error_of(ds, options), HasSubstr("7 samples is shorter than one global batch of 8"));
  options = DataLoaderOptions();
  options.prefetch_factor = 2;
  EXPECT_THAT(error_of(ds, options), HasSubstr("prefetching needs workers"));
  options.num_workers = 1;
  EXPECT_EQ(error_of(ds, options), "ok");
  options.prefetch_factor = 0;
  EXPECT_THAT(error_of(ds, options), HasSubstr("prefetch_factor is 0"));
  options = DataLoaderOptions();
  options.num_workers = -1;
  EXPECT_THAT(error_of(ds, options), HasSubstr("num_workers is -1"));
  options = DataLoaderOptions();
  options.split_batches = true;
  options.batch_size = 3;
  options.world_size = 2;
  EXPECT_THAT(error_of(ds, options), HasSubstr("batch_size 3 is not divisible by world_size 2"));
}

}  // namespace
}  // namespace cpptrain
