// Checkpoint integrity and strict loading on real files: checksums written by SaveModelState
// into the manifest and every safetensors header; a changed byte in model.safetensors, in a
// shard file or in the manifest, a truncated file and non-finite values refused with errors
// that name the directory, the file and the tensor; an older checkpoint without checksums
// loading with one warning; and strict loading that refuses a model of another configuration
// (qk_norm, attention_bias, rope_theta), naming the fields, unless strict is off. The test-only
// fault injection (a failed write or read) that tests/distributed/checkpoint_faults_test.sh
// runs on one rank of several.
#include "checkpoint/checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/torch_compat.h"
#include "checkpoint/hf_model.h"
#include "checkpoint/internal/checkpoint_files.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/test_dirs.h"
#include "checkpoint/verify.h"
#include "models/configs.h"
#include "models/decoder.h"
#include "sharding/host_group.h"

namespace cpptrain {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

proto::DecoderConfig Tiny() { return NamedDecoderConfig("tiny").value(); }

std::shared_ptr<DecoderLM> Build(const proto::DecoderConfig& config, uint64_t seed) {
  torch::manual_seed(seed);
  absl::StatusOr<std::shared_ptr<DecoderLM>> model = BuildDecoder(config);
  EXPECT_TRUE(model.ok()) << model.status();
  return *model;
}

std::map<std::string, at::Tensor> Snapshot(DecoderLM& model) {
  std::map<std::string, at::Tensor> out;
  for (const auto& item : model.named_parameters()) out[item.key()] = item.value().detach().clone();
  return out;
}

void ExpectParameters(DecoderLM& model, const std::map<std::string, at::Tensor>& want) {
  for (const auto& item : model.named_parameters()) {
    ASSERT_EQ(want.count(item.key()), 1u) << item.key();
    EXPECT_TRUE(item.value().equal(want.at(item.key()))) << item.key();
  }
}

// One AdamW step on sum(p^2), so the optimizer holds exp_avg, exp_avg_sq and step.
std::unique_ptr<torch::optim::AdamW> SteppedAdamW(DecoderLM& model) {
  auto adamw =
      std::make_unique<torch::optim::AdamW>(model.parameters(), torch::optim::AdamWOptions(1e-2));
  at::Tensor loss = torch::zeros({});
  for (const auto& p : model.parameters()) loss = loss + p.pow(2).sum();
  loss.backward();
  adamw->step();
  adamw->zero_grad();
  return adamw;
}

void Save(const std::string& dir, DecoderLM& model, torch::optim::Optimizer* optimizer,
          bool full_model) {
  SingleProcessGroup alone;
  SaveModelStateOptions options;
  options.full_model = full_model;
  const absl::Status saved = SaveModelState(dir, model, optimizer, alone, options);
  ASSERT_TRUE(saved.ok()) << saved;
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// Changes one byte of tensor `key`'s data in the safetensors file `path` (its header intact).
void ChangeTensorByte(const std::string& path, const std::string& key) {
  int64_t begin = 0;
  {
    auto file = SafetensorsFile::Open(path);
    ASSERT_TRUE(file.ok()) << file.status();
    begin = (*file)->Info(key)->begin;
  }
  std::string bytes = ReadBytes(path);
  uint64_t header = 0;
  std::memcpy(&header, bytes.data(), 8);
  bytes[8 + header + begin + 1] ^= 0x10;
  WriteBytes(path, bytes);
}

std::string LoadError(const std::string& dir, DecoderLM& model,
                      torch::optim::Optimizer* optimizer = nullptr,
                      absl::StatusCode code = absl::StatusCode::kDataLoss) {
  const std::map<std::string, at::Tensor> before = Snapshot(model);
  const absl::Status status = LoadModelState(dir, model, optimizer);
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(status.code(), code) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr(dir));
  ExpectParameters(model, before);  // nothing was loaded
  return std::string(status.message());
}

constexpr char kQProj[] = "model.layers.1.self_attn.q_proj.weight";

TEST(CheckpointIntegrityTest, ChecksumsAreInTheManifestAndEveryHeader) {
  const std::string dir = FreshTestDir();
  auto model = Build(Tiny(), 1);
  auto adamw = SteppedAdamW(*model);
  Save(dir, *model, adamw.get(), /*full_model=*/true);
  auto manifest = ReadManifest(dir);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->format_version(), 2);
  EXPECT_TRUE(manifest->has_manifest_crc32c());
  EXPECT_EQ(manifest->decoder().rope_theta(), Tiny().rope_theta());
  std::map<std::string, std::unique_ptr<SafetensorsFile>> files;
  int pieces = 0;
  for (const proto::CheckpointTensor& t : manifest->tensors()) {
    for (const proto::TensorPiece& piece : t.pieces()) {
      ++pieces;
      ASSERT_TRUE(piece.has_crc32c()) << t.name();
      auto& file = files[piece.file()];
      if (file == nullptr) file = SafetensorsFile::Open(dir + "/" + piece.file()).value();
      EXPECT_EQ(file->StoredCrc32c(piece.key()).value(), piece.crc32c()) << t.name();
      EXPECT_EQ(file->ComputeCrc32c(piece.key()).value(), piece.crc32c()) << t.name();
    }
  }
  EXPECT_EQ(files.size(), 2u);  // model.safetensors, and the shard file with the optimizer state
  EXPECT_GT(pieces, 3 * static_cast<int>(model->named_parameters().size()));

