// Trainer checkpoints on one CPU process: an interrupted and resumed run ends bitwise equal to
// an uninterrupted one (AdamW state, scheduler position, data order), unfinished checkpoint
// directories are never picked, save_total_limit keeps the newest and the best, and
// load_best_model_at_end restores the best one.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/utils.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_decoder_testing.h"
#include "checkpoint/hf_model.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/test_dirs.h"
#include "gmock/gmock.h"
#include "models/configs.h"
#include "models/decoder.h"
#include "trainer/run_identity.h"
#include "trainer/testing/trainer_testing.h"
#include "trainer/trainer.h"

namespace cpptrain {
namespace {

namespace fs = std::filesystem;
using testing::Parameters;
using testing::StepLosses;
using testing::TestTempDir;
using testing::TinyDecoder;
using testing::VariableLengthTokens;

proto::TrainingArguments Args(const std::string& dir, int max_steps) {
  proto::TrainingArguments args;
  args.set_output_dir(dir);
  args.set_per_device_train_batch_size(4);
  args.set_gradient_accumulation_steps(2);
  args.set_max_steps(max_steps);
  args.set_learning_rate(1e-2);
  args.set_warmup_steps(2);
  args.set_lr_scheduler_type(proto::TrainingArguments::COSINE);
  args.set_logging_steps(1);
  args.set_save_strategy(proto::TrainingArguments::STEPS);
  args.set_save_steps(3);
  args.set_disable_tqdm(true);
  args.mutable_local()->set_device("cpu");
  return args;
}

TEST(TrainerCheckpointTest, ResumedRunIsBitwiseEqualToUninterrupted) {
  // 24 samples, 8 per step: 3 steps per epoch, so step 4 resumes inside the second epoch.
  auto data = VariableLengthTokens(24, 4);
  const std::string whole_dir = TestTempDir("whole");
  auto whole = TinyDecoder(1);
  Trainer uninterrupted(Args(whole_dir, 7), whole, data);
  ASSERT_TRUE(uninterrupted.Train().ok());
  ASSERT_TRUE(fs::exists(whole_dir + "/checkpoint-3/model.safetensors"));
  ASSERT_TRUE(fs::exists(whole_dir + "/checkpoint-6/manifest.pb"));
  // A Hugging Face model directory too: config.json beside model.safetensors.
  auto exported = LoadHfDecoderForTest(whole_dir + "/checkpoint-6");
  ASSERT_TRUE(exported.ok()) << exported.status();

  // "Interrupted" after step 3: a new process, another initialization, resumed from there.
  auto resumed_model = TinyDecoder(2);
  proto::TrainingArguments args = Args(TestTempDir("resumed"), 7);
  args.set_resume_from_checkpoint(whole_dir + "/checkpoint-3");
  Trainer resumed(args, resumed_model, data);
  auto out = resumed.Train();
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->global_step, 7);
  const auto a = Parameters(*whole), b = Parameters(*resumed_model);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i].equal(b[i])) << "parameter " << i;
  // The history comes back, then continues.
  EXPECT_EQ(StepLosses(resumed), StepLosses(uninterrupted));
}

TEST(TrainerCheckpointTest, LatestSkipsUnfinishedCheckpoints) {
  auto data = VariableLengthTokens(24, 4);
  const std::string dir = TestTempDir("latest");
  auto model = TinyDecoder(1);
  ASSERT_TRUE(Trainer(Args(dir, 3), model, data).Train().ok());
  // What a crash mid-save leaves: a temporary directory, and a checkpoint without its final
  // state file.
  fs::create_directories(dir + "/.tmp-checkpoint-9");
  fs::create_directories(dir + "/checkpoint-12");
  std::ofstream(dir + "/checkpoint-12/manifest.pb") << "partial";
  auto latest = LatestCheckpoint(dir);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(fs::path(*latest).filename(), "checkpoint-3");

  proto::TrainingArguments args = Args(dir, 6);
  args.set_resume_from_checkpoint("latest");
  auto resumed_model = TinyDecoder(2);
  Trainer resumed(args, resumed_model, data);
  auto out = resumed.Train();
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->global_step, 6);

  args.set_resume_from_checkpoint(dir + "/checkpoint-12");
  Trainer broken(args, TinyDecoder(2), data);
  auto failed = broken.Train();
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.status().message().find("not a finished checkpoint"), std::string::npos)
      << failed.status();
}

