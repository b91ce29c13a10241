// Iterates one rank's collated batches of a Dataset, epoch by epoch: DistributedSampler picks
// the indices, Collator builds each Batch, and optional worker threads build batches ahead.
// The batches are identical with 0 or N workers. Resuming mid-epoch skips batches without
// reading their examples.
//
//   DataLoaderOptions options;
//   options.batch_size = 8;
//   options.shuffle = true;
//   options.num_workers = 2;
//   options.rank = rank;
//   options.world_size = world_size;
//   CT_ASSIGN_OR_RETURN(std::unique_ptr<DataLoader> loader, DataLoader::Create(ds, options));
//   loader->SetEpoch(epoch);
//   loader->Start(/*skip_batches=*/resumed_step_in_epoch);
//   while (std::optional<Batch> batch = loader->Next()) Train(*batch);
//   CT_RETURN_IF_ERROR(loader->status());
#ifndef CPPTRAIN_TRAINER_DATA_DATA_LOADER_H_
#define CPPTRAIN_TRAINER_DATA_DATA_LOADER_H_

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "module/batch.h"
#include "trainer/data/collator.h"
#include "trainer/data/dataset.h"
#include "trainer/data/sampler.h"

namespace cpptrain {

struct DataLoaderOptions {
  // Samples per batch on each rank; with split_batches, per global batch (see sampler.h).
  int64_t batch_size = 1;
  bool shuffle = false;
  uint64_t seed = 0;
  bool drop_last = false;
  // Background threads that build batches; 0 builds them in Next().
  int64_t num_workers = 0;
  // Keep the worker threads from one epoch to the next instead of starting them again
  // (dataloader_persistent_workers); only with num_workers > 0.
  bool persistent_workers = false;
  // Batches each worker may hold ahead; only with num_workers > 0, where unset means 2.
  std::optional<int64_t> prefetch_factor;
  // Pins batches in page-locked memory when CUDA is available; ignored otherwise.
  bool pin_memory = false;
  int64_t rank = 0;
  int64_t world_size = 1;
  bool even_batches = true;
  bool split_batches = false;
  int64_t pad_token_id = 0;
  // Builds every batch (JoinBatch's too) when set, instead of Collator(pad_token_id).
  DataCollatorFn data_collator;
  // Length grouping of the shuffled order (SamplerOptions, sampler.h): one length per sample
  // of the dataset, or empty (off).
  std::vector<int64_t> group_lengths;
  int64_t group_batch_size = 1;
};

class DataLoader {
 public:
  // Fails on an empty or null dataset, batch_size < 1, a dataset shorter than one global
  // batch with drop_last, num_workers < 0, prefetch_factor set without workers or < 1, or a
  // bad rank / world_size / split_batches combination.
  static absl::StatusOr<std::unique_ptr<DataLoader>> Create(std::shared_ptr<const Dataset> dataset,
                                                            DataLoaderOptions options);

  // Stops and joins the workers, also mid-epoch.
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Batches this rank yields per epoch (the same on every rank unless even_batches and
  // drop_last are both false).
  int64_t num_batches() const { return sampler_.num_batches(); }
  // Batches the busiest rank yields per epoch, known on every rank without communicating:
  // with even_batches and drop_last both false, ranks with fewer batches run JoinBatch()
  // until this count, so every rank takes part in every step's collectives.
  int64_t max_num_batches() const { return sampler_.max_num_batches(); }

  // A one-sample batch whose labels are all kIgnoreIndex: it runs through the model (and its
  // collectives) but adds no loss, no target and no gradient (PyTorch's Join, for ranks that
  // ran out of batches).
  absl::StatusOr<Batch> JoinBatch() const;

  // Worker threads started so far (for tests: persistent workers start only num_workers).
  int64_t threads_started() const { return threads_started_; }

  // Selects the epoch (the shuffle order) for the next Start(); ends the current iteration.
  void SetEpoch(int64_t epoch);
  int64_t epoch() const { return sampler_.epoch(); }

  // Begins the current epoch at batch skip_batches (0 <= skip_batches <= num_batches()); the
  // skipped batches' examples are never read. Restarts cleanly if an iteration is running.
  // An out-of-range skip_batches makes Next() return nullopt and status() an error.
  void Start(int64_t skip_batches = 0);

  // The next batch, or nullopt at the end of the epoch, before Start(), or on an error (a
  // dataset or collation failure), which status() then reports. Blocks until the batch is
  // ready when workers build it.
  std::optional<Batch> Next();

  // OK unless the current iteration hit an error.
  absl::Status status() const { return status_; }

  // Where the repeats of even_batches padding are (rank_padding_samples() etc.).
  const DistributedSampler& sampler() const { return sampler_; }
  const DataLoaderOptions& options() const { return options_; }

 private:
  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options,
             DistributedSampler sampler);

  // Reads and collates batch `k` of the epoch (and pins it when enabled).
  absl::StatusOr<Batch> MakeBatch(int64_t k) const;
  absl::StatusOr<Batch> Collate(const std::vector<int64_t>& indices) const;
  void WorkerLoop();
  // Ends the iteration: waits for batches being built, drops prefetched ones, and joins the
  // workers (persistent ones stay, idle, until the next Start or the destructor).
  void StopWorkers();

  const std::shared_ptr<const Dataset> dataset_;
  const DataLoaderOptions options_;
  DistributedSampler sampler_;
  const Collator collator_;
  const bool pin_;
  // Batches the workers may claim ahead of the consumer.
  const int64_t capacity_;

  // The epoch's batches; written only while no worker runs.
  std::vector<std::vector<int64_t>> batches_;
  bool started_ = false;
  int64_t cursor_ = 0;  // Next batch Next() returns.
  absl::Status status_;

  std::vector<std::thread> workers_;
  int64_t threads_started_ = 0;
  bool exit_requested_ = false;  // set by the destructor: persistent workers exit too
  std::mutex mutex_;
  std::condition_variable room_cv_;   // Workers wait here for capacity or a new epoch.
  std::condition_variable ready_cv_;  // Next() waits here for its batch.
  std::condition_variable idle_cv_;   // StopWorkers waits here for batches being built.
  // Guarded by mutex_.
  bool stop_ = false;   // the iteration ended: claim nothing, drop what is finished
  bool exit_ = false;   // workers return
  int64_t building_ = 0;
  int64_t end_ = 0;     // batches in the current epoch
  int64_t next_to_claim_ = 0;
  int64_t next_to_deliver_ = 0;
  std::map<int64_t, absl::StatusOr<Batch>> ready_;
};

}  // namespace cpptrain

#endif  // CPPTRAIN_TRAINER_DATA_DATA_LOADER_H_
