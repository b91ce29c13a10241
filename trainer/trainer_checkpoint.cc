// The Trainer's checkpoints: output_dir/checkpoint-<step>/ written atomically (a temporary
// directory, renamed once every rank's files and the manifest are durable), rotated by
// save_total_limit keeping the best, and read back by resume_from_checkpoint.
#include <ATen/CPUGeneratorImpl.h>
#include <google/protobuf/text_format.h>
#include <torch/types.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/logging.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/files.h"
#include "checkpoint/hf_config.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"
#include "config/training_args.h"
#include "engines/engine.h"
#include "proto/checkpoint.pb.h"
#include "sharding/all_ranks_ok.h"
#include "sharding/fully_shard.h"
#include "sharding/host_group.h"
#include "trainer/internal/preflight.h"
#include "trainer/metrics_log.h"
#include "trainer/run_identity.h"
#include "trainer/trainer.h"

namespace cpptrain {
namespace {

namespace fs = std::filesystem;

constexpr char kPrefix[] = "checkpoint-";

std::string JsonNumber(double v) {
  if (!std::isfinite(v)) return "null";
  return absl::StrCat(v);
}

// Hugging Face's trainer_state.json (the fields its tools read).
std::string TrainerStateJson(const TrainerState& s, const std::string& best_checkpoint) {
  std::vector<std::string> history;
  for (const Metrics& m : s.log_history) history.push_back("    " + MetricsToJson(m));
  return absl::StrCat(
      "{\n  \"best_global_step\": ",
      s.best_global_step ? absl::StrCat(*s.best_global_step) : "null",
      ",\n  \"best_metric\": ", s.best_metric ? JsonNumber(*s.best_metric) : "null",
      ",\n  \"best_model_checkpoint\": ",
      best_checkpoint.empty() ? "null" : absl::StrCat("\"", best_checkpoint, "\""),
      ",\n  \"epoch\": ", JsonNumber(s.epoch), ",\n  \"eval_steps\": ", s.eval_steps,
      ",\n  \"global_step\": ", s.global_step, ",\n  \"log_history\": [\n",
      absl::StrJoin(history, ",\n"), "\n  ],\n  \"logging_steps\": ", s.logging_steps,
      ",\n  \"max_steps\": ", s.max_steps,
      ",\n  \"num_input_tokens_seen\": ", s.num_input_tokens_seen,
      ",\n  \"num_train_epochs\": ", s.num_train_epochs, ",\n  \"save_steps\": ", s.save_steps,
      ",\n  \"total_flos\": ", JsonNumber(s.total_flos),
      ",\n  \"train_batch_size\": ", s.train_batch_size, "\n}\n");
}

// The step of a finished checkpoint directory name, or -1.
int64_t CheckpointStep(const fs::path& path) {
  const std::string name = path.filename().string();
  int64_t step = -1;
  if (name.rfind(kPrefix, 0) != 0 || !absl::SimpleAtoi(name.substr(sizeof(kPrefix) - 1), &step)) {
    return -1;
  }
  return step;
}

// Finished checkpoints in `dir` (trainer_state.textproto is written last), by step.
std::vector<std::pair<int64_t, fs::path>> Checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    const int64_t step = CheckpointStep(entry.path());
    if (step >= 0 && fs::exists(entry.path() / kTrainerStateFileName)) {
      out.emplace_back(step, entry.path());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// What a save that did not complete leaves in `dir`: .tmp-checkpoint-* directories, and
// checkpoint-* directories without trainer_state.textproto.
std::vector<std::string> UnfinishedCheckpoints(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (absl::StartsWith(name, ".tmp-checkpoint-") ||
        (CheckpointStep(entry.path()) >= 0 && !fs::exists(entry.path() / kTrainerStateFileName))) {
      out.push_back(name);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

absl::Status CreateDirectory(const fs::path& dir) {
  std::error_code error;
  fs::create_directories(dir, error);
  if (!error) return absl::OkStatus();
  return absl::Status(
      absl::ErrnoToStatusCode(error.value()),
      absl::StrCat("cannot create checkpoint directory '", dir.string(), "': ", error.message()));
}

std::string RngStatePath(const std::string& dir, int rank) {
  return absl::StrCat(dir, "/rng_state_", rank, ".safetensors");
}

// Collective. resume_from_checkpoint: latest tries the finished checkpoints newest first, each
// try collective: every rank must find the same ones (their count and the newest step).
absl::Status SameCheckpointsOnEveryRank(HostGroup& ranks,
                                        const std::vector<std::pair<int64_t, fs::path>>& found,
                                        const std::string& output_dir) {
  const double newest = found.empty() ? -1.0 : static_cast<double>(found.back().first);
  CT_ASSIGN_OR_RETURN(
      torch::Tensor all,
      ranks.AllGather(torch::tensor({static_cast<double>(found.size()), newest}, torch::kFloat64)));
  all = all.to(torch::kCPU).contiguous().view({-1, 2});
  if (all.eq(all[0]).all().item<bool>()) return absl::OkStatus();
  std::vector<std::string> seen;
  for (int64_t r = 0; r < all.size(0); ++r) {
    const auto count = static_cast<int64_t>(all[r][0].item<double>());
    seen.push_back(count == 0 ? absl::StrCat("rank ", r, ": none")
                              : absl::StrCat("rank ", r, ": ", count, ", the newest checkpoint-",
                                             static_cast<int64_t>(all[r][1].item<double>())));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "resume_from_checkpoint: latest, but the ranks find different checkpoints in '", output_dir,
      "' (", absl::StrJoin(seen, "; "),
      "): output_dir must be one directory every rank shares; or give a checkpoint path"));
}

}  // namespace

absl::StatusOr<std::string> LatestCheckpoint(const std::string& output_dir) {
  auto all = Checkpoints(output_dir);
  if (all.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "resume_from_checkpoint asks for the latest checkpoint, but '", output_dir,
        "' holds no finished checkpoint-<step> directory: give a checkpoint path, or leave "
        "resume_from_checkpoint empty"));
  }
  return all.back().second.string();
}

absl::Status Trainer::SaveCheckpoint() {
  CT_RETURN_IF_ERROR(CheckNotDiverged());  // never a checkpoint of NaN weights
  const std::string name = absl::StrCat(kPrefix, state_.global_step);
  const std::string temp_dir =
      (fs::path(args_.output_dir()) / absl::StrCat(".tmp-", name)).string();
  const absl::Status written = WriteCheckpoint(name, temp_dir);
  if (written.ok()) return absl::OkStatus();
  return SaveFailed(written, name, temp_dir);
}

absl::Status Trainer::WithMasterWeights(const std::function<absl::Status()>& io) {
  // `io` may be collective (a save): every rank runs it, or none does.
  const absl::Status exposed = engine_->ExposeMasterWeights();
  absl::Status done = AllRanksOk(exposed);
  if (done.ok()) done = io();
  const absl::Status restored = exposed.ok() ? engine_->RestoreWorkingWeights() : absl::OkStatus();
  return done.ok() ? restored : done;
}

absl::Status Trainer::AllRanksOk(const absl::Status& local) {
  return ::cpptrain::AllRanksOk(*engine_, local);
}

absl::Status Trainer::SaveFailed(const absl::Status& error, const std::string& name,
                                 const std::string& temp_dir) {
  const fs::path out(args_.output_dir());
  std::string left = "";
  if (engine_->rank() == 0) {
    const absl::Status removed = RemoveTree(temp_dir);
    left = removed.ok() ? absl::StrCat("; the unfinished '", temp_dir, "' was removed")
                        : absl::StrCat("; the unfinished save is left behind (", removed.message(),
                                       "), and the next save removes it");
  }
  std::string advice;
  if (absl::IsResourceExhausted(error)) {
    const int64_t needed = trainer_internal::CheckpointBytes(*model_, !args_.save_only_model());
    const std::optional<int64_t> free = trainer_internal::FreeBytes(out.string());
    advice = absl::StrCat(
        ". One checkpoint takes about ", needed, " bytes, and '", out.string(), "' has ",
        free ? absl::StrCat(*free, " bytes free") : "an unknown amount free",
        " now: free space, keep fewer checkpoints (save_total_limit), or choose another "
        "output_dir");
  }
  const auto finished = Checkpoints(out.string());
  const std::string earlier =
      finished.empty()
          ? ". No earlier checkpoint was finished."
          : absl::StrCat(". Earlier checkpoints are untouched; the newest, '",
                         finished.back().second.string(),
                         "', is what resume_from_checkpoint: \"latest\" continues from.");
  return absl::Status(
      error.code(), absl::StrCat("cannot save ", name, " (step ", state_.global_step,
                                 "), so training stops: ", error.message(), left, advice, earlier));
}

absl::Status Trainer::WriteCheckpoint(const std::string& name, const std::string& temp) {
  const fs::path out(args_.output_dir());
  const fs::path final_dir = out / name;
  const fs::path temp_dir(temp);
  const bool zero = engine_->rank() == 0;
  std::error_code error;
  if (zero) {
    // Unfinished checkpoints of a crashed run are never resumed from; clear them away.
    for (const auto& entry : fs::directory_iterator(out, error)) {
      if (entry.path().filename().string().rfind(".tmp-checkpoint-", 0) == 0) {
        const absl::Status removed = RemoveTree(entry.path().string());
        if (!removed.ok()) LOG(WARNING) << "unfinished checkpoint left: " << removed;
      }
    }
  }
  CT_RETURN_IF_ERROR(AllRanksOk(zero ? CreateDirectory(temp_dir) : absl::OkStatus()));
  SaveModelStateOptions options;
  // FSDP writes its shards as they are unless fsdp.state_dict_type asks for the full model.
  options.full_model =
      model_->sharding() == nullptr ||
      (args_.has_fsdp() && args_.fsdp().state_dict_type() == proto::FsdpConfig::FULL_STATE_DICT);
  options.include_optimizer = !args_.save_only_model();
  options.engine_name = engine_->name();
  absl::Status mine = WithMasterWeights([&] {
    return SaveModelState(temp_dir.string(), *model_, engine_->optimizer(), *engine_, options);
  });
  if (mine.ok() && !args_.save_only_model()) {
    at::Tensor rng;
    {
      at::Generator gen = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(gen.mutex());
      rng = gen.get_state();
    }
    mine = WriteSafetensors(
        (temp_dir / absl::StrCat("rng_state_", engine_->rank(), ".safetensors")).string(),
        {{"cpu", rng}});
  }
  // Every rank learns whether the others' files are written: none waits for a failed one.
  CT_RETURN_IF_ERROR(AllRanksOk(mine));
  // Fault injection for tests: a crash after every rank's files are written, before the
  // checkpoint is complete.
  if (const char* kill = std::getenv("CPPTRAIN_TEST_KILL_IN_SAVE_AT_STEP");
      kill != nullptr && zero && std::atoll(kill) == state_.global_step) {
    LOG(ERROR) << "CPPTRAIN_TEST_KILL_IN_SAVE_AT_STEP=" << kill << ": killing rank 0 mid-save";
    std::raise(SIGKILL);
  }
  // The loss summed over every rank and every step so far, for train_loss after a resume.
  const torch::Tensor local_total =
      loss_total_.defined() ? loss_total_.cpu().reshape({1}) : torch::zeros({1}, torch::kFloat64);
  CT_ASSIGN_OR_RETURN(torch::Tensor total, engine_->AllReduceSum(local_total));
  loss_total_to_save_ = total.item<double>() + resumed_loss_total_;
  // The best checkpoint is known once this step's evaluation ran (before saving).
  if (state_.best_global_step && *state_.best_global_step == state_.global_step) {
    best_model_checkpoint_ = final_dir.string();
  }
  // Rank 0 completes the checkpoint; the others wait to hear how that went.
  return AllRanksOk(zero ? FinishCheckpoint(name, temp) : absl::OkStatus());
}

absl::Status Trainer::FinishCheckpoint(const std::string& name, const std::string& temp) {
  const fs::path out(args_.output_dir());
  const fs::path final_dir = out / name;
  const fs::path temp_dir(temp);
  std::error_code error;
  proto::TrainerCheckpointState saved;
  saved.set_global_step(state_.global_step);
  saved.set_epoch(state_.epoch);
  saved.set_num_input_tokens_seen(state_.num_input_tokens_seen);
  saved.set_total_flos(state_.total_flos);
  if (state_.best_metric) saved.set_best_metric(*state_.best_metric);
  if (state_.best_global_step) saved.set_best_global_step(*state_.best_global_step);
  saved.set_best_model_checkpoint(best_model_checkpoint_);
  for (const Metrics& m : state_.log_history) {
    auto* record = saved.add_log_history();
    for (const auto& [k, v] : m) (*record->mutable_values())[k] = v;
  }
  if (const LossScaler* scaler = engine_->loss_scaler()) {
    saved.set_loss_scale(scaler->scale());
    saved.set_loss_scale_clean_steps(scaler->clean_steps());
  }
  if (plateau_) {
    const ReduceLrOnPlateau::State p = plateau_->state();
    saved.set_plateau_lr(p.lr);
    saved.set_plateau_best(p.best);
    saved.set_plateau_bad_evaluations(p.bad_evaluations);
    saved.set_plateau_cooldown_left(p.cooldown_left);
  }
  saved.set_world_size(engine_->world_size());
  saved.set_loss_total(loss_total_to_save_);
  saved.set_rng_state_saved(!args_.save_only_model());
  saved.set_run_identity(RunIdentity(args_, job_identity_));
  std::string args_text, state_text;
  google::protobuf::TextFormat::PrintToString(args_, &args_text);
  google::protobuf::TextFormat::PrintToString(saved, &state_text);
  CT_RETURN_IF_ERROR(
      WriteFileAtomically((temp_dir / "training_args.textproto").string(), args_text));
  // With the full model, the directory is also a Hugging Face model directory
  // (from_pretrained reads config.json and model.safetensors).
  CT_RETURN_IF_ERROR(WriteModelConfig(temp_dir.string()));
  CT_RETURN_IF_ERROR(WriteFileAtomically((temp_dir / "trainer_state.json").string(),
                                         TrainerStateJson(state_, best_model_checkpoint_)));
  // Last: its presence marks a finished checkpoint.
  CT_RETURN_IF_ERROR(WriteFileAtomically((temp_dir / kTrainerStateFileName).string(),
                                         WithChecksumLine(state_text)));
  CT_RETURN_IF_ERROR(FsyncDirectory(temp_dir.string()));
  // A checkpoint of the same step (a rerun) is replaced only once the new one is complete.
  const fs::path old = out / absl::StrCat(".old-", name);
  CT_RETURN_IF_ERROR(RemoveTree(old.string()));
  if (fs::exists(final_dir)) fs::rename(final_dir, old, error);
  fs::rename(temp_dir, final_dir, error);
  if (error) {
    return absl::InternalError(absl::StrCat("cannot rename '", temp_dir.string(), "' to '",
                                            final_dir.string(), "': ", error.message()));
  }
  // The new checkpoint is in place: a leftover old copy costs disk, not the save.
  if (const absl::Status removed = RemoveTree(old.string()); !removed.ok()) {
    LOG(WARNING) << "replaced checkpoint left behind: " << removed;
  }
  CT_RETURN_IF_ERROR(FsyncDirectory(out.string()));
  RotateCheckpoints();
  CT_LOG_RANK0(INFO) << "saved " << final_dir.string();
  return absl::OkStatus();
}

void Trainer::RotateCheckpoints() {
  if (!args_.has_save_total_limit() || args_.save_total_limit() <= 0) return;
  auto all = Checkpoints(args_.output_dir());
  int64_t limit = args_.save_total_limit();
  // Keeping only the last would delete the best one load_best_model_at_end needs.
  if (limit == 1 && args_.load_best_model_at_end() && !best_model_checkpoint_.empty() &&
      all.back().second.string() != best_model_checkpoint_) {
    limit = 2;
  }
  int64_t excess = static_cast<int64_t>(all.size()) - limit;
  for (const auto& [step, path] : all) {
    if (excess <= 0) break;
    if (path.string() == best_model_checkpoint_) continue;
    const absl::Status removed = RemoveTree(path.string());
    if (!removed.ok()) LOG(WARNING) << "save_total_limit: " << removed;
    --excess;
  }
}

absl::Status Trainer::ResumeFromCheckpoint(const std::string& requested) {
  if (requested != "latest" && requested != "true") {
    // Every rank looks (each sees the file system its own way); all go on, or none.
    CT_RETURN_IF_ERROR(AllRanksOk(
        fs::exists(fs::path(requested) / kTrainerStateFileName)
            ? absl::OkStatus()
            : absl::NotFoundError(absl::StrCat(
                  "resume_from_checkpoint is '", requested, "' but it is not a finished ",
                  "checkpoint (no ", kTrainerStateFileName,
                  "): give a checkpoint-<step> directory, or \"latest\""))));
    CT_ASSIGN_OR_RETURN(proto::TrainerCheckpointState saved, VerifyResumable(requested));
    return RestoreCheckpoint(requested, saved);
  }
  const std::string& out = args_.output_dir();
  for (const std::string& name : UnfinishedCheckpoints(out)) {
    CT_LOG_RANK0(WARNING) << "resume_from_checkpoint: latest skips '" << name << "' in " << out
                          << ": an unfinished save (the next save removes it)";
  }
  auto all = Checkpoints(out);
  CT_RETURN_IF_ERROR(SameCheckpointsOnEveryRank(*engine_, all, out));
  if (all.empty()) {
    CT_LOG_RANK0(WARNING) << "resume_from_checkpoint: latest, but '" << out
                          << "' holds no finished checkpoint-<step>: training starts from step 0";
    return absl::OkStatus();
  }
  std::vector<std::string> damaged;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    const std::string dir = it->second.string();
    absl::StatusOr<proto::TrainerCheckpointState> saved = VerifyResumable(dir);
    if (saved.ok()) {
      CT_RETURN_IF_ERROR(SameRun(dir, *saved));
      if (!damaged.empty()) {
        CT_LOG_RANK0(WARNING) << "resume_from_checkpoint: latest falls back to " << dir;
      }
      return RestoreCheckpoint(dir, *saved);
    }
    // A checkpoint that does not match the job would not match it in an older step either.
    if (saved.status().code() != absl::StatusCode::kDataLoss) return saved.status();
    CT_LOG_RANK0(WARNING) << "resume_from_checkpoint: latest skips " << dir
                          << ", which fails verification: " << saved.status().message();
    damaged.push_back(std::string(saved.status().message()));
  }
  return absl::DataLossError(
      absl::StrCat("resume_from_checkpoint: latest, but none of the ", all.size(),
                   " finished checkpoints in '", out, "' is intact: ", absl::StrJoin(damaged, "; "),
                   ". Resume from a copy, or start again without resume_from_checkpoint"));
}

