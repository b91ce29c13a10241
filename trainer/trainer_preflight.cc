// The checks Train() runs before the first step, so a job fails in seconds instead of at its
// first save: output_dir writable, room for one checkpoint, every rank started with the same
// training arguments.
#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <unordered_set>
#include <vector>

#include <torch/types.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/logging.h"
#include "base/status.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "sharding/fully_shard.h"
#include "trainer/internal/preflight.h"
#include "trainer/trainer.h"

namespace cpptrain {
namespace {

uint64_t Fnv1a(const std::string& bytes) {
  uint64_t hash = 1469598103934665603ull;
  for (unsigned char c : bytes) hash = (hash ^ c) * 1099511628211ull;
  return hash;
}

// FNV-1a over the deterministic serialization. Without checkpoints each rank may write its
// metrics to its own output_dir, so the directory counts only when checkpoints are saved.
uint64_t ArgumentsHash(proto::TrainingArguments args) {
  if (args.save_strategy() == proto::TrainingArguments::NO) args.clear_output_dir();
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    args.SerializeToCodedStream(&coded);
  }
  return Fnv1a(bytes);
}

// The launcher's id of this job (TORCHELASTIC_RUN_ID: tools/launch and torchrun make one per
// job), empty without one (srun, mpirun).
std::string LaunchRunId() {
  const char* id = std::getenv("TORCHELASTIC_RUN_ID");
  return id == nullptr ? "" : id;
}

// This rank's node among the launchers (GROUP_RANK), -1 when no launcher says. Every node runs
// a launcher of its own, and tools/launch makes its run id per launcher, so only ranks of one
// node must share the run id.
double LaunchNode() {
  const char* node = std::getenv("GROUP_RANK");
  int value = -1;
  return node != nullptr && absl::SimpleAtoi(node, &value) ? value : -1;
}

// Two doubles that hold a 64-bit hash exactly.
void AppendHash(uint64_t hash, std::vector<double>& out) {
  out.push_back(static_cast<double>(hash >> 32));
  out.push_back(static_cast<double>(hash & 0xFFFFFFFFull));
}

// The ranks (as text) whose run id (the hash at columns 4-5) differs from that of the first rank
// of their node (column 6).
std::vector<std::string> RanksOfAnotherLauncher(const torch::Tensor& all) {
  std::vector<std::string> ranks;
  for (int64_t r = 1; r < all.size(0); ++r) {
    for (int64_t q = 0; q < r; ++q) {
      if (all[q][6].item<double>() != all[r][6].item<double>()) continue;
      if (!all[r].slice(0, 4, 6).equal(all[q].slice(0, 4, 6))) ranks.push_back(absl::StrCat(r));
      break;
    }
  }
  return ranks;
}

// The ranks (as text) whose hash (two doubles from `first`) differs from rank 0's.
std::vector<std::string> RanksDiffering(const torch::Tensor& all, int64_t first) {
  std::vector<std::string> ranks;
  for (int64_t r = 1; r < all.size(0); ++r) {
    if (!all[r].slice(0, first, first + 2).equal(all[0].slice(0, first, first + 2))) {
      ranks.push_back(absl::StrCat(r));
    }
  }
  return ranks;
}

// "rank 0: 48 / 16, rank 1: 40 / 16": each rank's train and eval sample counts (columns 8-9).
std::string SampleCounts(const torch::Tensor& all) {
  std::vector<std::string> ranks;
  for (int64_t r = 0; r < all.size(0); ++r) {
    ranks.push_back(absl::StrCat("rank ", r, ": ", all[r][8].item<int64_t>(), " / ",
                                 all[r][9].item<int64_t>()));
  }
  return absl::StrJoin(ranks, ", ");
}

}  // namespace

namespace trainer_internal {

absl::Status CheckWritable(const std::string& dir) {
  const std::string probe = (std::filesystem::path(dir) / ".cpptrain-write-check").string();
  const int fd = ::open(probe.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
  const bool written = fd >= 0 && ::write(fd, "x", 1) == 1;
  const int error = errno;
  if (fd >= 0) ::close(fd);
  ::unlink(probe.c_str());
  if (written) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "output_dir \"", dir, "\" is not writable (", std::strerror(error),
      "): checkpoints and metrics.jsonl are written there; choose a writable output_dir"));
}

// Bytes of one checkpoint: every parameter (whole, also when sharded) and, unless only the
// model is saved, AdamW's two fp32 moments of each trainable one.
int64_t CheckpointBytes(const TrainableModel& model, bool with_optimizer) {
  int64_t bytes = 0;
  auto add = [&](int64_t numel, int64_t element_size, bool trainable) {
    bytes += numel * element_size + (with_optimizer && trainable ? 8 * numel : 0);
  };
  if (const auto* sharded = dynamic_cast<const ShardingCore*>(model.sharding())) {
    for (const auto& [param, info] : sharded->Shards()) {
      int64_t numel = 1;
      for (int64_t d : info->global_shape) numel *= d;
      add(numel, c10::elementSize(info->dtype), param.requires_grad());
    }
    return bytes;
  }
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const at::Tensor& p : model.parameters(/*recurse=*/true)) {
    if (seen.insert(p.unsafeGetTensorImpl()).second) {
      add(p.numel(), static_cast<int64_t>(p.element_size()), p.requires_grad());
    }
  }
  return bytes;
}