  auto report = VerifyCheckpoint(dir);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->problems.empty()) << report->problems.front();
  EXPECT_EQ(static_cast<int>(report->pieces.size()), pieces);
  EXPECT_EQ(report->unchecksummed_pieces, 0);
}

TEST(CheckpointIntegrityTest, ChangedByteInModelSafetensorsIsAChecksumMismatch) {
  const std::string dir = FreshTestDir();
  Save(dir, *Build(Tiny(), 1), nullptr, /*full_model=*/true);
  ChangeTensorByte(dir + "/model.safetensors", kQProj);
  auto other = Build(Tiny(), 2);
  EXPECT_THAT(LoadError(dir, *other),
              AllOf(HasSubstr("file 'model.safetensors', tensor '" + std::string(kQProj) + "'"),
                    HasSubstr("checksum mismatch: expected crc32c "), HasSubstr(", computed "),
                    HasSubstr("use another checkpoint")));
  auto report = VerifyCheckpoint(dir);
  ASSERT_TRUE(report.ok());
  ASSERT_EQ(report->problems.size(), 1u);
  EXPECT_THAT(std::string(report->problems[0].message()), HasSubstr(kQProj));
}

TEST(CheckpointIntegrityTest, ChangedByteInAShardFileIsAChecksumMismatch) {
  const std::string dir = FreshTestDir();
  auto model = Build(Tiny(), 1);
  auto adamw = SteppedAdamW(*model);
  Save(dir, *model, adamw.get(), /*full_model=*/false);
  const std::string shard = dir + "/" + ShardFileName(0, 1);
  ChangeTensorByte(shard, std::string("optimizer.") + kQProj + ".exp_avg_sq");
  auto other = Build(Tiny(), 2);
  auto other_adamw = SteppedAdamW(*other);
  EXPECT_THAT(LoadError(dir, *other, other_adamw.get()),
              AllOf(HasSubstr("file '" + ShardFileName(0, 1) + "', tensor 'optimizer." +
                              std::string(kQProj) + ".exp_avg_sq'"),
                    HasSubstr("checksum mismatch")));
  // The weights are intact: loading without the optimizer reads only them.
  EXPECT_TRUE(LoadModelState(dir, *other, nullptr).ok());
  ExpectParameters(*other, Snapshot(*model));
}