absl::Status Trainer::SameRun(const std::string& dir, const proto::TrainerCheckpointState& saved) {
  // The same arguments on every rank: every rank decides alike, without a collective.
  const std::string mine = RunIdentity(args_, job_identity_);
  if (!saved.has_run_identity() || saved.run_identity() == mine) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "resume_from_checkpoint: latest found ", dir, ", but another run saved it: its run identity "
      "is ", saved.run_identity(), ", this job's is ", mine,
      " (a hash of the training arguments without the fields a resumed run may change, such as "
      "max_steps, num_train_epochs, output_dir, the logging, evaluation and saving schedule and "
      "the engine; and of the model and data configuration; trainer/run_identity.h lists them). "
      "Compare its training_args.textproto with this job's. To continue that checkpoint anyway, "
      "set resume_from_checkpoint to its path (\"", dir, "\"); to start a new run, use another "
      "output_dir"));
}

absl::StatusOr<proto::TrainerCheckpointState> Trainer::VerifyResumable(const std::string& dir) {
  absl::StatusOr<proto::TrainerCheckpointState> saved = VerifyResumableOnThisRank(dir);
  // With several ranks, each says in its own log why it refuses (rank 0's warnings and every
  // rank's error repeat it, gathered); one process says it once, below.
  if (!saved.ok() && engine_->world_size() > 1) {
    LOG(WARNING) << "this rank cannot resume from " << dir << ": " << saved.status().message();
  }
  // Every rank checked what it will read; all decide alike: DataLoss (latest then tries an
  // older checkpoint) only when every rank that failed found damage.
  CT_ASSIGN_OR_RETURN(std::vector<RankFailure> failures, GatherFailures(*engine_, saved.status()));
  if (failures.empty()) return saved;
  const bool all_damaged = std::all_of(failures.begin(), failures.end(), [](const RankFailure& f) {
    return f.code == absl::StatusCode::kDataLoss;
  });
  if (!saved.ok() && (!absl::IsDataLoss(saved.status()) || all_damaged)) return saved.status();
  // The messages name the checkpoint.
  const std::string seen = DescribeFailures(failures);
  return all_damaged ? absl::DataLossError(seen) : absl::FailedPreconditionError(seen);
}