TEST(TrainerCheckpointTest, RotationKeepsNewestAndBest) {
  auto data = VariableLengthTokens(24, 4);
  const std::string dir = TestTempDir("rotation");
  proto::TrainingArguments args = Args(dir, 8);
  args.set_save_steps(2);
  args.set_save_total_limit(1);
  args.set_eval_strategy(proto::TrainingArguments::STEPS);
  args.set_eval_steps(2);
  args.set_load_best_model_at_end(true);
  args.set_metric_for_best_model("loss");
  // An eval set the model gets worse on as it trains would make step 2 the best; instead,
  // ask for the highest eval loss to make the choice deterministic.
  args.set_greater_is_better(true);
  auto model = TinyDecoder(1);
  Trainer trainer(args, model, data, VariableLengthTokens(8, 9));
  auto out = trainer.Train();
  ASSERT_TRUE(out.ok()) << out.status();
  std::vector<std::string> kept;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("checkpoint-", 0) == 0) kept.push_back(name);
  }
  std::sort(kept.begin(), kept.end());
  ASSERT_TRUE(trainer.state().best_global_step.has_value());
  const std::string best = "checkpoint-" + std::to_string(*trainer.state().best_global_step);
  // The newest and the best (one directory when they coincide).
  EXPECT_TRUE(std::find(kept.begin(), kept.end(), "checkpoint-8") != kept.end());
  EXPECT_TRUE(std::find(kept.begin(), kept.end(), best) != kept.end());
  EXPECT_LE(kept.size(), 2u);
  // load_best_model_at_end: the model now holds the best checkpoint's weights.
  auto file = SafetensorsFile::Open(dir + "/" + best + "/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  for (const auto& item : model->named_parameters()) {
    auto stored = (*file)->GetCopy(item.key());
    ASSERT_TRUE(stored.ok()) << stored.status();
    EXPECT_TRUE(stored->equal(item.value())) << item.key();
  }
}

// save_strategy BEST: a checkpoint at every evaluation that improved the best metric, none
// at the others, and load_best_model_at_end restores the best of them.
TEST(TrainerCheckpointTest, SaveStrategyBestSavesExactlyTheImprovements) {
  auto data = VariableLengthTokens(24, 4);
  const std::string dir = TestTempDir("save_best");
  proto::TrainingArguments args = Args(dir, 8);
  args.set_save_strategy(proto::TrainingArguments::BEST);
  args.set_eval_strategy(proto::TrainingArguments::STEPS);
  args.set_eval_steps(1);
  args.set_load_best_model_at_end(true);
  args.set_metric_for_best_model("loss");
  auto model = TinyDecoder(1);
  Trainer trainer(args, model, data, VariableLengthTokens(8, 9));
  auto out = trainer.Train();
  ASSERT_TRUE(out.ok()) << out.status();
  // The steps whose eval_loss was below every earlier one.
  std::vector<std::string> improved;
  double best = std::numeric_limits<double>::infinity();
  for (const Metrics& m : trainer.state().log_history) {
    if (!m.count("eval_loss") || !(m.at("eval_loss") < best)) continue;
    best = m.at("eval_loss");
    improved.push_back("checkpoint-" + std::to_string(static_cast<int>(m.at("step"))));
  }
  std::vector<std::string> kept;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("checkpoint-", 0) == 0) kept.push_back(name);
  }
  std::sort(kept.begin(), kept.end());
  std::sort(improved.begin(), improved.end());
  ASSERT_FALSE(improved.empty());
  EXPECT_EQ(kept, improved);
  ASSERT_TRUE(trainer.state().best_global_step.has_value());
  const std::string best_dir =
      dir + "/checkpoint-" + std::to_string(*trainer.state().best_global_step);
  auto file = SafetensorsFile::Open(best_dir + "/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  for (const auto& item : model->named_parameters()) {
    auto stored = (*file)->GetCopy(item.key());
    ASSERT_TRUE(stored.ok()) << stored.status();
    EXPECT_TRUE(stored->equal(item.value())) << item.key();
  }
}