TEST(CheckpointIntegrityTest, DamagedManifestSaysItIsCorrupted) {
  const std::string dir = FreshTestDir();
  Save(dir, *Build(Tiny(), 1), nullptr, /*full_model=*/true);
  const std::string path = dir + "/manifest.pb";
  const std::string good = ReadBytes(path);
  auto model = Build(Tiny(), 2);

  // A byte inside a tensor name: still parses, names another tensor; the checksum tells.
  std::string renamed = good;
  const size_t at = renamed.find("self_attn");
  ASSERT_NE(at, std::string::npos);
  renamed[at] = 'S';
  WriteBytes(path, renamed);
  EXPECT_THAT(LoadError(dir, *model),
              AllOf(HasSubstr("manifest.pb' is corrupted (checksum mismatch: expected crc32c"),
                    Not(HasSubstr("another model"))));

  WriteBytes(path, std::string(40, '\xff'));
  EXPECT_THAT(LoadError(dir, *model), HasSubstr("manifest.pb' is corrupted (could not be parsed"));

  WriteBytes(path, good.substr(0, good.size() - 3));  // truncated
  EXPECT_THAT(LoadError(dir, *model), HasSubstr("manifest.pb' is corrupted"));

  WriteBytes(path, good);
  EXPECT_TRUE(LoadModelState(dir, *model, nullptr).ok());
}

TEST(CheckpointIntegrityTest, TruncatedDataFileIsNamed) {
  const std::string dir = FreshTestDir();
  Save(dir, *Build(Tiny(), 1), nullptr, /*full_model=*/true);
  const std::string bytes = ReadBytes(dir + "/model.safetensors");
  WriteBytes(dir + "/model.safetensors", bytes.substr(0, bytes.size() - 100));
  auto model = Build(Tiny(), 2);
  EXPECT_THAT(LoadError(dir, *model),
              AllOf(HasSubstr("file 'model.safetensors' is damaged"), HasSubstr("truncated")));
}

TEST(CheckpointIntegrityTest, NonFiniteWeightsAndOptimizerStateAreRefused) {
  const std::string dir = FreshTestDir();
  auto model = Build(Tiny(), 1);
  {
    torch::NoGradGuard no_grad;
    model->named_parameters()[kQProj][3][5] = std::nan("");
  }
  Save(dir, *model, nullptr, /*full_model=*/true);  // a diverged run: checksums match
  auto other = Build(Tiny(), 2);
  EXPECT_THAT(LoadError(dir, *other),
              AllOf(HasSubstr(std::string("tensor ") + kQProj + " holds 1 non-finite value"),
                    HasSubstr("in row 3"), HasSubstr("NaN or infinite")));

  const std::string dir2 = dir + "/optimizer";
  fs::create_directories(dir2);
  auto finite = Build(Tiny(), 1);
  auto adamw = SteppedAdamW(*finite);
  {
    torch::NoGradGuard no_grad;
    for (auto& group : adamw->param_groups()) {
      for (auto& p : group.params()) {
        auto* state =
            static_cast<torch::optim::AdamWParamState*>(FindOptimizerParamState(*adamw, p));
        state->exp_avg_sq().fill_(std::numeric_limits<float>::infinity());
      }
    }
  }
  Save(dir2, *finite, adamw.get(), /*full_model=*/true);
  auto other_adamw = SteppedAdamW(*other);
  EXPECT_THAT(LoadError(dir2, *other, other_adamw.get()),
              AllOf(HasSubstr(".exp_avg_sq holds"), HasSubstr("non-finite values")));
}

TEST(CheckpointIntegrityTest, CheckFiniteFindsNanAndInfinityInEveryFloatingDtype) {
  for (at::ScalarType dtype : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf}) {
    SCOPED_TRACE(c10::toString(dtype));
    at::Tensor values = at::ones({4, 3}, dtype);
    EXPECT_TRUE(checkpoint_internal::CheckFinite("here", "w", values, 0).ok());
    for (double bad : {std::nan(""), std::numeric_limits<double>::infinity(),
                       -std::numeric_limits<double>::infinity()}) {
      at::Tensor copy = values.clone();
      copy[2][1] = bad;
      const absl::Status status = checkpoint_internal::CheckFinite("here", "w", copy, 10);
      EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
      EXPECT_THAT(std::string(status.message()),
                  AllOf(HasSubstr("here: tensor w holds 1 non-finite value"), HasSubstr("row 12")));
    }
  }
  EXPECT_TRUE(checkpoint_internal::CheckFinite("here", "i", at::ones({3}, at::kLong), 0).ok());
}