absl::StatusOr<proto::TrainerCheckpointState> Trainer::VerifyResumableOnThisRank(
    const std::string& dir) {
  CT_ASSIGN_OR_RETURN(proto::CheckpointManifest manifest, ReadManifest(dir));
  const std::string state_path = dir + "/" + kTrainerStateFileName;
  CT_ASSIGN_OR_RETURN(proto::TrainerCheckpointState saved,
                      ReadTrainerState(state_path, HasChecksums(manifest)));
  LoadModelStateOptions options;
  options.strict = args_.load_strict();
  CT_RETURN_IF_ERROR(VerifyModelState(dir, *model_, engine_->optimizer(), options));
  if (saved.world_size() != engine_->world_size()) return saved;  // the RNG is not restored
  const std::string rng_path = RngStatePath(dir, engine_->rank());
  // Checked before it is opened: a regular file, no link, no FIFO.
  const absl::StatusOr<std::string> rng_checked =
      CheckpointFilePath(dir, fs::path(rng_path).filename().string());
  if (!rng_checked.ok() && !absl::IsNotFound(rng_checked.status())) return rng_checked.status();
  if (!rng_checked.ok()) {
    if (!saved.rng_state_saved()) return saved;  // save_only_model, or an older checkpoint
    const std::string missing = absl::StrCat(
        "checkpoint '", dir, "': '", fs::path(rng_path).filename().string(),
        "' is missing, so this rank's random state (dropout, sampling) cannot be restored and the "
        "resumed run would not continue the interrupted one");
    if (args_.load_strict()) {
      return absl::DataLossError(absl::StrCat(
          missing, "; use another checkpoint, or set load_strict: false to resume without it"));
    }
    LOG(WARNING) << missing << " (load_strict is false: resuming without it)";
    return saved;
  }
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> rng = SafetensorsFile::Open(rng_path);
  if (!rng.ok()) {
    return absl::DataLossError(absl::StrCat("checkpoint '", dir, "': '", rng_path,
                                            "' is damaged: ", rng.status().message()));
  }
  CT_RETURN_IF_ERROR((*rng)->VerifyCrc32c("cpu"));
  return saved;
}