TEST(TrainerCheckpointTest, SaveOnlyModelWritesNoOptimizerState) {
  auto data = VariableLengthTokens(24, 4);
  const std::string dir = TestTempDir("only_model");
  proto::TrainingArguments args = Args(dir, 3);
  args.set_save_only_model(true);
  ASSERT_TRUE(Trainer(args, TinyDecoder(1), data).Train().ok());
  EXPECT_TRUE(fs::exists(dir + "/checkpoint-3/model.safetensors"));
  EXPECT_FALSE(fs::exists(dir + "/checkpoint-3/shard-00000-of-00001.safetensors"));
  EXPECT_FALSE(fs::exists(dir + "/checkpoint-3/rng_state_0.safetensors"));
}

// ---------------------------------------------------------------------------------------------
// Damaged checkpoints and strict loading

using ::testing::AllOf;
using ::testing::HasSubstr;

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// Overwrites the first 4 data bytes of tensor `key` in `path` with a float NaN, keeping the
// header (and so the stored checksum) as it was: what a careless edit or a bad disk does.
void WriteNanInto(const std::string& path, const std::string& key) {
  int64_t begin = 0;
  {
    auto file = SafetensorsFile::Open(path);
    ASSERT_TRUE(file.ok()) << file.status();
    begin = (*file)->Info(key)->begin;
  }
  std::string bytes = ReadBytes(path);
  uint64_t header = 0;
  std::memcpy(&header, bytes.data(), 8);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(&bytes[8 + header + begin], &nan, 4);
  WriteBytes(path, bytes);
}

constexpr char kWeight[] = "model.layers.0.mlp.up_proj.weight";

// checkpoint-3 and checkpoint-6 of an uninterrupted 6-step run in `dir`; returns its losses.
std::vector<double> TrainSixSteps(const std::string& dir) {
  Trainer trainer(Args(dir, 6), TinyDecoder(1), VariableLengthTokens(24, 4));
  auto out = trainer.Train();
  EXPECT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(fs::exists(dir + "/checkpoint-6/" + kTrainerStateFileName));
  return StepLosses(trainer);
}

absl::StatusOr<TrainOutput> Resume(const std::string& dir, const std::string& from, int steps,
                                   std::string* log = nullptr, bool strict = true,
                                   std::shared_ptr<DecoderLM> model = nullptr) {
  proto::TrainingArguments args = Args(dir, steps);
  args.set_resume_from_checkpoint(from);
  args.set_load_strict(strict);
  Trainer trainer(args, model ? model : TinyDecoder(2), VariableLengthTokens(24, 4));
  if (log != nullptr) ::testing::internal::CaptureStderr();
  auto out = trainer.Train();
  if (log != nullptr) *log = ::testing::internal::GetCapturedStderr();
  if (out.ok()) EXPECT_GE(StepLosses(trainer).size(), static_cast<size_t>(steps));
  return out;
}

TEST(TrainerCheckpointIntegrityTest, LatestFallsBackPastADamagedCheckpointWithAWarning) {
  const std::string dir = TestTempDir("latest_damaged");
  TrainSixSteps(dir);
  WriteNanInto(dir + "/checkpoint-6/model.safetensors", kWeight);

  std::string log;
  auto out = Resume(dir, "latest", 6, &log);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->global_step, 6);
  EXPECT_THAT(log, AllOf(HasSubstr("latest skips " + dir +
                                   "/checkpoint-6, which fails "
                                   "verification"),
                         HasSubstr(std::string("file 'model.safetensors', tensor '") + kWeight),
                         HasSubstr("checksum mismatch"),
                         HasSubstr("latest falls back to " + dir + "/checkpoint-3")));
}