// A checkpoint of format 1, as written before checksums: the manifest without them (and
// without the decoder config), the data files without them in their headers.
void StripChecksums(const std::string& dir) {
  proto::CheckpointManifest manifest = ReadManifest(dir).value();
  manifest.clear_format_version();
  manifest.clear_decoder();
  manifest.clear_manifest_crc32c();
  std::set<std::string> files;
  for (auto& t : *manifest.mutable_tensors()) {
    for (auto& piece : *t.mutable_pieces()) {
      piece.clear_crc32c();
      files.insert(piece.file());
    }
  }
  WriteBytes(dir + "/manifest.pb", manifest.SerializeAsString());
  SafetensorsWriteOptions plain;
  plain.checksums = false;
  for (const std::string& name : files) {
    auto file = SafetensorsFile::Open(dir + "/" + name).value();
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    for (const std::string& key : file->names())
      tensors.emplace_back(key, file->GetCopy(key).value());
    const std::map<std::string, std::string> metadata = file->metadata();
    file.reset();
    ASSERT_TRUE(WriteSafetensors(dir + "/" + name, tensors, metadata, plain).ok());
  }
}

TEST(CheckpointIntegrityTest, CheckpointWithoutChecksumsLoadsWithOneWarning) {
  const std::string dir = FreshTestDir();
  auto model = Build(Tiny(), 1);
  Save(dir, *model, nullptr, /*full_model=*/true);
  StripChecksums(dir);
  EXPECT_THAT(ReadBytes(dir + "/model.safetensors"), Not(HasSubstr("crc32c")));
  auto other = Build(Tiny(), 2);
  ::testing::internal::CaptureStderr();
  const absl::Status loaded = LoadModelState(dir, *other, nullptr);
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(loaded.ok()) << loaded;
  ExpectParameters(*other, Snapshot(*model));
  EXPECT_THAT(log, HasSubstr("has no checksums (manifest format 1"));
  EXPECT_EQ(log.find("has no checksums"), log.rfind("has no checksums")) << log;  // once
  auto report = VerifyCheckpoint(dir);
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(report->problems.empty());
  EXPECT_EQ(report->unchecksummed_pieces, static_cast<int64_t>(report->pieces.size()));
}

TEST(CheckpointIntegrityTest, ChecksummedTextFilesVerify) {
  const std::string path = FreshTestDir() + "/state.textproto";
  WriteBytes(path, WithChecksumLine("global_step: 6\n"));
  EXPECT_THAT(ReadBytes(path), HasSubstr("# crc32c "));
  EXPECT_EQ(ReadChecksummedText(path, /*required=*/true).value(), "global_step: 6\n");
  std::string bytes = ReadBytes(path);
  bytes[13] = '9';
  WriteBytes(path, bytes);
  EXPECT_THAT(std::string(ReadChecksummedText(path, true).status().message()),
              AllOf(HasSubstr(path), HasSubstr("is corrupted (checksum mismatch")));
  WriteBytes(path, "global_step: 6\n");  // an older file, without the line
  EXPECT_TRUE(ReadChecksummedText(path, /*required=*/false).ok());
  EXPECT_THAT(std::string(ReadChecksummedText(path, true).status().message()),
              HasSubstr("checksum line is missing"));
}

// ---------------------------------------------------------------------------------------------
// Strict loading

std::string StrictError(const proto::DecoderConfig& saved, const proto::DecoderConfig& loaded) {
  const std::string dir = FreshTestDir();
  Save(dir, *Build(saved, 1), nullptr, /*full_model=*/true);
  auto model = Build(loaded, 2);
  return LoadError(dir, *model, nullptr, absl::StatusCode::kInvalidArgument);
}