absl::Status Trainer::RestoreCheckpoint(const std::string& dir,
                                        const proto::TrainerCheckpointState& saved) {
  LoadModelStateOptions options;
  options.strict = args_.load_strict();
  options.verified = true;  // VerifyResumable read every piece this rank loads
  absl::Status loaded = WithMasterWeights(
      [&] { return LoadModelState(dir, *model_, engine_->optimizer(), options); });
  if (loaded.ok()) loaded = RestoreRngState(dir, saved);
  // The reads are this rank's own: a rank whose read failed must not leave the others in the
  // first step's collectives.
  CT_RETURN_IF_ERROR(AllRanksOk(loaded));
  state_.global_step = saved.global_step();
  state_.epoch = saved.epoch();
  state_.num_input_tokens_seen = saved.num_input_tokens_seen();
  state_.total_flos = saved.total_flos();
  if (saved.has_best_metric()) state_.best_metric = saved.best_metric();
  if (saved.has_best_global_step()) state_.best_global_step = saved.best_global_step();
  best_model_checkpoint_ = saved.best_model_checkpoint();
  resumed_loss_total_ = saved.loss_total();
  train_loss_from_step_ = saved.has_loss_total() ? 0 : saved.global_step();
  if (!saved.has_loss_total()) {
    CT_LOG_RANK0(WARNING) << "checkpoint '" << dir << "' does not record the summed loss of its "
                          << saved.global_step()
                          << " steps (an older checkpoint): train_loss averages the resumed steps";
  }
  state_.log_history.clear();
  for (const proto::LogRecord& record : saved.log_history()) {
    state_.log_history.emplace_back(record.values().begin(), record.values().end());
  }
  if (saved.has_loss_scale()) {
    if (LossScaler* scaler = engine_->loss_scaler()) {
      scaler->Restore(saved.loss_scale(), saved.loss_scale_clean_steps());
    }
  }
  if (plateau_ && saved.has_plateau_lr()) {
    plateau_->Restore({saved.plateau_lr(), saved.plateau_best(), saved.plateau_bad_evaluations(),
                       saved.plateau_cooldown_left()});
  }
  CT_LOG_RANK0(INFO) << "resumed from " << dir << " at step " << state_.global_step;
  return absl::OkStatus();
}