TEST(TrainerCheckpointIntegrityTest, ResumedFromTheFallbackEqualsTheUninterruptedRun) {
  const std::string dir = TestTempDir("fallback_equal");
  auto data = VariableLengthTokens(24, 4);
  auto whole = TinyDecoder(1);
  Trainer uninterrupted(Args(dir, 6), whole, data);
  ASSERT_TRUE(uninterrupted.Train().ok());
  const std::string bytes = ReadBytes(dir + "/checkpoint-6/manifest.pb");
  WriteBytes(dir + "/checkpoint-6/manifest.pb", bytes.substr(0, bytes.size() / 2));

  const std::string resumed_dir = TestTempDir("fallback_equal_resumed");
  fs::create_directories(resumed_dir);
  fs::copy(dir + "/checkpoint-3", resumed_dir + "/checkpoint-3", fs::copy_options::recursive);
  fs::copy(dir + "/checkpoint-6", resumed_dir + "/checkpoint-6", fs::copy_options::recursive);
  proto::TrainingArguments args = Args(resumed_dir, 6);
  args.set_resume_from_checkpoint("latest");
  auto model = TinyDecoder(2);
  Trainer resumed(args, model, data);
  auto out = resumed.Train();
  ASSERT_TRUE(out.ok()) << out.status();
  const auto a = Parameters(*whole), b = Parameters(*model);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i].equal(b[i])) << "parameter " << i;
  EXPECT_EQ(StepLosses(resumed), StepLosses(uninterrupted));
}

TEST(TrainerCheckpointIntegrityTest, ExplicitDamagedPathIsAnErrorWithoutFallback) {
  const std::string dir = TestTempDir("explicit_damaged");
  TrainSixSteps(dir);
  WriteNanInto(dir + "/checkpoint-6/" + ShardFileName(0, 1),
               std::string("optimizer.") + kWeight + ".exp_avg");
  auto out = Resume(dir, dir + "/checkpoint-6", 8);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kDataLoss) << out.status();
  EXPECT_THAT(std::string(out.status().message()),
              AllOf(HasSubstr(dir + "/checkpoint-6"), HasSubstr(ShardFileName(0, 1)),
                    HasSubstr(std::string("optimizer.") + kWeight + ".exp_avg"),
                    HasSubstr("checksum mismatch: expected crc32c ")));
}

TEST(TrainerCheckpointIntegrityTest, UnfinishedFirstSaveIsSkippedAndTrainingStartsOver) {
  // What a kill during the first save leaves: only .tmp-checkpoint-3, without its state file.
  const std::string first = TestTempDir("first_save_source");
  TrainSixSteps(first);
  const std::string dir = TestTempDir("first_save_killed");
  fs::create_directories(dir);
  fs::copy(first + "/checkpoint-3", dir + "/.tmp-checkpoint-3", fs::copy_options::recursive);
  fs::remove(dir + "/.tmp-checkpoint-3/" + kTrainerStateFileName);

  std::string log;
  auto out = Resume(dir, "latest", 6, &log);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->global_step, 6);
  EXPECT_THAT(log, AllOf(HasSubstr("latest skips '.tmp-checkpoint-3'"),
                         HasSubstr("holds no finished checkpoint-<step>: training starts from "
                                   "step 0")));
  EXPECT_FALSE(fs::exists(dir + "/.tmp-checkpoint-3"));  // the first save cleared it
  EXPECT_TRUE(fs::exists(dir + "/checkpoint-6/" + kTrainerStateFileName));
}

// resume_from_checkpoint: latest with a FIFO in place of `file` of checkpoint-6: skipped
// without blocking (under a timeout), with a warning naming it, and checkpoint-3 resumed.
void ExpectLatestSkipsFifo(const std::string& dir, const std::string& file) {
  TrainSixSteps(dir);
  const std::string fifo = dir + "/checkpoint-6/" + file;
  fs::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  std::string log;
  auto out = WithinTimeout<absl::StatusOr<TrainOutput>>(
      {fifo}, [&] { return Resume(dir, "latest", 6, &log); });
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->global_step, 6);
  EXPECT_THAT(log, AllOf(HasSubstr("latest skips " + dir + "/checkpoint-6, which fails"),
                         HasSubstr("'" + file + "' is a FIFO (named pipe), not a regular file"),
                         HasSubstr("latest falls back to " + dir + "/checkpoint-3")));
}

TEST(TrainerCheckpointIntegrityTest, LatestSkipsAFifoInPlaceOfTheModelFile) {
  ExpectLatestSkipsFifo(TestTempDir("latest_fifo_model"), "model.safetensors");
}

TEST(TrainerCheckpointIntegrityTest, LatestSkipsAFifoInPlaceOfTheManifest) {
  ExpectLatestSkipsFifo(TestTempDir("latest_fifo_manifest"), kManifestFileName);
}