TEST(CheckpointStrictTest, QkNormCheckpointIntoAModelWithoutIt) {
  proto::DecoderConfig without = Tiny();
  without.set_qk_norm(false);
  EXPECT_THAT(
      StrictError(Tiny(), without),
      AllOf(HasSubstr("does not match the model"), HasSubstr("nothing was loaded"),
            HasSubstr("config fields that differ or probably differ: qk_norm"),
            HasSubstr("qk_norm is true in the checkpoint but false in the model"),
            HasSubstr("unexpected tensor 'model.layers.0.self_attn.q_norm.weight' (shape [8])"),
            HasSubstr("unexpected tensor 'model.layers.1.self_attn.k_norm.weight'"),
            HasSubstr("set load_strict: false")));
}

TEST(CheckpointStrictTest, BiasedCheckpointIntoABiasFreeModelAndBack) {
  proto::DecoderConfig biased = Tiny();
  biased.set_attention_bias(true);
  EXPECT_THAT(StrictError(biased, Tiny()),
              AllOf(HasSubstr("attention_bias is true in the checkpoint but false in the model"),
                    HasSubstr("unexpected tensor 'model.layers.0.self_attn.q_proj.bias'"),
                    HasSubstr("(config field attention_bias probably differs)")));
  EXPECT_THAT(StrictError(Tiny(), biased),
              AllOf(HasSubstr("missing tensor 'model.layers.0.self_attn.q_proj.bias'"),
                    HasSubstr("(config field attention_bias probably differs)")));
}

TEST(CheckpointStrictTest, RopeThetaAndShapesNameTheFieldAndBothValues) {
  proto::DecoderConfig theta = Tiny();
  theta.set_rope_theta(500000);
  EXPECT_THAT(StrictError(Tiny(), theta),
              AllOf(HasSubstr("1 problem;"),
                    HasSubstr("rope_theta is 10000 in the checkpoint but 500000 in the model")));
  proto::DecoderConfig wider = Tiny();
  wider.set_intermediate_size(2 * Tiny().intermediate_size());
  EXPECT_THAT(StrictError(Tiny(), wider),
              AllOf(HasSubstr("intermediate_size is 64 in the checkpoint but 128 in the model"),
                    HasSubstr("tensor 'model.layers.0.mlp.up_proj.weight' has shape [64, 32] "
                              "saved but [128, 32] in the model")));
}

TEST(CheckpointStrictTest, OlderCheckpointIsComparedWithItsConfigJson) {
  const std::string dir = FreshTestDir();
  auto model = Build(Tiny(), 1);
  Save(dir, *model, nullptr, /*full_model=*/true);
  StripChecksums(dir);  // no decoder config in the manifest
  ASSERT_TRUE(WriteHfConfig(Tiny(), dir + "/config.json").ok());
  proto::DecoderConfig theta = Tiny();
  theta.set_rope_theta(1e6);
  auto other = Build(theta, 2);
  EXPECT_THAT(LoadError(dir, *other, nullptr, absl::StatusCode::kInvalidArgument),
              HasSubstr("rope_theta is 10000 in the checkpoint's config.json but 1000000"));
}

TEST(CheckpointStrictTest, NotStrictWarnsPerTensorAndLoadsWhatMatches) {
  const std::string dir = FreshTestDir();
  auto saved = Build(Tiny(), 1);
  Save(dir, *saved, nullptr, /*full_model=*/true);
  proto::DecoderConfig without = Tiny();
  without.set_qk_norm(false);
  auto model = Build(without, 2);
  LoadModelStateOptions options;
  options.strict = false;
  ::testing::internal::CaptureStderr();
  const absl::Status loaded = LoadModelState(dir, *model, nullptr, options);
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(loaded.ok()) << loaded;
  std::map<std::string, at::Tensor> want = Snapshot(*saved);
  for (const auto& item : model->named_parameters()) {
    EXPECT_TRUE(item.value().equal(want.at(item.key()))) << item.key();
  }
  // One line per q_norm / k_norm tensor of each layer, and one for the config field.
  size_t warnings = 0;
  for (size_t at = log.find("not strict"); at != std::string::npos;
       at = log.find("not strict", at + 1)) {
    ++warnings;
  }
  EXPECT_EQ(warnings, 2u * Tiny().num_hidden_layers() + 1) << log;
  EXPECT_THAT(log, HasSubstr("unexpected tensor 'model.layers.1.self_attn.q_norm.weight'"));
}