namespace {
std::string GiB(int64_t bytes) { return absl::StrCat(bytes / (1 << 20) / 1024.0, " GiB"); }
}  // namespace

std::optional<int64_t> FreeBytes(const std::string& dir) {
  struct statvfs fs;
  if (::statvfs(dir.c_str(), &fs) != 0) return std::nullopt;
  return static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
}

absl::Status CheckFreeSpace(const std::string& dir, int64_t needed) {
  const std::optional<int64_t> free = FreeBytes(dir);
  if (!free) return absl::OkStatus();  // unknown: not a refusal
  const int64_t available = *free;
  if (available >= needed) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "output_dir \"", dir, "\" has ", GiB(available), " free but one checkpoint takes about ",
      GiB(needed), " (", needed, " bytes: the parameters, and AdamW's two moments unless "
      "save_only_model): free space, choose another output_dir, or set save_strategy NO"));
}

}  // namespace trainer_internal

absl::Status Trainer::Preflight() {
  using trainer_internal::CheckFreeSpace;
  using trainer_internal::CheckpointBytes;
  using trainer_internal::CheckWritable;
  absl::Status local = absl::OkStatus();
  if (state_.is_world_process_zero) {
    local = CheckWritable(args_.output_dir());
    if (local.ok() && args_.save_strategy() != proto::TrainingArguments::NO) {
      local = CheckFreeSpace(args_.output_dir(),
                             CheckpointBytes(*model_, !args_.save_only_model()));
    }
  }
  // What every rank must share: the training arguments, the model and data (job_identity_),
  // and with the other ranks of its node the launcher's job; then this rank's verdict.
  const uint64_t hash = ArgumentsHash(args_);
  std::vector<double> mine;
  AppendHash(hash, mine);
  AppendHash(Fnv1a(job_identity_), mine);
  AppendHash(Fnv1a(LaunchRunId()), mine);
  mine.push_back(LaunchNode());
  mine.push_back(local.ok() ? 0.0 : 1.0);
  // Columns 8-9: the samples this rank sees. Every rank counts the steps from the global
  // dataset's size without communicating, so a stale copy of a data file on one node would
  // have its ranks leave the loop, save or evaluate at other steps than the rest.
  mine.push_back(static_cast<double>(train_dataset_ ? train_dataset_->size() : -1));
  mine.push_back(static_cast<double>(eval_dataset_ ? eval_dataset_->size() : -1));
  CT_ASSIGN_OR_RETURN(torch::Tensor all,
                      engine_->AllGather(torch::tensor(mine, torch::kFloat64)));
  all = all.view({-1, static_cast<int64_t>(mine.size())});
  if (!local.ok()) return local;
  std::vector<std::string> failed;
  for (int64_t r = 0; r < all.size(0); ++r) {
    if (all[r][7].item<double>() != 0) failed.push_back(absl::StrCat(r));
  }
  if (!failed.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank(s) ", absl::StrJoin(failed, ", "), " failed the checks before training (their "
        "logs say why)"));
  }
  if (const std::vector<std::string> other_job = RanksOfAnotherLauncher(all);
      !other_job.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank(s) ", absl::StrJoin(other_job, ", "), " were started by another launcher than "
        "the ranks before them on their node (TORCHELASTIC_RUN_ID differs; here it is \"",
        LaunchRunId(), "\"): two jobs are "
        "using one MASTER_ADDR:MASTER_PORT; give each job its own --master_port, or "
        "--master_port=0 for a free one on a single node"));
  }
  if (const std::vector<std::string> differ = RanksDiffering(all, 0); !differ.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank(s) ", absl::StrJoin(differ, ", "), " were started with other training arguments "
        "than rank 0 (this rank's hash ", absl::Hex(hash), "): start every rank with the same "
        "config file and --set flags"));
  }
  if (const std::vector<std::string> differ = RanksDiffering(all, 2); !differ.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank(s) ", absl::StrJoin(differ, ", "), " were started with another model or data "
        "configuration than rank 0 (data files, seq_len, seed, sample counts, the model): start "
        "every rank with the same config file and --set flags"));
  }
  if (const std::vector<std::string> differ = RanksDiffering(all, 8); !differ.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank(s) ", absl::StrJoin(differ, ", "), " see other datasets than rank 0 (samples, "
        "train / eval, -1 for none: ", SampleCounts(all), "): every rank must read the same "
        "data; where each node has its own copy of the data files, make the copies identical"));
  }
  return absl::OkStatus();
}

}  // namespace cpptrain