TEST(TrainerCheckpointIntegrityTest, ExplicitPathWithALinkedOrFifoFileIsRefused) {
  const std::string dir = TestTempDir("explicit_link");
  TrainSixSteps(dir);
  const std::string ckpt = dir + "/checkpoint-6";
  fs::rename(ckpt + "/model.safetensors", dir + "/outside.safetensors");
  fs::create_symlink(dir + "/outside.safetensors", ckpt + "/model.safetensors");
  auto out = Resume(dir, ckpt, 8);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kDataLoss) << out.status();
  EXPECT_THAT(std::string(out.status().message()),
              HasSubstr("'model.safetensors' is a symbolic link"));

  fs::remove(ckpt + "/rng_state_0.safetensors");
  ASSERT_EQ(::mkfifo((ckpt + "/rng_state_0.safetensors").c_str(), 0644), 0);
  fs::remove(ckpt + "/model.safetensors");
  fs::rename(dir + "/outside.safetensors", ckpt + "/model.safetensors");
  out = WithinTimeout<absl::StatusOr<TrainOutput>>(
      {ckpt + "/rng_state_0.safetensors"}, [&] { return Resume(dir, ckpt, 8); });
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(std::string(out.status().message()),
              HasSubstr("'rng_state_0.safetensors' is a FIFO (named pipe), not a regular file"));
}

TEST(TrainerCheckpointIntegrityTest, LatestSkipsACheckpointWithoutItsManifest) {
  const std::string dir = TestTempDir("latest_no_manifest");
  TrainSixSteps(dir);
  fs::remove(dir + "/checkpoint-6/" + kManifestFileName);
  std::string log;
  auto out = Resume(dir, "latest", 6, &log);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->global_step, 6);
  EXPECT_THAT(log, AllOf(HasSubstr("latest skips " + dir + "/checkpoint-6, which fails"),
                         HasSubstr("checkpoint-6/manifest.pb' is missing"),
                         HasSubstr("latest falls back to " + dir + "/checkpoint-3")));
  // Named explicitly (the resumed run saved checkpoint-6 again), an error naming the file.
  fs::remove(dir + "/checkpoint-6/" + kManifestFileName);
  out = Resume(dir, dir + "/checkpoint-6", 8);
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("manifest.pb' is missing"));
}

// A job of another configuration started on an output_dir that holds another run's
// checkpoints (as a job killed before its first save and restarted with latest finds them):
// latest refuses them, naming both identities and the way to continue anyway; the explicit
// path continues; the same run with more steps (max_steps is not part of the identity) resumes.
TEST(TrainerCheckpointIntegrityTest, LatestRefusesAnotherRunsCheckpoint) {
  const std::string dir = TestTempDir("another_run");
  TrainSixSteps(dir);  // learning_rate 1e-2
  proto::TrainingArguments other = Args(dir, 6);
  other.set_learning_rate(2e-2);
  const std::string theirs = RunIdentity(Args(dir, 6));
  const std::string mine = RunIdentity(other);
  ASSERT_NE(theirs, mine);
  other.set_resume_from_checkpoint("latest");
  {
    Trainer trainer(other, TinyDecoder(2), VariableLengthTokens(24, 4));
    auto out = trainer.Train();
    ASSERT_FALSE(out.ok());
    EXPECT_EQ(out.status().code(), absl::StatusCode::kFailedPrecondition) << out.status();
    EXPECT_THAT(std::string(out.status().message()),
                AllOf(HasSubstr("latest found " + dir + "/checkpoint-6, but another run saved it"),
                      HasSubstr("its run identity is " + theirs + ", this job's is " + mine),
                      HasSubstr("set resume_from_checkpoint to its path")));
  }
  other.set_resume_from_checkpoint(dir + "/checkpoint-6");
  other.set_max_steps(9);
  {
    Trainer trainer(other, TinyDecoder(2), VariableLengthTokens(24, 4));
    auto out = trainer.Train();
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(out->global_step, 9);
  }
  // checkpoint-9 is the other run's: latest with its arguments and more steps continues it.
  other.set_resume_from_checkpoint("latest");
  other.set_max_steps(12);
  {
    std::string log;
    Trainer trainer(other, TinyDecoder(2), VariableLengthTokens(24, 4));
    ::testing::internal::CaptureStderr();
    auto out = trainer.Train();
    log = ::testing::internal::GetCapturedStderr();
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(out->global_step, 12);
    EXPECT_THAT(log, HasSubstr("resumed from " + dir + "/checkpoint-9 at step 9"));
  }
}