TEST(CheckpointStrictTest, OptimizerStateMustBeWhatTheOptimizerKeeps) {
  const std::string dir = FreshTestDir();
  auto model = Build(Tiny(), 1);
  auto adamw = SteppedAdamW(*model);
  Save(dir, *model, adamw.get(), /*full_model=*/true);
  auto other = Build(Tiny(), 2);
  torch::optim::SGD sgd(other->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  const absl::Status status = LoadModelState(dir, *other, &sgd);
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()),
              AllOf(HasSubstr(dir), HasSubstr("momentum_buffer"), HasSubstr("missing")));
}

// Sets an environment variable for the life of a test.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }

 private:
  const char* name_;
};

std::vector<std::string> Entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) {
    names.push_back(entry.path().filename().string());
  }
  return names;
}

TEST(CheckpointFaultTest, InjectedWriteFailureFailsTheSaveAsAFullDiskAndLeavesNoFile) {
  for (const bool full_model : {true, false}) {
    const std::string dir = FreshTestDir();
    auto model = Build(Tiny(), 1);
    auto adamw = SteppedAdamW(*model);
    ScopedEnv fail("CPPTRAIN_TEST_FAIL_WRITE_ON_RANK", "0");
    SingleProcessGroup alone;
    SaveModelStateOptions options;
    options.full_model = full_model;
    const absl::Status saved = SaveModelState(dir, *model, adamw.get(), alone, options);
    EXPECT_EQ(saved.code(), absl::StatusCode::kResourceExhausted) << saved;
    const std::string file = full_model ? "model.safetensors" : "shard-00000-of-00001.safetensors";
    EXPECT_THAT(std::string(saved.message()),
                AllOf(HasSubstr(absl::StrCat(dir, "/", file, "': the disk is full")),
                      HasSubstr("No space left on device")));
    EXPECT_THAT(Entries(dir), ::testing::IsEmpty());  // no data file, temporary or manifest
  }
}

TEST(CheckpointFaultTest, InjectionOnAnotherRankChangesNothing) {
  const std::string dir = FreshTestDir();
  auto model = Build(Tiny(), 1);
  ScopedEnv fail_write("CPPTRAIN_TEST_FAIL_WRITE_ON_RANK", "1");
  ScopedEnv fail_read("CPPTRAIN_TEST_FAIL_READ_ON_RANK", "1");
  Save(dir, *model, nullptr, /*full_model=*/false);
  auto other = Build(Tiny(), 2);
  const absl::Status loaded = LoadModelState(dir, *other, nullptr);
  EXPECT_TRUE(loaded.ok()) << loaded;
  ExpectParameters(*other, Snapshot(*model));
}

// RANK unset is rank 0. Verification reads everything and passes; the load's reads fail.
TEST(CheckpointFaultTest, InjectedReadFailureFailsTheLoadAfterVerification) {
  const std::string dir = FreshTestDir();
  auto model = Build(Tiny(), 1);
  Save(dir, *model, nullptr, /*full_model=*/true);
  ScopedEnv fail("CPPTRAIN_TEST_FAIL_READ_ON_RANK", "0");
  auto other = Build(Tiny(), 2);
  const absl::Status verified = VerifyModelState(dir, *other, nullptr);
  EXPECT_TRUE(verified.ok()) << verified;
  const absl::Status loaded = LoadModelState(dir, *other, nullptr);
  EXPECT_FALSE(loaded.ok());
  EXPECT_THAT(std::string(loaded.message()),
              AllOf(HasSubstr(dir), HasSubstr("cannot read tensor"),
                    HasSubstr("from 'model.safetensors'"), HasSubstr("Input/output error")));
}

}  // namespace
}  // namespace cpptrain