absl::Status Trainer::RestoreRngState(const std::string& dir,
                                      const proto::TrainerCheckpointState& saved) {
  const std::string rng_path = RngStatePath(dir, engine_->rank());
  if (saved.world_size() != engine_->world_size()) {
    CT_LOG_RANK0(WARNING) << "checkpoint '" << dir << "' was saved by " << saved.world_size()
                          << " processes, resumed on " << engine_->world_size()
                          << ": the random state is not restored (the data order is)";
    return absl::OkStatus();
  }
  if (!fs::exists(rng_path)) return absl::OkStatus();
  CT_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(rng_path));
  CT_ASSIGN_OR_RETURN(at::Tensor rng, file->GetCopy("cpu"));
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return CatchTorch([&] { gen.set_state(rng); });
}

absl::Status Trainer::LoadBestModel() {
  // best_model_checkpoint_ is the same on every rank; whether it exists is each rank's view.
  const absl::Status found = AllRanksOk(
      best_model_checkpoint_.empty() ? absl::NotFoundError("no checkpoint holds the best model")
      : fs::exists(best_model_checkpoint_)
          ? absl::OkStatus()
          : absl::NotFoundError(absl::StrCat("the best model's checkpoint '",
                                             best_model_checkpoint_, "' is not there")));
  if (!found.ok()) {
    LOG(WARNING) << "load_best_model_at_end: " << found.message() << " ("
                 << ResolvedMetricForBestModel(args_) << "); keeping the final one";
    return absl::OkStatus();
  }
  CT_LOG_RANK0(INFO) << "loading the best model from " << best_model_checkpoint_ << " ("
                     << ResolvedMetricForBestModel(args_) << " " << *state_.best_metric << ")";
  LoadModelStateOptions options;
  options.strict = args_.load_strict();
  // Each rank reads its own rows: all agree before the next collective.
  return AllRanksOk(WithMasterWeights(
      [&] { return LoadModelState(best_model_checkpoint_, *model_, nullptr, options); }));
}