TEST(RunIdentityTest, IgnoresWhatAResumeMayChangeAndNamesRealFields) {
  proto::TrainingArguments args = Args("/a", 6);
  const std::string base = RunIdentity(args);
  EXPECT_EQ(base.size(), 16u);
  proto::TrainingArguments changed = args;
  changed.set_output_dir("/b");
  changed.set_max_steps(100);
  changed.set_save_steps(7);
  changed.set_resume_from_checkpoint("latest");
  changed.mutable_ddp();
  EXPECT_EQ(RunIdentity(changed), base);
  changed.set_seed(7);
  EXPECT_NE(RunIdentity(changed), base);
  EXPECT_NE(RunIdentity(args, "data a"), RunIdentity(args, "data b"));
  for (const std::string& name : RunIdentityIgnoredFields()) {
    EXPECT_NE(proto::TrainingArguments::descriptor()->FindFieldByName(name), nullptr) << name;
  }
}

TEST(TrainerCheckpointIntegrityTest, MissingRngStateIsAnErrorUnlessNotStrict) {
  const std::string dir = TestTempDir("missing_rng");
  TrainSixSteps(dir);
  fs::remove(dir + "/checkpoint-6/rng_state_0.safetensors");
  auto out = Resume(dir, dir + "/checkpoint-6", 8);
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(std::string(out.status().message()),
              AllOf(HasSubstr("'rng_state_0.safetensors' is missing"),
                    HasSubstr("set load_strict: false to resume without it")));
  std::string log;
  out = Resume(dir, dir + "/checkpoint-6", 8, &log, /*strict=*/false);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(log, HasSubstr("load_strict is false: resuming without it"));
}

TEST(TrainerCheckpointIntegrityTest, DamagedTrainerStateSaysSo) {
  const std::string dir = TestTempDir("damaged_state");
  TrainSixSteps(dir);
  const std::string path = dir + "/checkpoint-6/" + kTrainerStateFileName;
  std::string text = ReadBytes(path);
  text[text.find("global_step: 6") + 13] = '9';
  WriteBytes(path, text);
  auto out = Resume(dir, dir + "/checkpoint-6", 8);
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(std::string(out.status().message()),
              HasSubstr("trainer_state.textproto' is corrupted (checksum mismatch"));
}

TEST(TrainerCheckpointIntegrityTest, StrictResumeRefusesAnotherModelConfig) {
  const std::string dir = TestTempDir("strict_resume");
  TrainSixSteps(dir);  // the tiny decoder has qk_norm
  proto::DecoderConfig without = NamedDecoderConfig("tiny").value();
  without.set_qk_norm(false);
  torch::manual_seed(2);
  auto out = Resume(dir, dir + "/checkpoint-6", 8, nullptr, true, BuildDecoder(without).value());
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(out.status().message()),
              AllOf(HasSubstr("qk_norm is true in the checkpoint but false in the model"),
                    HasSubstr("unexpected tensor 'model.layers.0.self_attn.q_norm.weight'")));

  // "latest" does not fall back past a mismatch: every older checkpoint has the same model.
  out = Resume(dir, "latest", 8, nullptr, true, BuildDecoder(without).value());
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);

  proto::DecoderConfig theta = NamedDecoderConfig("tiny").value();
  theta.set_rope_theta(1e6);
  out = Resume(dir, dir + "/checkpoint-6", 8, nullptr, true, BuildDecoder(theta).value());
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(std::string(out.status().message()),
              HasSubstr("rope_theta is 10000 in the checkpoint but 1000000 in the model"));

  std::string log;
  out =
      Resume(dir, dir + "/checkpoint-6", 8, &log, /*strict=*/false, BuildDecoder(without).value());
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(log, HasSubstr("unexpected tensor 'model.layers.1.self_attn.k_norm.weight'"));
}

}  // namespace
}  // namespace cpptrain
