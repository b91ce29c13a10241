#include "trainer/data/data_loader.h"

#include <utility>

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "base/torch_status.h"

namespace cpptrain {

absl::StatusOr<std::unique_ptr<DataLoader>> DataLoader::Create(
    std::shared_ptr<const Dataset> dataset, DataLoaderOptions options) {
  if (dataset == nullptr || dataset->size() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data loader got ", dataset == nullptr ? "no dataset" : "an empty dataset (0 samples)",
        ": check the data files or the builtin sample counts"));
  }
  if (options.num_workers < 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_workers is ", options.num_workers,
                                                   ": use 0 (batches built in Next()) or more"));
  }
  if (options.prefetch_factor.has_value()) {
    if (options.num_workers == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "prefetch_factor is ", *options.prefetch_factor,
          " but num_workers is 0: prefetching needs workers; set num_workers > 0 or leave "
          "prefetch_factor unset"));
    }
    if (*options.prefetch_factor < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("prefetch_factor is ", *options.prefetch_factor, ": it must be at least 1"));
    }
  }
  SamplerOptions sampler_options;
  sampler_options.batch_size = options.batch_size;
  sampler_options.shuffle = options.shuffle;
  sampler_options.seed = options.seed;
  sampler_options.drop_last = options.drop_last;
  sampler_options.rank = options.rank;
  sampler_options.world_size = options.world_size;
  sampler_options.even_batches = options.even_batches;
  sampler_options.split_batches = options.split_batches;
  if (!options.group_lengths.empty() &&
      static_cast<int64_t>(options.group_lengths.size()) != dataset->size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "group_lengths has ", options.group_lengths.size(), " lengths for a dataset of ",
        dataset->size(), " samples: give one per sample"));
  }
  sampler_options.group_lengths = options.group_lengths;
  sampler_options.group_batch_size = options.group_batch_size;
  CT_ASSIGN_OR_RETURN(DistributedSampler sampler,
                      DistributedSampler::Create(dataset->size(), sampler_options));
  return std::unique_ptr<DataLoader>(
      new DataLoader(std::move(dataset), std::move(options), std::move(sampler)));
}

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options,
                       DistributedSampler sampler)
    : dataset_(std::move(dataset)),
      options_(std::move(options)),
      sampler_(std::move(sampler)),
      collator_(options_.pad_token_id),
      pin_(options_.pin_memory && torch::cuda::is_available()),
      capacity_(options_.num_workers * options_.prefetch_factor.value_or(2)) {}

DataLoader::~DataLoader() {
  exit_requested_ = true;
  StopWorkers();
}

void DataLoader::SetEpoch(int64_t epoch) {
  StopWorkers();
  started_ = false;
  sampler_.SetEpoch(epoch);
}

void DataLoader::Start(int64_t skip_batches) {
  StopWorkers();
  started_ = true;
  status_ = absl::OkStatus();
  batches_ = sampler_.Batches();
  const int64_t num = static_cast<int64_t>(batches_.size());
  if (skip_batches < 0 || skip_batches > num) {
    status_ = absl::OutOfRangeError(absl::StrCat(
        "skip_batches is ", skip_batches, " but epoch ", sampler_.epoch(), " has ", num,
        " batches on rank ", options_.rank,
        ": resume with the same batch_size, world_size and dataset as the checkpoint"));
    cursor_ = num;
    return;
  }
  cursor_ = skip_batches;
  if (options_.num_workers == 0) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = false;
    end_ = num;
    next_to_claim_ = skip_batches;
    next_to_deliver_ = skip_batches;
    ready_.clear();
  }
  if (workers_.empty()) {
    workers_.reserve(static_cast<size_t>(options_.num_workers));
    for (int64_t i = 0; i < options_.num_workers; ++i) {
      workers_.emplace_back([this] { WorkerLoop(); });
      ++threads_started_;
    }
  }
  room_cv_.notify_all();
}

std::optional<Batch> DataLoader::Next() {
  if (!started_) {
    status_ = absl::FailedPreconditionError(
        "DataLoader::Next() called before Start(): call Start() at the beginning of each "
        "epoch");
    return std::nullopt;
  }
  if (cursor_ >= static_cast<int64_t>(batches_.size())) return std::nullopt;
  const int64_t k = cursor_++;
  absl::StatusOr<Batch> batch = absl::UnknownError("unset");
  if (workers_.empty()) {
    batch = MakeBatch(k);
  } else {
    std::unique_lock<std::mutex> lock(mutex_);
    ready_cv_.wait(lock, [&] { return ready_.count(k) > 0; });
    auto it = ready_.find(k);
    batch = std::move(it->second);
    ready_.erase(it);
    next_to_deliver_ = k + 1;
    room_cv_.notify_all();
  }
  if (!batch.ok()) {
    status_ = batch.status();
    StopWorkers();
    cursor_ = static_cast<int64_t>(batches_.size());
    return std::nullopt;
  }
  return std::move(batch).value();
}

absl::StatusOr<Batch> DataLoader::MakeBatch(int64_t k) const {
  absl::StatusOr<Batch> batch = Collate(batches_[static_cast<size_t>(k)]);
  if (!batch.ok()) {
    return absl::Status(batch.status().code(),
                        absl::StrCat("batch ", k, " of epoch ", sampler_.epoch(), " on rank ",
                                     options_.rank, ": ", batch.status().message()));
  }
  return batch;
}

absl::StatusOr<Batch> DataLoader::Collate(const std::vector<int64_t>& indices) const {
  absl::StatusOr<Batch> batch = absl::UnknownError("unset");
  const absl::Status torch_status = CatchTorch([&] {
    std::vector<Example> examples;
    examples.reserve(indices.size());
    for (int64_t index : indices) examples.push_back(dataset_->Get(index));
    batch = options_.data_collator ? options_.data_collator(examples) : collator_.Collate(examples);
    if (batch.ok() && pin_) batch = batch->PinMemory();
  });
  if (!torch_status.ok()) batch = torch_status;
  return batch;
}

absl::StatusOr<Batch> DataLoader::JoinBatch() const {
  CT_ASSIGN_OR_RETURN(Batch batch, Collate({0}));
  CT_RETURN_IF_ERROR(CatchTorch([&] { batch.labels.fill_(kIgnoreIndex); }));
  return batch;
}

// Claims batches up to `capacity_` ahead of the consumer, builds them outside the lock, and
// waits (between epochs too, when persistent) until there is work again or it must exit.
void DataLoader::WorkerLoop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    room_cv_.wait(lock, [&] {
      return exit_ ||
             (!stop_ && next_to_claim_ < end_ && next_to_claim_ < next_to_deliver_ + capacity_);
    });
    if (exit_) return;
    const int64_t k = next_to_claim_++;
    ++building_;
    lock.unlock();
    absl::StatusOr<Batch> batch = MakeBatch(k);
    lock.lock();
    --building_;
    if (!stop_) {
      ready_.emplace(k, std::move(batch));
      ready_cv_.notify_all();
    }
    idle_cv_.notify_all();
  }
}

void DataLoader::StopWorkers() {
  if (workers_.empty()) return;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    stop_ = true;
    // Persistent workers stay; nothing may still read this epoch's batches_ when it changes.
    idle_cv_.wait(lock, [&] { return building_ == 0; });
    ready_.clear();
    if (options_.persistent_workers && !exit_requested_) return;
    exit_ = true;
  }
  room_cv_.notify_all();
  for (std::thread& worker : workers_) worker.join();
  workers_.clear();
  std::lock_guard<std::mutex> lock(mutex_);
  exit_ = false;
}

}  // namespace cpptrain