absl::Status Trainer::SaveModel(const std::string& output_dir) {
  CT_RETURN_IF_ERROR(EnsureEngine());
  const fs::path dir(output_dir.empty() ? args_.output_dir() : output_dir);
  const bool zero = engine_->rank() == 0;
  CT_RETURN_IF_ERROR(AllRanksOk(zero ? CreateDirectory(dir) : absl::OkStatus()));
  SaveModelStateOptions options;
  options.full_model = true;
  options.include_optimizer = false;
  options.engine_name = engine_->name();
  CT_RETURN_IF_ERROR(AllRanksOk(WithMasterWeights(
      [&] { return SaveModelState(dir.string(), *model_, nullptr, *engine_, options); })));
  absl::Status written = absl::OkStatus();
  if (zero) {
    std::string args_text;
    google::protobuf::TextFormat::PrintToString(args_, &args_text);
    written = WriteFileAtomically((dir / "training_args.textproto").string(), args_text);
    if (written.ok()) written = WriteModelConfig(dir.string());
  }
  CT_RETURN_IF_ERROR(AllRanksOk(written));
  CT_LOG_RANK0(INFO) << "saved the model to " << dir.string();
  return absl::OkStatus();
}

absl::Status Trainer::WriteModelConfig(const std::string& dir) {
  return WriteHfModelConfigsFor(model_->ConfigProto(), dir);
}

absl::Status Trainer::PrepareOutputDir() {
  if (!args_.resume_from_checkpoint().empty()) return absl::OkStatus();
  absl::Status local = absl::OkStatus();
  if (engine_->rank() == 0) {
    const auto found = Checkpoints(args_.output_dir());
    const fs::path metrics = fs::path(args_.output_dir()) / "metrics.jsonl";
    if (!args_.overwrite_output_dir() && !found.empty()) {
      LOG(WARNING) << "output_dir '" << args_.output_dir() << "' holds " << found.size()
                   << " checkpoint(s) of an earlier run (the newest "
                   << found.back().second.string()
                   << "); training starts from step 0 beside them: set overwrite_output_dir: "
                      "true to remove them, or resume_from_checkpoint: \"latest\" to continue";
    } else if (args_.overwrite_output_dir()) {
      for (const auto& [step, path] : found) {
        if (local.ok()) local = RemoveTree(path.string());
      }
      std::error_code error;
      fs::remove(metrics, error);
      if (local.ok() && error) {
        local = absl::InternalError(absl::StrCat("overwrite_output_dir: cannot remove '",
                                                 metrics.string(), "': ", error.message()));
      }
    }
  }
  return AllRanksOk(local);
}

}  // namespace cpptrain
